#!/usr/bin/env bash
# Issue 19: the tuned-table campaigns of several ops side by side, one op a GPU (a machine of several GPUs,
# e.g. nvidia-h100-x4), each in its own clone (a campaign commits on a branch of its own); or their best tables
# benched against the repo's, A B B A, one op a GPU. Carry .whl. Results: $OUT/<op>/results.tgz and
# $OUT/tables/<op>.py (each campaign's best table, from its best commit).
#   scripts/gpu_campaigns.sh campaigns MINUTES   # OPS (default: the four GEMM ops), SHAPES_<op> to override a
#                                                # preset (default: llama3 for the dense ops, headline else),
#                                                # ALGORITHM the search's (default halving; pattern: the one-knob
#                                                # walk from the table's configs)
#   scripts/gpu_campaigns.sh bench DIR           # DIR/<op>.py, a table a campaign left, against the repo's
source "$(dirname "$0")/gpu_env.sh"
install_wheels
git_snapshot
ROOT=$PWD
read -ra OPS <<< "${OPS:-gemm grouped_gemm gemm_fp8 grouped_gemm_fp8}"
mkdir -p "$OUT/tables"
for i in "${!OPS[@]}"; do
  op=${OPS[$i]}
  case $op in gemm|grouped_gemm) variant=default;; *) variant=e4m3-rowwise;; esac
  case $op in gemm*) shapes=llama3;; *) shapes=headline;; esac
  override=SHAPES_$op
  rm -rf "/tmp/campaign-$op" && git clone -q "$ROOT" "/tmp/campaign-$op"
  (
    cd "/tmp/campaign-$op" || exit 1
    export OUT=$OUT/$op GPUS=$i OP=$op VARIANT=$variant SHAPES=${!override:-$shapes}
    if [ "$1" = campaigns ]; then
      MINUTES=$2 bash scripts/gpu_search.sh tuned "${ALGORITHM:-halving}" > "$WORK/$op.log" 2>&1
      best=$(python3 -c "import json; print(json.load(open('campaigns/runs/search-$op/state.json'))['best_commit'])")
      git show "$best:kernels/$op/tuning.py" > "$OUT/../tables/$op.py"
    else
      bash scripts/gpu_search.sh bench "$ROOT/$2/$op.py" > "$WORK/$op.log" 2>&1
    fi
  ) &
done
wait
for op in "${OPS[@]}"; do echo "##### $op"; grep -E "round|ratio|step geomean|===" "$WORK/$op.log" | tail -40; done
