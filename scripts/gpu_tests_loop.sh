#!/usr/bin/env bash
# The timing, bench, permute and attention tests on the GPU, the CPU tests of those files included (they run in
# bf16 there), one device call of about 4 minutes. Logs land in $OUT/results.tgz.
#   run(command="bash scripts/gpu_tests_loop.sh", carry=[".whl"], kind="nvidia-h100-x1", timeout_s=600)
source "$(dirname "$0")/gpu_env.sh"
install_wheels

step pytest-gpu 420 python3 -m pytest -m "gpu or not gpu" -q -p no:cacheprovider tests/test_timing.py \
  tests/test_bench.py tests/test_moe_permute.py tests/test_next_direction.py
step pytest-gpu-attention 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_attention.py
