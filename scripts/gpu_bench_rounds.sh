#!/usr/bin/env bash
# The harness bench (ours and the baselines in interleaved rounds of shuffled order, each call timed as a training
# loop pays it: the larger of its GPU and host times) in one device call of about 7 minutes: the timing and bench
# tests on the GPU, then the attention acceptance shapes (d128, 2 x 8k, causal and not) next to SDPA cuDNN and FA2
# three times in three processes, the attention headline preset and the llama3-8b GEMMs next to torch.matmul,
# and scripts/host_time.py (host time, GPU time alone and the harness's timing) on the acceptance shapes and the
# 4096-token O projection of the bf16 and FP8 GEMMs. Logs and CSVs land in $OUT/results.tgz.
#   run(command="bash scripts/gpu_bench_rounds.sh", carry=[".whl"], kind="nvidia-h100-x1", timeout_s=600)
source "$(dirname "$0")/gpu_env.sh"
install_wheels

step pytest-gpu 120 python3 -m pytest -m "gpu or not gpu" -q -p no:cacheprovider tests/test_timing.py \
  tests/test_bench.py
cat > "$WORK/acceptance.yaml" <<'SHAPES'
- {label: headline/d128, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 128, Dv: 128}
- {label: headline/d128/causal, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 128, Dv: 128, causal: 1}
SHAPES
for call in 1 2 3; do
  step "bench-acceptance-$call" 70 python3 -m harness bench --op attention --shapes "$WORK/acceptance.yaml" \
    --compare-baselines --summary-csv "$WORK/attention-acceptance-$call.csv"
done
step bench-headline 100 python3 -m harness bench --op attention --shapes headline --compare-baselines \
  --summary-csv "$WORK/attention-headline.csv"
step bench-gemm 100 python3 -m harness bench --op gemm --shapes llama3-8b --compare-baselines \
  --summary-csv "$WORK/gemm-llama3-8b.csv"
step host-attention 120 python3 scripts/host_time.py --op attention --shapes "$WORK/acceptance.yaml"
step host-gemm 60 python3 scripts/host_time.py --op gemm --shapes llama3-8b --only o/t4096
step host-gemm-fp8 60 python3 scripts/host_time.py --op gemm_fp8 --shapes llama3-8b --only o/t4096
