#!/usr/bin/env bash
# Issue 16, one device call (about 7 minutes): the warp-specialized attention forward's lazy rescale (the
# tuned table's LAZY knob, kernels/attention/tuning.py) and its persistent grid (non-causal). The attention GPU
# tests first (every kernel against float64 into poisoned buffers, the lazy rescale on and off and a persistent
# CTA walking several tiles at d64 / d128 / d256, CUDA-graph replay == eager); then the forward alone in
# interleaved rounds next to SDPA cuDNN and FA2 at d128 / d64 / d256, causal and not, the lazy rescale off and
# on, on the persistent grid and a CTA a tile; then the harness bench of the acceptance shapes and the headline
# preset as the tuned table runs them. Logs and CSVs land in $OUT/results.tgz.
#   run(command="bash scripts/gpu_attention_rescale.sh", carry=[".whl"], kind="nvidia-h100-x1", timeout_s=600)
source "$(dirname "$0")/gpu_env.sh"
install_wheels

step pytest-gpu 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_attention.py tests/test_attention_fp8.py
step ab-fwd 240 python3 benchmarks/attention_ab.py --rounds 11 --ws 128:2 128:3 64:2 --lazy 0 1 --persistent 0 1 \
  --csv "$WORK/attention_ab_fwd.csv"
cat > "$WORK/acceptance.yaml" <<'SHAPES'
- {label: headline/d128, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 128, Dv: 128}
- {label: headline/d128/causal, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 128, Dv: 128, causal: 1}
SHAPES
step bench-acceptance 60 python3 -m harness bench --op attention --shapes "$WORK/acceptance.yaml" \
  --compare-baselines --summary-csv "$WORK/attention-acceptance.csv"
step bench-headline 90 python3 -m harness bench --op attention --shapes headline --compare-baselines \
  --summary-csv "$WORK/attention-headline.csv"
