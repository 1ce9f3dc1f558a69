#!/usr/bin/env bash
# Issue 15, host time: Triton launches through kernels/common/launch.py (cached per specialization)
# against Triton's own `kernel[grid]` path (TURBO_OPT_TRITON_LAUNCH=triton), in one device call.
# Parts, any of them (default: tests host):
#   tests   every GPU test of the kernels (all launches now take the cached path)          ~5 min
#   host    host us per op and per Linear step, both launch paths interleaved in one process
#           (scripts/host_profile.py --parts launch)                                         ~0.5 min
#   anatomy the host us of each piece of one cached launch (binder, key, descriptors, Triton's launcher)
#           and a cProfile of host-bound Linear steps (scripts/host_trace.py)                ~1.5 min
#   dense   Linear training steps, eager, llama3-8b and llama3-70b                           ~4 min
#   moe     MoE microbatches of 8 per optimizer step (benchmarks/training_step.py)          ~1 min
#   ab      E4M3 rowwise steps under both launch paths, one process each: llama3-8b Linear
#           steps and MoE microbatches of 8                                                   ~3 min
# Carry .whl (pydantic, torchao: ../shared/tools/gpu-wheels.sh torchao==0.18.0). Results land in
# $OUT/results.tgz.   scripts/gpu_launch.sh [tests] [host] [anatomy] [dense] [moe] [ab]
source "$(dirname "$0")/gpu_env.sh"
install_wheels
parts=" ${*:-tests host} "
tests="tests/test_launch.py"
if [[ $parts == *" tests "* ]]; then
  tests="tests/test_launch.py tests/test_gemm_fp8.py tests/test_grouped_gemm.py \
    tests/test_gemm.py tests/test_tma_context.py tests/test_blockwise_ws.py tests/test_moe_mlp.py \
    tests/test_moe_permute.py tests/test_moe_router.py tests/test_attention.py tests/test_timing.py"
fi
step gpu_tests 330 python3 -m pytest -q -m gpu $tests   # tests/test_launch.py at least: every part launches
if [[ $parts == *" host "* ]]; then
  step host_launch 100 python3 scripts/host_profile.py --parts launch
fi
if [[ $parts == *" anatomy "* ]]; then
  step anatomy 100 python3 scripts/host_profile.py --parts anatomy
  step host_trace 150 python3 scripts/host_trace.py
fi
cd benchmarks
if [[ $parts == *" dense "* ]]; then
  for preset in llama3-8b llama3-70b; do
    step "dense_$preset" 130 python3 training_step.py --suite dense --shapes $preset --no-torchao \
      --variants e4m3-rowwise e4m3-blockwise --csv "$WORK/dense_$preset.csv"
  done
fi
if [[ $parts == *" moe "* ]]; then
  step moe_acc8 170 python3 training_step.py --suite moe --accumulate 8 --steps 4 --no-torchao \
    --csv "$WORK/moe_acc8.csv"
fi
if [[ $parts == *" ab "* ]]; then
  for path in direct triton; do
    TURBO_OPT_TRITON_LAUNCH=$path step "ab_dense_$path" 80 python3 training_step.py --suite dense --shapes llama3-8b \
      --no-torchao --variants e4m3-rowwise --csv "$WORK/ab_dense_$path.csv"
    TURBO_OPT_TRITON_LAUNCH=$path step "ab_moe_$path" 80 python3 training_step.py --suite moe --accumulate 8 \
      --steps 4 --no-torchao --variants e4m3-rowwise --csv "$WORK/ab_moe_$path.csv"
  done
fi
