#!/usr/bin/env bash
# Issue 15, one device call: the GPU tests of the FP8 ops (bf16 SNR gates, CUDA-graph replay, timing),
# where a step's time goes (scripts/host_profile.py: host cost per op, a cProfile of a host-bound step,
# the quantization bandwidth, the DeepSeek-V3 MoE step's kernels), and each grouped pass with its
# quantization on the DeepSeek-V3 headline shapes (benchmarks/grouped_passes.py). Logs land in $OUT.
# The training steps themselves: scripts/gpu_training_step.sh.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export PYTHONUNBUFFERED=1
timeout 300 python3 -m pytest -q -m gpu tests/test_timing.py tests/test_gemm_fp8.py tests/test_grouped_gemm.py \
  tests/test_tma_context.py tests/test_blockwise_ws.py tests/test_gemm.py > "$OUT/gpu_tests.txt" 2>&1
tail -3 "$OUT/gpu_tests.txt"
timeout 150 python3 scripts/host_profile.py > "$OUT/profile.txt" 2>&1
grep -E "^  |===" "$OUT/profile.txt" | head -40
cd benchmarks
timeout 150 python3 grouped_passes.py --shapes headline --only deepseek-v3 --csv "$OUT/grouped_passes.csv" \
  > "$OUT/grouped_passes.log" 2>&1
grep -v "^{" "$OUT/grouped_passes.log" | tail -40
