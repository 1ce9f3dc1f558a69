#!/usr/bin/env bash
# Issue 16, one device call (8.5 minutes at most): the attention GPU tests (bf16 and FP8-forward SNR,
# CUDA-graph replay equals eager), then the harness bench next to SDPA cuDNN and FLASH_ATTENTION on the
# acceptance shape (d128, 2 x 8k, 16 heads, causal and not) and at d64 / d256, each in bf16 and with the
# FP8 forward, and gpt-oss (with and without its 128-key window:
# SDPA has no window, so its rows there are FAIL by design; compiled flex_attention covers them, and only
# them). Each step has its own time limit and a failing step does not stop the next. Logs and CSVs land
# in $OUT/results.tgz; each step's tail is printed.
# The harness needs pydantic and gitpython, which the device image lacks: carry .whl (README's wheels):
#   run(command="bash scripts/gpu_attention.sh", carry=[".whl"], timeout_s=600)
source "$(dirname "$0")/gpu_env.sh"
install_wheels

bench() {  # bench NAME SECONDS SHAPES [VARIANT]: our kernel and the baselines, one CSV each
  step "bench-$1" "$2" python3 -m harness bench --op attention --shapes "$3" --variant "${4:-default}" \
    --compare-baselines --summary-csv "$WORK/attention-$1.csv"
}

cat > "$WORK/acceptance.yaml" <<'SHAPES'
- {label: headline/d128, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 128, Dv: 128}
- {label: headline/d128/causal, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 128, Dv: 128, causal: 1}
SHAPES
cat > "$WORK/head-dims.yaml" <<'SHAPES'
- {label: headline/d64, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 64, Dv: 64}
- {label: headline/d64/causal, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 64, Dv: 64, causal: 1}
- {label: headline/d256, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 256, Dv: 256}
- {label: headline/d256/causal, B: 2, Hq: 16, Hkv: 16, Sq: 8192, Sk: 8192, D: 256, Dv: 256, causal: 1}
SHAPES

# Worst case 150 + 60 + 60 + 60 + 60 + 120 s. The FP8 forward (`--variant e4m3-forward`: its quantization of
# q, k and v inside the forward's timing, the bf16 backward) has our bf16 forward and SDPA beside it. The
# gpt-oss step compiles flex_attention (torch.compile, forward and backward) for its two windowed shapes:
# if it runs out of time, run that bench alone with a longer limit.
step pytest-gpu 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_attention.py \
  tests/test_attention_fp8.py
bench acceptance 60 "$WORK/acceptance.yaml"
bench acceptance-fp8 60 "$WORK/acceptance.yaml" e4m3-forward
bench head-dims 60 "$WORK/head-dims.yaml"
bench head-dims-fp8 60 "$WORK/head-dims.yaml" e4m3-forward
bench gpt-oss 120 gpt-oss
