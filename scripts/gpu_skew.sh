#!/usr/bin/env bash
# One device call: grouped GPU tests, then the headline preset in FP8 (rowwise and blockwise) next to
# torch, and the per-pass timings; packed into $OUT/results.tgz.
source "$(dirname "$0")/gpu_env.sh"
python3 -m pytest -q -m gpu tests 2>&1 | tail -3 | tee "$WORK/pytest-gpu.log"
python3 -m pytest -q tests/test_grouped_gemm.py tests/test_fp8_quant.py 2>&1 | tail -3 | tee -a "$WORK/pytest-gpu.log"
for v in e4m3-rowwise e4m3-blockwise; do
  python3 -m agent bench --op grouped_gemm_fp8 --shapes headline --variant $v --compare-baselines --repeats 20 \
    --warmup 5 --summary-csv "$WORK/headline-$v.csv" > "$WORK/bench-$v.log" 2>&1
  grep -E "geomean|PASS," "$WORK/bench-$v.log"
done
python3 benchmarks/grouped_passes.py --shapes headline --repeats 20 --csv "$WORK/passes.csv" > "$WORK/passes.log" 2>&1
tail -6 "$WORK/passes.log"
