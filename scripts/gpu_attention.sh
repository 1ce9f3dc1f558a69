#!/usr/bin/env bash
# Issue 16, one device call (6.5 minutes at most): the attention GPU tests (bf16 SNR, CUDA-graph replay
# equals eager), then the harness bench next to SDPA cuDNN and FLASH_ATTENTION on the acceptance shape
# (d128, 2 x 8k, 16 heads, causal and not), llama3-8b and gpt-oss (with and without its 128-key window:
# SDPA has no window, so its rows there are FAIL by design; compiled flex_attention covers them, and only
# them). Each step has its own time limit and a failing step does not stop the next. Logs and CSVs land
# in $OUT/results.tgz; each step's tail is printed.
# The harness needs pydantic and gitpython, which the device image lacks: carry .whl (README's wheels):
#   run(command="bash scripts/gpu_attention.sh", carry=[".whl"], timeout_s=600)
source "$(dirname "$0")/gpu_env.sh"
install_wheels

bench() {  # bench NAME SECONDS SHAPES: our kernel and the baselines, one CSV each
  step "bench-$1" "$2" python3 -m harness bench --op attention --shapes "$3" --compare-baselines \
    --summary-csv "$WORK/attention-$1.csv"
}

cat > "$WORK/acceptance.yaml" <<'SHAPES'
- {label: headline/d128, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 128, Dv: 128}
- {label: headline/d128/causal, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 128, Dv: 128, causal: 1}
SHAPES

# Worst case 150 + 60 + 60 + 120 s. The gpt-oss step compiles flex_attention (torch.compile, forward and
# backward) for its two windowed shapes: if it runs out of time, run that bench alone with a longer limit.
step pytest-gpu 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_attention.py
bench acceptance 60 "$WORK/acceptance.yaml"
bench llama3-8b 60 llama3-8b
bench gpt-oss 120 gpt-oss
