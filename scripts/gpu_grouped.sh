#!/usr/bin/env bash
# One device call for the grouped GEMMs: GPU tests (bf16 paths on the device), per-pass timings,
# then bf16 and FP8 benchmarks next to torch's grouped GEMMs, packed into $OUT/results.tgz.
#   usage: scripts/gpu_grouped.sh [preset] [repeats]
set -uo pipefail
OUT=${OUT:-/tmp/turbo-opt-out}
WORK=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
preset=${1:-headline}
repeats=${2:-20}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$WORK/gpu.txt"

python3 -m pytest -m gpu -q tests 2>&1 | tee "$WORK/pytest-gpu.log"
python3 -m pytest -q tests/test_grouped_gemm.py tests/test_fp8_quant.py 2>&1 | tee "$WORK/pytest-grouped-on-gpu.log"
python3 benchmarks/grouped_passes.py --shapes "$preset" --repeats "$repeats" --csv "$WORK/passes.csv" \
  2>&1 | tee "$WORK/passes.log"

bench() {  # name, preset, then turbo-opt bench arguments
  local name=$1 shapes=$2; shift 2
  python3 -m agent bench --shapes "$shapes" --repeats "$repeats" --warmup 5 --summary-csv "$WORK/$name.csv" "$@" \
    2>&1 | tee "$WORK/bench-$name.log"
}
bench bf16 "$preset" --op grouped_gemm --compare-baselines
bench fp8-rowwise "$preset" --op grouped_gemm_fp8 --compare-baselines
bench fp8-blockwise "$preset" --op grouped_gemm_fp8 --variant e4m3-blockwise --compare-baselines
bench fp8-hybrid-blockwise "$preset" --op grouped_gemm_fp8 --variant hybrid-blockwise
bench fp8-hybrid-tensorwise "$preset" --op grouped_gemm_fp8 --variant hybrid-tensorwise
bench bf16-graph "$preset" --op grouped_gemm --timing cuda-graph
bench dsv3-fp8-rowwise deepseek-v3 --op grouped_gemm_fp8 --compare-baselines

tar czf "$OUT/results.tgz" -C "$WORK" .
