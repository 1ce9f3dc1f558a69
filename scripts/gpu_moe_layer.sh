#!/usr/bin/env bash
# Issue 17, one device call (the steps' limits add up to 490 s; not yet run on a GPU): the GPU tests of the
# router (DeepSeek-V3 at 4096 and 32k tokens against float64, CUDA-graph replay) and of MoEMLP (a whole
# training step under CUDA-graph replay equals eager, bf16 and FP8); the router against torch
# (benchmarks/moe_ops.py --ops router, CUDA events and graph replay: >= 5x wanted forward + backward); the
# layer against a torch layer of torch._grouped_mm calls (benchmarks/moe_layer.py: >= 1.25x on DeepSeek-V3
# and Qwen3-235B, >= 2x on SonicMoE, FP8 >= 1.3x our bf16); the harness bench (every check, GB/s, the torch
# baselines) of moe_router on DeepSeek-V3, moe_permute on Qwen3-30B-A3B and moe_mlp (the experts, TFLOPS)
# on DeepSeek-V3's 32 local experts at 4096 tokens. Each step has its own time limit and a failing step
# does not stop the next. Logs and CSVs land in $OUT/results.tgz; each step's tail is printed. The tests
# and the harness need pydantic and gitpython, which the device image lacks: carry .whl (README's wheels):
#   run(command="bash scripts/gpu_moe_layer.sh", carry=[".whl"], timeout_s=540)
source "$(dirname "$0")/gpu_env.sh"
install_wheels

harness_bench() {  # harness_bench OP SECONDS SHAPES: our kernel and its torch baseline, one CSV each
  step "harness-$1" "$2" python3 -m harness bench --op "$1" --shapes "$3" --compare-baselines \
    --summary-csv "$WORK/$1-$3.csv"
}

# Worst case 120 + 2 * 40 + 110 + 3 * 60 = 490 s; the steps usually end well before their limits.
step gpu-tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_moe_router.py tests/test_moe_mlp.py
step bench-router 40 python3 benchmarks/moe_ops.py --ops router --csv "$WORK/moe_router.csv"
step bench-router-graph 40 python3 benchmarks/moe_ops.py --ops router --mode cuda-graph \
  --csv "$WORK/moe_router_graph.csv"
step bench-layer 110 python3 benchmarks/moe_layer.py --csv "$WORK/moe_layer.csv"
harness_bench moe_router 60 deepseek-v3
harness_bench moe_permute 60 qwen3-30b
harness_bench moe_mlp 60 deepseek-v3
