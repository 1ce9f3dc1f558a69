#!/usr/bin/env bash
# Issue 16, one device call: the warp-specialized attention forward (kernels/attention/hopper_ws.py) on the
# GPU: its tests against float64 and the attention GPU suite, then the forward A/B against the Triton
# forward and SDPA cuDNN / FA2 (benchmarks/attention_ab.py; `ab-bwd`: our backward and theirs). With
# `table`, the harness bench of the acceptance shapes (d128, d64) and the llama3-8b preset next to cuDNN
# and FA2 under the committed tuned table. Logs and CSVs in $OUT/results.tgz.
#   run(command="bash scripts/gpu_attention_ws.sh tests ab table", carry=[".whl"], timeout_s=600)
source "$(dirname "$0")/gpu_env.sh"
install_wheels

for part in "$@"; do
  case $part in
    tests)
      step pytest-ws 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_attention.py ;;
    ab)
      step attention-ab 240 python3 benchmarks/attention_ab.py --rounds 5 --csv "$WORK/attention_ab.csv" ;;
    ab-bwd)
      step attention-ab-bwd 240 python3 benchmarks/attention_ab.py --pass bwd --rounds 5 \
        --csv "$WORK/attention_ab_bwd.csv" ;;
    table)
      cat > "$WORK/acceptance.yaml" <<'SHAPES'
- {label: headline/d128, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 128, Dv: 128}
- {label: headline/d128/causal, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 128, Dv: 128, causal: 1}
- {label: headline/d64, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 64, Dv: 64}
- {label: headline/d64/causal, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 64, Dv: 64, causal: 1}
SHAPES
      step bench-acceptance 150 python3 -m harness bench --op attention --shapes "$WORK/acceptance.yaml" \
        --compare-baselines --summary-csv "$WORK/attention-acceptance.csv"
      step bench-llama3 150 python3 -m harness bench --op attention --shapes llama3-8b \
        --compare-baselines --summary-csv "$WORK/attention-llama3.csv" ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
done
