#!/usr/bin/env bash
# Issues 12 and 13 on the GPU, two device calls (each under 10 minutes); carry .whl (pydantic, gitpython):
#   scripts/gpu_agent_referee.sh campaign   # a `command` campaign whose scripted agent makes a kernel code change
#                                           # and two cheats (scripts/agent_rounds.py); the change restores the
#                                           # forward's TMA dispatch, so the forward is the metric
#   scripts/gpu_agent_referee.sh probes     # the TMA launchers on a thread with no CUDA context, and every other
#                                           # op's bench with the full checks and probes (no false alarms on bf16)
#   scripts/gpu_agent_referee.sh overhead   # what the new checks cost a round: its two benches, --checks full
#                                           # vs basic, twice
# Results land in $OUT/results.tgz.
source "$(dirname "$0")/gpu_env.sh"
git_snapshot
cat > "$WORK/llama3-8b-core.yaml" <<'SHAPES'
- {label: llama3-8b/qkv/t4096, M: 4096, N: 6144, K: 4096}
- {label: llama3-8b/o/t4096, M: 4096, N: 4096, K: 4096}
- {label: llama3-8b/gate_up/t8192, M: 8192, N: 28672, K: 4096}
- {label: llama3-8b/down/t8192, M: 8192, N: 4096, K: 14336}
SHAPES
bench() {  # op variant shapes name [more options]: the bench as a campaign's VALIDATE runs it
  local op=$1 variant=$2 shapes=$3 name=$4 started status; shift 4
  started=$(date +%s.%N)
  timeout 300 python3 -m harness bench --op "$op" --variant "$variant" --shapes "$shapes" --fresh-inputs \
    --repeats 20 --summary-csv "$WORK/$name.csv" "$@" > "$WORK/$name.log" 2>&1
  status=$?
  echo "$name: exit $status in $(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $started}") s; $(tail -1 "$WORK/$name.log")"
}
if [ "${1:-campaign}" = campaign ]; then
  timeout 480 python3 scripts/agent_rounds.py --op gemm --shapes "$WORK/llama3-8b-core.yaml" \
    --start "without TMA dispatch" \
    --plan "honest: TMA dispatch restored" "wrong with grad disabled" "skips work into a buffer that is not NaN" \
    --metric forward --repeats 20 --out "$WORK/agent-rounds" 2>&1 | tail -30 | tee "$WORK/agent-rounds.log"
  exit 0
fi
if [ "$1" = probes ]; then
  # Host TMA descriptors on a thread with no CUDA context (autograd's backward thread): with the fix, and
  # without it (the launcher's bind_context made a no-op), which must fail.
  timeout 120 python3 -m pytest -m gpu -q tests/test_tma_context.py 2>&1 | tail -3 | tee "$WORK/tma-context.log"
  timeout 60 python3 -c "import kernels.gemm.kernel as k, tests.test_tma_context as t
k.bind_context = lambda device: None
t.test_the_dense_tma_kernel()" 2>&1 | tail -2 | tee -a "$WORK/tma-context.log"
  for ov in gemm_fp8:e4m3-rowwise gemm_fp8:hybrid-blockwise grouped_gemm:default grouped_gemm_fp8:e4m3-rowwise \
          grouped_gemm_fp8:hybrid-blockwise; do
    bench "${ov%%:*}" "${ov#*:}" smoke "probes-${ov/:/-}" --probe-seed 11
  done | tee "$WORK/probes.txt"
  exit 0
fi
# A round = the candidate's bench (with probes) + the best's next to it; the Triton cache is warmed first.
python3 - "$WORK/llama3-8b-core.yaml" > "$WORK/reps.yaml" <<'PY'
import sys, yaml
shapes = yaml.safe_load(open(sys.argv[1]))
print(yaml.safe_dump([shapes[i] for i in (1, 0, 2)]))  # the campaign's pick: smallest, median, largest
PY
bench gemm default "$WORK/reps.yaml" warm-cache --checks full --probe-seed 1 | tee "$WORK/overhead.txt"
for trial in 1 2; do
  for level in basic full; do
    bench gemm default "$WORK/reps.yaml" "cand-$level-$trial" --checks $level --probe-seed $((trial + 1))
    bench gemm default "$WORK/reps.yaml" "ref-$level-$trial" --checks $level
  done
done | tee -a "$WORK/overhead.txt"
