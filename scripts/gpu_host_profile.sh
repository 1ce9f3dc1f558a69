#!/usr/bin/env bash
# Where our launches' host time goes (one device call, about 2 minutes): scripts/host_time.py with a cProfile of
# ours' calls (us per call) on the FP8 GEMM (rowwise, llama3-8b's 4096-token O projection: host-bound), the bf16
# GEMM on the same shape and the attention d128 acceptance shapes. Logs land in $OUT/results.tgz.
#   run(command="bash scripts/gpu_host_profile.sh", carry=[".whl"], kind="nvidia-h100-x1", timeout_s=600)
source "$(dirname "$0")/gpu_env.sh"
install_wheels

cat > "$WORK/acceptance.yaml" <<'SHAPES'
- {label: headline/d128, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 128, Dv: 128}
SHAPES
step host-gemm-fp8 150 python3 scripts/host_time.py --op gemm_fp8 --shapes llama3-8b --only o/t4096 --repeats 50 \
  --profile 45
step host-gemm 150 python3 scripts/host_time.py --op gemm --shapes llama3-8b --only o/t4096 --repeats 50 --profile 30
step host-attention 200 python3 scripts/host_time.py --op attention --shapes "$WORK/acceptance.yaml" --profile 30
