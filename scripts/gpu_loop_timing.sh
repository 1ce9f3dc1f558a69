#!/usr/bin/env bash
# The training-loop timing and what it marks (one device call, about 6 minutes): the timing, bench and MoE
# permute GPU tests; the MoE permute, unpermute and router next to torch and a copy (CUDA-graph replays, then
# the harness's timing: a host-bound pass shows its host time); the attention d128 acceptance shapes next to
# SDPA; the FP8 GEMM on llama3-8b (its 4096-token shapes host-bound: marked in the table and the sidecar).
# Logs and CSVs land in $OUT/results.tgz.
#   run(command="bash scripts/gpu_loop_timing.sh", carry=[".whl"], kind="nvidia-h100-x1", timeout_s=600)
source "$(dirname "$0")/gpu_env.sh"
install_wheels

step pytest-gpu 200 python3 -m pytest -m "gpu or not gpu" -q -p no:cacheprovider tests/test_timing.py \
  tests/test_bench.py tests/test_moe_permute.py
step moe-ops-graph 100 python3 benchmarks/moe_ops.py --mode cuda-graph --csv "$WORK/moe_ops_graph.csv"
step moe-ops 120 python3 benchmarks/moe_ops.py --csv "$WORK/moe_ops.csv"
cat > "$WORK/acceptance.yaml" <<'SHAPES'
- {label: headline/d128, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 128, Dv: 128}
- {label: headline/d128/causal, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 128, Dv: 128, causal: 1}
SHAPES
for call in 1 2; do
  step "bench-acceptance-$call" 70 python3 -m harness bench --op attention --shapes "$WORK/acceptance.yaml" \
    --compare-baselines --summary-csv "$WORK/attention-acceptance-$call.csv"
done
step bench-gemm-fp8 100 python3 -m harness bench --op gemm_fp8 --variant e4m3-rowwise --shapes llama3-8b \
  --compare-baselines --summary-csv "$WORK/gemm_fp8-llama3-8b.csv"
