#!/usr/bin/env bash
# Issue 15, one device call (~6 minutes; `moe`: ~3): the FP8 training step in a gradient-accumulation
# loop (`--accumulate 8`: our ops quantize the weights once per optimizer step, and the grouped op's
# wgrad adds into main_grad), next to the same loop without accumulation; with `all`, also each
# DeepSeek-V3 grouped pass with its quantization (the forward also with a prequantized weight) and
# the llama3-8b Linear steps. Then the FP8 ops' tests on the GPU (bf16). Carry .whl (torchao 0.18 and
# its needs: ../shared/tools/gpu-wheels.sh torchao==0.18.0). Results land in $OUT/results.tgz.
#   scripts/gpu_fp8_accumulate.sh [moe|all]
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit
source "$(dirname "$0")/gpu_env.sh"
cd benchmarks
timeout 170 python3 training_step.py --suite moe --accumulate 8 --steps 4 --csv "$WORK/moe_acc8.csv" \
  > "$WORK/moe_acc8.log" 2>&1; tail -22 "$WORK/moe_acc8.log"
timeout 120 python3 training_step.py --suite moe --no-torchao --csv "$WORK/moe_acc1.csv" \
  > "$WORK/moe_acc1.log" 2>&1; tail -16 "$WORK/moe_acc1.log"
if [ "${1:-all}" = all ]; then
  timeout 90 python3 grouped_passes.py --shapes headline --only deepseek-v3 --csv "$WORK/grouped_passes.csv" \
    > "$WORK/grouped_passes.log" 2>&1; grep -v "^{" "$WORK/grouped_passes.log" | tail -45
  timeout 120 python3 training_step.py --suite dense --shapes llama3-8b --accumulate 8 --steps 3 --no-torchao \
    --variants e4m3-rowwise e4m3-blockwise --csv "$WORK/dense8b_acc8.csv" > "$WORK/dense8b_acc8.log" 2>&1
  tail -26 "$WORK/dense8b_acc8.log"
fi
cd ..
timeout 100 python3 -m pytest -q tests/test_grouped_gemm.py -k "main_grad or quantized_once or fp8" \
  > "$WORK/gpu_tests.txt" 2>&1
timeout 80 python3 -m pytest -q -m gpu tests/test_gemm_fp8.py tests/test_grouped_gemm.py >> "$WORK/gpu_tests.txt" 2>&1
grep -E "passed|failed|error" "$WORK/gpu_tests.txt"
