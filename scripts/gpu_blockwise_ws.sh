#!/usr/bin/env bash
# Blockwise FP8 on the warp-specialized kernel, one device call per mode (each under 10 minutes):
#   scripts/gpu_blockwise_ws.sh check   # pytest -m gpu (kernel, gemm_fp8, grouped), the interleaved A/B
#   scripts/gpu_blockwise_ws.sh bench   # per-pass anchors and the turbo-opt benches, dense and grouped
#   scripts/gpu_blockwise_ws.sh wgrad   # GPU tests, the forward's and the wgrad's interleaved A/B, and
#                                       # the blockwise MoE training loop (8 microbatches), rowwise beside it
#   scripts/gpu_blockwise_ws.sh steps   # DeepSeek-V3's grouped passes, each with its quantization, and the
#                                       # dense training loops, llama3-70b / 8b (8 microbatches)
#   scripts/gpu_blockwise_ws.sh wide    # GPU tests, the forward's A/B on 128x128 and 128x256 tiles, and the
#                                       # MoE loop (8 microbatches), blockwise and rowwise
# Results land in $OUT/results.tgz.
source "$(dirname "$0")/gpu_env.sh"
moe_loop() {  # moe_loop LIMIT: the MoE training loop (8 microbatches), rowwise and blockwise
  step moe-acc8 "$1" python3 benchmarks/training_step.py --suite moe --accumulate 8 --steps 4 --no-torchao \
    --variants e4m3-rowwise e4m3-blockwise --csv "$WORK/moe_acc8.csv"
}
if [ "${1:-check}" = wide ]; then
  install_wheels
  step gpu-tests 200 python3 -m pytest -m gpu -q tests/test_blockwise_ws.py tests/test_gemm_fp8.py \
    tests/test_grouped_gemm.py -k "blockwise or ws or token or compiles or matches or zero"
  step fwd-ab 150 python3 benchmarks/blockwise_ab.py --rounds 3 --stages 3 4 --group-m 8 --block-n 128 256 \
    --csv "$WORK/fwd-ab.csv"
  moe_loop 150
  exit 0
fi
if [ "${1:-check}" = wgrad ]; then
  install_wheels
  step gpu-tests 220 python3 -m pytest -m gpu -q tests/test_blockwise_ws.py tests/test_gemm_fp8.py \
    tests/test_grouped_gemm.py
  step fwd-ab 150 python3 benchmarks/blockwise_ab.py --rounds 3 --stages 3 4 5 --group-m 8 --csv "$WORK/fwd-ab.csv"
  step wgrad-ab 150 python3 benchmarks/blockwise_ab.py --pass wgrad --rounds 3 --stages 3 4 5 --group-m 8 \
    --csv "$WORK/wgrad-ab.csv"
  moe_loop 200
  exit 0
fi
if [ "${1:-check}" = steps ]; then
  install_wheels
  step passes 120 python3 benchmarks/grouped_passes.py --shapes headline --only deepseek-v3 --csv "$WORK/passes.csv"
  for preset in llama3-70b llama3-8b; do
    step "dense-acc8-$preset" 140 python3 benchmarks/training_step.py --suite dense --shapes $preset --accumulate 8 \
      --steps 2 --no-torchao --variants e4m3-rowwise e4m3-blockwise --csv "$WORK/dense_acc8_$preset.csv"
  done
  exit 0
fi
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
