#!/usr/bin/env bash
# Issue 17, one device call (its limits add up to 320 s): the GPU tests of the MoE permute / unpermute
# (bf16 at DeepSeek-V3's hidden size, CUDA-graph replay of permute -> grouped_gemm_fp8 -> unpermute
# equal to eager) and of the router (DeepSeek-V3 at 4096 and 32k tokens against float64, CUDA-graph
# replay), then benchmarks/moe_ops.py: GB/s of each pass next to torch and to a copy measured in the
# same run (the router: forward + backward against torch, >= 5x wanted), timed with CUDA events (host
# time in) and replayed from CUDA graphs (GPU time alone).
# Each step has its own time limit; a failing step does not stop the next. Logs and the
# CSV land in $OUT/results.tgz; each step's tail is printed. The tests need pydantic (harness.snr reads
# rules/), which the device image lacks: carry .whl (README's wheels):
#   run(command="bash scripts/gpu_moe_ops.sh", carry=[".whl"], timeout_s=300)
source "$(dirname "$0")/gpu_env.sh"
install_wheels

step gpu-tests 120 python3 -m pytest -q -m gpu tests/test_moe_permute.py tests/test_moe_router.py
step bench 100 python3 benchmarks/moe_ops.py --csv "$WORK/moe_ops.csv"
step bench-graph 100 python3 benchmarks/moe_ops.py --mode cuda-graph --csv "$WORK/moe_ops_graph.csv"
