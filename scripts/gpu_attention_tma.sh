#!/usr/bin/env bash
# Issue 16, one device call (7 minutes at most): the attention kernels with their tile streams through
# tensor descriptors (the tuned table's TMA knob) against the same kernels on pointers, in the same run.
# First the descriptor test on the GPU (bf16, against float64), then the harness bench next to SDPA cuDNN
# and FLASH_ATTENTION on the acceptance shapes (d128, 2 x 8k, 16 heads, causal and not) and at d64 / d256,
# with the table as committed (TMA 0), then with TMA 1 in every bucket (this device copy's tuning.py is
# rewritten; the checkout here is not). Logs and CSVs land in $OUT/results.tgz.
#   run(command="bash scripts/gpu_attention_tma.sh", carry=[".whl"], timeout_s=600)
source "$(dirname "$0")/gpu_env.sh"
install_wheels

cat > "$WORK/shapes.yaml" <<'SHAPES'
- {label: headline/d128, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 128, Dv: 128}
- {label: headline/d128/causal, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 128, Dv: 128, causal: 1}
- {label: headline/d64/causal, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 64, Dv: 64, causal: 1}
- {label: headline/d256/causal, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 256, Dv: 256, causal: 1}
SHAPES

bench() {  # bench NAME: our kernel and the baselines on the shapes above, one CSV
  step "bench-$1" 120 python3 -m harness bench --op attention --shapes "$WORK/shapes.yaml" --compare-baselines \
    --summary-csv "$WORK/attention-$1.csv"
}

# Worst case 90 + 120 + 120 + 90 s.
step pytest-descriptors 90 python3 -m pytest -q -p no:cacheprovider tests/test_attention.py -k descriptors
bench pointers
sed -i 's/"TMA": 0/"TMA": 1/' kernels/attention/tuning.py
bench tma
step pytest-tma-table 90 python3 -m pytest -q -p no:cacheprovider tests/test_attention.py -k "dense_forward or varlen"
