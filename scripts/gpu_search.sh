#!/usr/bin/env bash
# Issues 19 and 20: the retune search from a detuned grouped_gemm_fp8 table (e4m3-rowwise, headline),
# then one bench of the hand-tuned table and of the campaign's best in the same call; one screening round
# on 1 GPU and on 2. Each part fits one device call (under 10 minutes); carry .whl (pydantic, gitpython).
# Results land in $OUT/results.tgz. GPUS=0 (a CUDA_VISIBLE_DEVICES list) keeps a campaign to those GPUs.
#   scripts/gpu_search.sh campaign [algorithm]   # default halving; MINUTES (default 6) of rounds
#   scripts/gpu_search.sh resume                 # the same campaign, on the same (still warm) machine
#   scripts/gpu_search.sh bench [TABLE]          # hand-tuned vs the campaign's best (TABLE: its tuning.py,
#                                                # as the campaign call returned it in best-tuning.py), one call
#   scripts/gpu_search.sh screening              # the GPU tests of the trial pool, then one round's search
#                                                # (halving, dgrad/large from the detuned config) on 1 GPU and 2
source "$(dirname "$0")/gpu_env.sh"
install_wheels
TUNING=kernels/grouped_gemm_fp8/tuning.py
NAME=detuned-search
git_snapshot
[ -n "${GPUS:-}" ] && export CUDA_VISIBLE_DEVICES=$GPUS
case "${1:-campaign}" in
  screening)
    step gpu-tests 240 python3 -m pytest -m gpu -q tests/test_trial_pool.py
    step screening 540 python3 benchmarks/screening.py --gpus 1 --gpus 2 --csv "$WORK/screening.csv"
    ;;
  campaign)
    git tag -f hand-tuned > /dev/null
    python3 - "$TUNING" <<'PY'
import sys
from pathlib import Path
from agent.tuning_table import read_tuning, rewrite_table
detuned = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 2}
path = Path(sys.argv[1])
rewrite_table(path, dict.fromkeys(read_tuning(path)[1], detuned))
PY
    git commit -qam "detuned start (every bucket 64x64x128, GROUP_M 1, 4 warps, 2 stages)"
    cat > "$WORK/manifest.yaml" <<YAML
op: grouped_gemm_fp8
variant: e4m3-rowwise
shapes: headline
max_iterations: 20
max_duration_min: ${MINUTES:-6}
repeats: 20
proposer: {kind: search, algorithm: ${2:-halving}}
YAML
    cp "$WORK/manifest.yaml" campaigns/detuned-search.yaml
    git add campaigns/detuned-search.yaml && git commit -qm "the search campaign's manifest"
    step campaign 560 python3 -m agent start --manifest campaigns/detuned-search.yaml --name "$NAME"
    cp "$TUNING" "$WORK/best-tuning.py"
    cp -r "campaigns/runs/$NAME" "$WORK/run" 2>/dev/null
    ;;
  resume)
    step resume 560 python3 -m agent resume "$NAME"
    cp "$TUNING" "$WORK/best-tuning.py"
    cp -r "campaigns/runs/$NAME" "$WORK/run" 2>/dev/null
    ;;
  bench)
    git show hand-tuned:"$TUNING" > "$WORK/hand-tuned.py" 2>/dev/null || cp "$TUNING" "$WORK/hand-tuned.py"
    cp "${2:-$TUNING}" "$WORK/best.py"
    for table in hand-tuned best; do
      cp "$WORK/$table.py" "$TUNING"
      step "bench-$table" 240 python3 -m agent bench --op grouped_gemm_fp8 --variant e4m3-rowwise --shapes headline \
        --repeats 20 --summary-csv "$WORK/$table.csv"
    done
    cp "$WORK/best.py" "$TUNING"
    python3 -m agent gate "$WORK/hand-tuned.csv" "$WORK/best.csv" 2>&1 | tee "$WORK/gate.log"
    python3 -c "
import sys
from harness.schema import read_summary
from harness.stats import geomean
hand, best = (read_summary(p).metric('step') for p in sys.argv[1:])
print(f'best over hand-tuned, step geomean: {geomean(best) / geomean(hand):.3f}x (issue 19 asks >= 0.95x)')
" "$WORK/hand-tuned.csv" "$WORK/best.csv" | tee "$WORK/ratio.log"
    ;;
esac
cp -r "campaigns/runs/$NAME" "$WORK/" 2>/dev/null || true
