#!/usr/bin/env bash
# The harness bench with ours and the baselines timed in interleaved rounds of shuffled order (one device call,
# about 6 minutes): the timing and bench tests on the GPU, then the attention acceptance shapes (d128, 2 x 8k,
# causal and not) next to SDPA cuDNN and FA2 three times in three processes (timed one runner after the other,
# the same bench read 0.936-1.003x cuDNN at d128 across calls CL-CM), the attention headline preset and the
# llama3-8b GEMMs next to torch.matmul. Logs and CSVs land in $OUT/results.tgz.
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
