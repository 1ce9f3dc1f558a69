#!/usr/bin/env bash
# Acceptance run for the grouped GEMMs on the full DeepSeek-V3 preset, then the headline preset:
# bf16 and FP8 (rowwise, blockwise) next to torch's grouped GEMMs; packed into $OUT/results.tgz.
source "$(dirname "$0")/gpu_env.sh"
bench() {  # name, preset, then turbo-opt bench arguments
  local name=$1 shapes=$2; shift 2
  python3 -m agent bench --shapes "$shapes" --repeats 20 --warmup 5 --summary-csv "$WORK/$name.csv" "$@" \
    2>&1 | tee "$WORK/bench-$name.log"
}
bench dsv3-bf16 deepseek-v3 --op grouped_gemm --compare-baselines
bench dsv3-fp8-rowwise deepseek-v3 --op grouped_gemm_fp8 --compare-baselines
bench headline-bf16 headline --op grouped_gemm --compare-baselines
bench headline-fp8-rowwise headline --op grouped_gemm_fp8 --compare-baselines
bench headline-fp8-blockwise headline --op grouped_gemm_fp8 --variant e4m3-blockwise --compare-baselines
python3 benchmarks/grouped_passes.py --shapes headline --repeats 20 --csv "$WORK/passes.csv" 2>&1 | tail -8 | tee "$WORK/passes.log"
