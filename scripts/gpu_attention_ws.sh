#!/usr/bin/env bash
# Issue 16, one device call: the warp-specialized attention kernels (kernels/attention/hopper_ws.py) on the
# GPU: their tests against float64 and the attention GPU suite, then the forward A/B against the Triton
# forward and SDPA cuDNN / FA2 (benchmarks/attention_ab.py; `ab-bwd`: our backwards, fused and two-pass,
# and theirs). With
# `table`, the harness bench of the headline preset (issue 16's acceptance setting: 2 x 8k tokens, d64 /
# d128 / d256, causal and not) and the llama3-8b preset next to cuDNN and FA2 under the committed tuned
# table. Logs and CSVs in $OUT/results.tgz.
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
      step bench-headline 150 python3 -m harness bench --op attention --shapes headline \
        --compare-baselines --summary-csv "$WORK/attention-headline.csv"
      step bench-llama3 150 python3 -m harness bench --op attention --shapes llama3-8b \
        --compare-baselines --summary-csv "$WORK/attention-llama3.csv" ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
done
