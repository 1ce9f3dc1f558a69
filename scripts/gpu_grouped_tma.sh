#!/usr/bin/env bash
# One device call for the grouped GEMMs on the TMA kernel: GPU tests, the blockwise tile sweep at
# DeepSeek-V3 GateUP, the per-pass anchors, and the headline benches next to torch. Results land in
# $OUT/results.tgz.
source "$(dirname "$0")/gpu_env.sh"
timeout 240 python3 -m pytest -m gpu -q tests/test_grouped_gemm.py tests/test_gemm_fp8.py tests/test_gemm.py 2>&1 \
  | tail -15 | tee "$WORK/pytest-gpu.log"
timeout 90 python3 benchmarks/grouped_passes.py --shapes headline --only deepseek-v3/gateup/ep32/m4096/uniform \
  --sweep blockwise --repeats 10 --csv "$WORK/sweep-blockwise.csv" 2>&1 | tail -25 | tee "$WORK/sweep-blockwise.log"
timeout 150 python3 benchmarks/grouped_passes.py --shapes headline --repeats 10 --csv "$WORK/passes.csv" 2>&1 \
  | tail -12 | tee "$WORK/passes.log"
for variant in bf16 e4m3-rowwise e4m3-blockwise; do
  op=grouped_gemm_fp8; args=(--variant "$variant")
  [ "$variant" = bf16 ] && op=grouped_gemm && args=()
  timeout 120 python3 -m agent bench --op "$op" "${args[@]}" --shapes headline --repeats 20 --warmup 5 \
    --compare-baselines --summary-csv "$WORK/headline-$variant.csv" 2>&1 | tail -22 | tee "$WORK/bench-$variant.log"
done
