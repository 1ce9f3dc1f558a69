#!/usr/bin/env bash
# Issue 15's training-step benchmark (benchmarks/training_step.py), one device call each (carry .whl with
# pydantic and torchao 0.18: ../shared/tools/gpu-wheels.sh torchao==0.18.0):
#   scripts/gpu_training_step.sh loop eager   # gradient accumulation, 8 microbatches per optimizer step:
#   scripts/gpu_training_step.sh loop graph   # llama3-8b and llama3-70b Linear microbatches, then the MoE
#                                             # expert microbatches, E4M3 rowwise and blockwise beside bf16
#                                             # torch; `graph`: each microbatch captured whole in CUDA graphs
#                                             # (~7 minutes)
#   scripts/gpu_training_step.sh moe         # MoE expert steps, one microbatch a step, torchao beside ours
#   scripts/gpu_training_step.sh dense [preset]   # Linear steps on a dense preset (default llama3-8b; llama3-70b
#                                                 # in a second call: each takes ~5 minutes)
# Results land in $OUT/results.tgz.
source "$(dirname "$0")/gpu_env.sh"
install_wheels
cd benchmarks
if [ "${1:-moe}" = loop ]; then
  mode=${2:-eager}
  graph=""
  [ "$mode" = graph ] && graph="--graph"
  for preset in llama3-8b llama3-70b; do
    step "dense-$mode-$preset" 150 python3 training_step.py --suite dense --shapes $preset --accumulate 8 --steps 2 \
      --no-torchao --variants e4m3-rowwise e4m3-blockwise $graph --csv "$WORK/dense_${mode}_$preset.csv"
  done
  step "moe-$mode" 170 python3 training_step.py --suite moe --accumulate 8 --steps 4 --no-torchao \
    --variants e4m3-rowwise e4m3-blockwise $graph --csv "$WORK/moe_$mode.csv"
elif [ "${1:-moe}" = moe ]; then
  timeout 560 python3 training_step.py --suite moe --csv "$WORK/moe.csv" 2>&1 | tee "$WORK/moe.log" | tail -30
else
  timeout 560 python3 training_step.py --suite dense --shapes "${2:-llama3-8b}" --csv "$WORK/dense.csv" 2>&1 \
    | tee "$WORK/dense.log" | tail -40
fi
