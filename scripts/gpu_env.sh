# Sourced by scripts/gpu_*.sh, one device call each: logs and CSVs go to $WORK, packed into
# $OUT/results.tgz on exit (the device returns few files); the GPU and software versions come first.
set -uo pipefail
OUT=${OUT:-/tmp/turbo-opt-out}
WORK=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
trap 'tar czf "$OUT/results.tgz" -C "$WORK" .' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  | tee "$WORK/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$WORK/gpu.txt"
