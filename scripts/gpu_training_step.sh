#!/usr/bin/env bash
# Issue 15's training-step benchmark, one device call each (carry .whl with torchao 0.18 and its needs:
# ../shared/tools/gpu-wheels.sh torchao==0.18.0):
#   scripts/gpu_training_step.sh moe      # MoE expert steps: DeepSeek-V3, Qwen3-235B, GPT-OSS-120B
#   scripts/gpu_training_step.sh dense [preset]   # Linear steps on a dense preset (default llama3-8b; llama3-70b
#                                                 # in a second call: each takes ~5 minutes)
# Results land in $OUT/results.tgz.
source "$(dirname "$0")/gpu_env.sh"
cd benchmarks
if [ "${1:-moe}" = moe ]; then
  timeout 560 python3 training_step.py --suite moe --csv "$WORK/moe.csv" 2>&1 | tee "$WORK/moe.log" | tail -30
else
  timeout 560 python3 training_step.py --suite dense --shapes "${2:-llama3-8b}" --csv "$WORK/dense.csv" 2>&1 \
    | tee "$WORK/dense.log" | tail -40
fi
