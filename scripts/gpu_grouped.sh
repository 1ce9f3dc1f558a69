#!/usr/bin/env bash
# One device call for the grouped GEMMs: GPU tests, then bf16 and FP8 benchmarks next to torch's
# grouped GEMMs, packed into $OUT/results.tgz.   usage: scripts/gpu_grouped.sh [preset] [repeats]
set -uo pipefail
OUT=${OUT:-/tmp/turbo-opt-out}
WORK=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
preset=${1:-headline}
repeats=${2:-20}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$WORK/gpu.txt"

python3 -m pytest -m gpu -q tests 2>&1 | tee "$WORK/pytest-gpu.log"

bench() {  # name, then turbo-opt bench arguments
  local name=$1; shift
  python3 -m agent bench --shapes "$preset" --repeats "$repeats" --warmup 5 --summary-csv "$WORK/$name.csv" "$@" \
    2>&1 | tee "$WORK/bench-$name.log"
}
bench bf16 --op grouped_gemm --compare-baselines
bench fp8-rowwise --op grouped_gemm_fp8 --compare-baselines
bench fp8-blockwise --op grouped_gemm_fp8 --variant e4m3-blockwise
bench fp8-hybrid-tensorwise --op grouped_gemm_fp8 --variant hybrid-tensorwise
bench bf16-graph --op grouped_gemm --timing cuda-graph

tar czf "$OUT/results.tgz" -C "$WORK" .
