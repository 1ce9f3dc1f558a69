#!/usr/bin/env bash
# Where the fused attention backward's time goes (one device call, about 5 minutes): benchmarks/attention_bwd_probe.py
# (d256 and d128 at 16k tokens as 2 x 8k ... 16 x 1k, causal and not, with its dQ reductions left out, with
# every step on one q block, and the causal L2 budgets, next to SDPA cuDNN), then Nsight Compute on each 8k
# call's kernels (ours, the diagnostic builds', cuDNN's): speed of light, memory tables, warp states, launch.
# Logs, the ncu details and raw CSVs land in $OUT/results.tgz. Clocks are left alone (--clock-control none).
#   run(command="bash scripts/gpu_attention_bwd_probe.sh", carry=[".whl"], kind="nvidia-h100-x1", timeout_s=600)
source "$(dirname "$0")/gpu_env.sh"
install_wheels

step probe 300 python3 benchmarks/attention_bwd_probe.py --rounds 9
step ncu 240 ncu --clock-control none --profile-from-start off --nvtx --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy \
  -o "$WORK/bwd" -f python3 benchmarks/attention_bwd_probe.py --ncu
ncu --import "$WORK/bwd.ncu-rep" --csv --page details > "$WORK/bwd_details.csv"
ncu --import "$WORK/bwd.ncu-rep" --csv --page raw > "$WORK/bwd_raw.csv"
rm -f "$WORK/bwd.ncu-rep"
