#!/usr/bin/env bash
# Issue 16, one device call (9 minutes at most): the attention kernels with their tile streams through
# tensor descriptors (the tuned table's TMA knob), and with dQ added atomically by the dK/dV pass
# (DQ_ATOMIC), against the table as committed, in the same run. First the descriptor and atomic-dQ tests
# on the GPU (bf16, against float64), then the harness bench next to SDPA cuDNN and FLASH_ATTENTION on the
# acceptance shapes (d128, 2 x 8k, 16 heads, causal and not) and at d64 / d256: the table as committed,
# then TMA 1 in every bucket, then also DQ_ATOMIC 1 with 64-row query blocks and 2 stages in the dK/dV
# buckets (this device copy's tuning.py is rewritten; the checkout here is not). Logs and CSVs land in
# $OUT/results.tgz.
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

# Worst case 90 + 3 x 120 + 90 s.
step pytest-gpu 90 python3 -m pytest -q -p no:cacheprovider tests/test_attention.py tests/test_attention_fp8.py \
  -k "descriptors or atomically"
bench pointers
sed -i 's/"TMA": 0/"TMA": 1/' kernels/attention/tuning.py
bench tma
sed -i -E 's/("bwd_kv-d[0-9]+": \{"BLOCK_M": )32(.*"num_stages": )[0-9](.*"DQ_ATOMIC": )0/\164\22\31/' \
  kernels/attention/tuning.py
grep '"bwd_kv' kernels/attention/tuning.py
bench tma-dq-atomic
step pytest-new-table 90 python3 -m pytest -q -p no:cacheprovider tests/test_attention.py \
  -k "dense_forward or varlen"
