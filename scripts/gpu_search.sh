#!/usr/bin/env bash
# Issues 19 and 20: the retune search, from a detuned table or from the op's own, then the tables benched
# against each other in one call; one screening round on 1 GPU and on 2. Each part fits one device call
# (under 10 minutes); carry .whl (pydantic, gitpython). Results land in $OUT/results.tgz.
# OP, VARIANT (default grouped_gemm_fp8, e4m3-rowwise) and SHAPES (default: the op's own preset) name the campaign's op; MINUTES
# (default 6) its rounds; TIMING (default auto; cuda-graph times the kernels alone, for presets whose shapes are
# host-bound, where a tile config cannot move the host time) its manifest's timing; GPUS=0 (a
# CUDA_VISIBLE_DEVICES list) keeps it to those GPUs.
#   scripts/gpu_search.sh campaign [algorithm]   # from every bucket at 64x64x128, GROUP_M 1, 4 warps, 2 stages
#   scripts/gpu_search.sh tuned [algorithm]      # from the op's tuned table as the repo holds it
#   scripts/gpu_search.sh resume                 # the same campaign, on the same (still warm) machine
#   scripts/gpu_search.sh bench [TABLE]          # the repo's table vs TABLE (default: the one in the tree, as
#                                                # a campaign left it), alternating A B B A, one call
#   scripts/gpu_search.sh screening              # the GPU tests of the trial pool, then one round's search
#                                                # (halving, dgrad/large from the detuned config) on 1 GPU and 2
source "$(dirname "$0")/gpu_env.sh"
install_wheels
OP=${OP:-grouped_gemm_fp8}
VARIANT=${VARIANT:-e4m3-rowwise}
SHAPES=${SHAPES:-}
TUNING=kernels/$OP/tuning.py
NAME=search-$OP
git_snapshot
[ -n "${GPUS:-}" ] && export CUDA_VISIBLE_DEVICES=$GPUS

start_campaign() {  # the manifest, committed, then the campaign
  cat > "campaigns/$NAME.yaml" <<YAML
op: $OP
variant: $VARIANT
${SHAPES:+shapes: $SHAPES}
max_iterations: 20
max_duration_min: ${MINUTES:-6}
timing: ${TIMING:-auto}
repeats: 20
proposer: {kind: search, algorithm: ${1:-halving}}
YAML
  git add "campaigns/$NAME.yaml" && git commit -qm "the search campaign's manifest"
  step campaign 560 python3 -m agent start --manifest "campaigns/$NAME.yaml" --name "$NAME"
}

case "${1:-campaign}" in
  screening)
    step gpu-tests 240 python3 -m pytest -m gpu -q tests/test_trial_pool.py
    step screening 540 python3 benchmarks/screening.py --gpus 1 --gpus 2 --csv "$WORK/screening.csv"
    ;;
  campaign)
    git tag -f repo-table > /dev/null  # what `bench` compares with, here and on a later call to this machine
    python3 - "$TUNING" <<'PY'
import sys
from pathlib import Path
from agent.tuning_table import read_tuning, rewrite_table
sys.path.insert(0, "benchmarks")
from screening import DETUNED
path = Path(sys.argv[1])
rewrite_table(path, dict.fromkeys(read_tuning(path)[1], DETUNED))
PY
    git commit -qam "detuned start (every bucket 64x64x128, GROUP_M 1, 4 warps, 2 stages)"
    start_campaign "${2:-halving}"
    ;;
  tuned)
    git tag -f repo-table > /dev/null
    start_campaign "${2:-halving}"
    ;;
  resume)
    step resume 560 python3 -m agent resume "$NAME"
    ;;
  bench)
    # the table the carried tree holds (a campaign's tree may have moved on: the tag marks where it started)
    git show repo-table:"$TUNING" > "$WORK/repo.py" 2>/dev/null || cp "$TUNING" "$WORK/repo.py"
    cp "${2:-$TUNING}" "$WORK/best.py"
    for run in repo-1 best-1 best-2 repo-2; do
      cp "$WORK/${run%-*}.py" "$TUNING"
      step "bench-$run" 140 python3 -m agent bench --op "$OP" --variant "$VARIANT" ${SHAPES:+--shapes "$SHAPES"} \
        ${TIMING:+--timing "$TIMING"} \
        --repeats 20 --summary-csv "$WORK/$run.csv"
    done
    cp "$WORK/best.py" "$TUNING"
    python3 -m agent gate "$WORK/repo-1.csv" "$WORK/best-1.csv" 2>&1 | tee "$WORK/gate.log"
    python3 -c "
import sys
from harness.schema import read_summary
from harness.stats import geomean
repo, best = ([geomean(read_summary(f'{sys.argv[1]}/{t}-{i}.csv').metric('step')) for i in (1, 2)]
              for t in ('repo', 'best'))
print(f'step geomean: repo table {repo[0]:.1f} / {repo[1]:.1f}, best {best[0]:.1f} / {best[1]:.1f}: '
      f'{geomean(best) / geomean(repo):.3f}x the repo table')
" "$WORK" | tee "$WORK/ratio.log"
    ;;
esac
cp "$TUNING" "$WORK/best-tuning.py"
cp -r "campaigns/runs/$NAME" "$WORK/" 2>/dev/null || true
