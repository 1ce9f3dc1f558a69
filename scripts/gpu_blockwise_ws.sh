#!/usr/bin/env bash
# Blockwise FP8 on the warp-specialized kernel, in two device calls (each under 10 minutes):
#   scripts/gpu_blockwise_ws.sh check   # pytest -m gpu (kernel, gemm_fp8, grouped), the interleaved A/B
#   scripts/gpu_blockwise_ws.sh bench   # per-pass anchors and the turbo-opt benches, dense and grouped
# Results land in $OUT/results.tgz.
source "$(dirname "$0")/gpu_env.sh"
if [ "${1:-check}" = check ]; then
  timeout 300 python3 -m pytest -m gpu -q tests/test_blockwise_ws.py tests/test_gemm_fp8.py tests/test_grouped_gemm.py \
    2>&1 | tail -15 | tee "$WORK/pytest-gpu.log"
  timeout 200 python3 benchmarks/blockwise_ab.py --rounds 5 --csv "$WORK/blockwise-ab.csv" 2>&1 \
    | tee "$WORK/blockwise-ab.log"
  exit 0
fi
timeout 120 python3 benchmarks/dense_passes.py --shapes square --repeats 10 --csv "$WORK/passes-square.csv" 2>&1 \
  | tail -20 | tee "$WORK/passes-square.log"
timeout 150 python3 benchmarks/grouped_passes.py --shapes headline --repeats 10 --csv "$WORK/passes-grouped.csv" \
  2>&1 | tail -12 | tee "$WORK/passes-grouped.log"
timeout 90 python3 -m agent bench --op gemm_fp8 --variant e4m3-blockwise --shapes square --compare-baselines \
  --summary-csv "$WORK/fp8-e4m3-blockwise-square.csv" 2>&1 | tail -12 | tee "$WORK/bench-dense.log"
timeout 150 python3 -m agent bench --op grouped_gemm_fp8 --variant e4m3-blockwise --shapes headline --repeats 20 \
  --warmup 5 --compare-baselines --summary-csv "$WORK/headline-e4m3-blockwise.csv" 2>&1 | tail -22 \
  | tee "$WORK/bench-grouped.log"
