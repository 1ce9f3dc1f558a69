#!/usr/bin/env bash
# Issue 15, one device call (~5 minutes): the training steps with each layer captured in CUDA graphs
# (benchmarks/training_step.py --graph: forward and backward one replay each, no per-kernel host work),
# dense llama3-8b (the host-bound preset) and MoE; then the grouped FP8 op's main_grad tests on the GPU
# (bf16). Carry .whl (torchao 0.18 and its needs). Results land in $OUT/results.tgz.
source "$(dirname "$0")/gpu_env.sh"
install_wheels
cd benchmarks
timeout 150 python3 training_step.py --suite dense --shapes llama3-8b --graph --variants e4m3-rowwise e4m3-blockwise \
  --csv "$WORK/dense8b_graph.csv" > "$WORK/dense8b_graph.log" 2>&1; tail -40 "$WORK/dense8b_graph.log"
timeout 150 python3 training_step.py --suite moe --graph --csv "$WORK/moe_graph.csv" > "$WORK/moe_graph.log" 2>&1
tail -22 "$WORK/moe_graph.log"
cd ..
timeout 150 python3 -m pytest -q tests/test_grouped_gemm.py -k "main_grad" > "$WORK/gpu_tests.txt" 2>&1
grep -E "passed|failed|error" "$WORK/gpu_tests.txt"
