#!/usr/bin/env bash
# The per-pass and MoE-op benchmarks again under the harness's training-loop timing (each call the larger of
# its GPU time and its host time; 7fd03fa), one device call of about 6 minutes: issue 15's FP8 passes on the
# DeepSeek-V3 headline shapes (rowwise and blockwise, 9 rounds in shuffled order) and issue 17's router,
# permute and unpermute next to torch and a copy (CUDA events, then CUDA-graph replays). Logs and CSVs land in
# $OUT/results.tgz.
#   run(command="bash scripts/gpu_loop_reads.sh", carry=[".whl"], kind="nvidia-h100-x1", timeout_s=600)
source "$(dirname "$0")/gpu_env.sh"
install_wheels

step passes 300 python3 benchmarks/grouped_passes.py --shapes headline --only deepseek-v3 --rounds 9 \
  --csv "$WORK/passes.csv"
step moe-ops 120 python3 benchmarks/moe_ops.py --csv "$WORK/moe_ops.csv"
step moe-ops-graph 100 python3 benchmarks/moe_ops.py --mode cuda-graph --csv "$WORK/moe_ops_graph.csv"
