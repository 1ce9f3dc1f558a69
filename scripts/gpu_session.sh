#!/usr/bin/env bash
# One device call: GPU tests, then the gemm benchmarks next to cuBLAS. Logs and CSVs go to a work
# folder that is packed into $OUT/results.tgz (the device returns at most 8 files).
#   usage: scripts/gpu_session.sh [preset ...]      (default: llama3-8b llama3-70b)
source "$(dirname "$0")/gpu_env.sh"
if [ $# -gt 0 ]; then presets=("$@"); else presets=(llama3-8b llama3-70b); fi

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
