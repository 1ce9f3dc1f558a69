#!/usr/bin/env bash
# One device call for the dense GEMMs (issue 6): GPU tests, the per-pass anchors, the tile sweeps,
# and the harness benches next to cuBLAS / torch._scaled_mm. Everything lands in $OUT/results.tgz.
#   usage: scripts/gpu_dense.sh [sweep|bench|all|blockwise]   (blockwise: its tests, sweep and benches only)
source "$(dirname "$0")/gpu_env.sh"
what=${1:-all}

python3 -m pytest -m gpu -q tests/test_gemm.py tests/test_gemm_fp8.py 2>&1 | tail -40 | tee "$WORK/pytest-gpu.log"
if [ "$what" = blockwise ]; then
  python3 benchmarks/dense_passes.py --shapes square --only 8192 --sweep blockwise --repeats 10 \
    --csv "$WORK/sweep-blockwise.csv" 2>&1 | tee "$WORK/sweep-blockwise.log"
  timeout 120 python3 benchmarks/dense_passes.py --shapes square --repeats 10 --csv "$WORK/passes-square.csv" \
    2>&1 | tee "$WORK/passes-square.log"
  timeout 90 python3 -m agent bench --op gemm_fp8 --variant e4m3-blockwise --shapes square --compare-baselines \
    --summary-csv "$WORK/fp8-e4m3-blockwise-square.csv" 2>&1 | tee "$WORK/bench-fp8-blockwise-square.log"
  exit 0
fi
if [ "$what" != bench ]; then
  for kind in bf16 rowwise blockwise; do
    python3 benchmarks/dense_passes.py --shapes square --only 8192 --sweep "$kind" --repeats 10 \
      --csv "$WORK/sweep-$kind.csv" 2>&1 | tee "$WORK/sweep-$kind.log"
  done
fi
if [ "$what" != sweep ]; then
  for preset in square llama3; do
    timeout 150 python3 benchmarks/dense_passes.py --shapes "$preset" --repeats 10 --csv "$WORK/passes-$preset.csv" \
      2>&1 | tee "$WORK/passes-$preset.log"
  done
  timeout 200 python3 -m agent bench --op gemm --shapes llama3 --compare-baselines \
    --summary-csv "$WORK/gemm-llama3.csv" 2>&1 | tee "$WORK/bench-gemm-llama3.log"
  timeout 150 python3 -m agent bench --op gemm_fp8 --variant e4m3-rowwise --shapes llama3-70b --compare-baselines \
    --summary-csv "$WORK/fp8-e4m3-rowwise-llama3-70b.csv" 2>&1 | tee "$WORK/bench-fp8-rowwise.log"
  timeout 60 python3 -m agent bench --op gemm_fp8 --variant e4m3-blockwise --shapes square --compare-baselines \
    --summary-csv "$WORK/fp8-e4m3-blockwise-square.csv" 2>&1 | tee "$WORK/bench-fp8-blockwise-square.log"
fi
