#!/usr/bin/env bash
# One device call: GPU tests, then the gemm benchmarks next to cuBLAS. Logs and CSVs go to a work
# folder that is packed into $OUT/results.tgz (the device returns at most 8 files).
#   usage: scripts/gpu_session.sh [preset ...]      (default: llama3-8b llama3-70b)
set -uo pipefail
OUT=${OUT:-/tmp/turbo-opt-out}
WORK=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ $# -gt 0 ]; then presets=("$@"); else presets=(llama3-8b llama3-70b); fi

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  | tee "$WORK/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$WORK/gpu.txt"

python3 -m pytest -m gpu -q tests 2>&1 | tee "$WORK/pytest-gpu.log"
python3 -m pytest -q tests/test_gemm.py 2>&1 | tee "$WORK/pytest-gemm-on-gpu.log"

for preset in "${presets[@]}"; do
  python3 -m agent bench --op gemm --shapes "$preset" --compare-baselines \
    --summary-csv "$WORK/$preset.csv" 2>&1 | tee "$WORK/bench-$preset.log"
  python3 -m agent gate "$WORK/$preset.baseline-torch_matmul.csv" "$WORK/$preset.csv" --metric forward \
    2>&1 | tee "$WORK/gate-vs-cublas-$preset.log"
done
python3 -m agent bench --op gemm --shapes "${presets[0]}" --timing cuda-graph --compare-baselines \
  --summary-csv "$WORK/${presets[0]}-graph.csv" 2>&1 | tee "$WORK/bench-${presets[0]}-graph.log"

tar czf "$OUT/results.tgz" -C "$WORK" .
