# Sourced by scripts/gpu_*.sh, one device call each: logs and CSVs go to $WORK, packed into
# $OUT/results.tgz on exit (the device returns few files); the GPU and software versions come first.
# `install_wheels` puts the carried .whl packages (pydantic, gitpython, torchao: the device image lacks
# them) and this checkout on PYTHONPATH; `step` runs one part of a call under its own time limit, so a
# part that fails or hangs does not stop the next.
set -uo pipefail
OUT=${OUT:-/tmp/turbo-opt-out}
WORK=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
trap 'tar czf "$OUT/results.tgz" -C "$WORK" .' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  | tee "$WORK/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$WORK/gpu.txt"

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $WORK/NAME.log, print its tail
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - start)) s (limit $limit s)"
  tail -n 40 "$WORK/$name.log"
}

install_wheels() {  # the carried wheels into /tmp/site (a failed install ends the call), and the repo
  if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
}

git_snapshot() {  # the device gets the tree without .git (a .git of an earlier call may linger): campaigns
  # need a checkout whose tree is committed, and commits an identity
  export GIT_AUTHOR_NAME=gpu GIT_AUTHOR_EMAIL=gpu@turbo-opt GIT_COMMITTER_NAME=gpu GIT_COMMITTER_EMAIL=gpu@turbo-opt
  [ -d .git ] || git init -q
  git add -A && { git diff --cached --quiet || git commit -qm "working tree"; }
}
