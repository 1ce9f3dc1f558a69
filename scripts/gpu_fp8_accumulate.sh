#!/usr/bin/env bash
# Issue 15, one device call: the FP8 training step in a gradient-accumulation loop (`--accumulate 8`:
# our ops quantize the weights once per optimizer step and their wgrads add into main_grad), next to
# the same loop without accumulation. Parts, any of them (default: moe passes tests):
#   moe     MoE microbatches, 8 per optimizer step (torchao too), and the plain step       ~3 min
#   dense   Linear microbatches, 8 per optimizer step, llama3-8b and llama3-70b            ~4 min
#           (DENSE_VARIANTS="e4m3-rowwise" to run fewer variants)
#   passes  each DeepSeek-V3 grouped pass with its quantization (forward also prequantized) ~1.5 min
#   tests   the FP8 ops' tests on the GPU (bf16), main_grad included                        ~2 min
# Carry .whl (torchao 0.18 and its needs: ../shared/tools/gpu-wheels.sh torchao==0.18.0). Results
# land in $OUT/results.tgz.   scripts/gpu_fp8_accumulate.sh [moe] [dense] [passes] [tests]
source "$(dirname "$0")/gpu_env.sh"
install_wheels
parts=" ${*:-moe passes tests} "
cd benchmarks
if [[ $parts == *" moe "* ]]; then
  timeout 170 python3 training_step.py --suite moe --accumulate 8 --steps 4 --csv "$WORK/moe_acc8.csv" \
    > "$WORK/moe_acc8.log" 2>&1; tail -22 "$WORK/moe_acc8.log"
  timeout 120 python3 training_step.py --suite moe --no-torchao --csv "$WORK/moe_acc1.csv" \
    > "$WORK/moe_acc1.log" 2>&1; tail -16 "$WORK/moe_acc1.log"
fi
if [[ $parts == *" dense "* ]]; then
  for preset in llama3-8b llama3-70b; do
    timeout 130 python3 training_step.py --suite dense --shapes $preset --accumulate 8 --steps 2 --no-torchao \
      --variants ${DENSE_VARIANTS:-e4m3-rowwise e4m3-blockwise} --csv "$WORK/dense_acc8_$preset.csv" \
      > "$WORK/dense_acc8_$preset.log" 2>&1
    tail -8 "$WORK/dense_acc8_$preset.log"
  done
fi
if [[ $parts == *" passes "* ]]; then
  timeout 90 python3 grouped_passes.py --shapes headline --only deepseek-v3 --csv "$WORK/grouped_passes.csv" \
    > "$WORK/grouped_passes.log" 2>&1; grep -v "^{" "$WORK/grouped_passes.log" | tail -45
fi
cd ..
if [[ $parts == *" tests "* ]]; then
  timeout 150 python3 -m pytest -q tests/test_grouped_gemm.py tests/test_gemm_fp8.py -k "main_grad" \
    > "$WORK/gpu_tests.txt" 2>&1
  timeout 150 python3 -m pytest -q -m gpu tests/test_gemm_fp8.py tests/test_grouped_gemm.py >> "$WORK/gpu_tests.txt" 2>&1
  grep -E "passed|failed|error" "$WORK/gpu_tests.txt"
fi
