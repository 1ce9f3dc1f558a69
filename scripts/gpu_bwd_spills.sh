#!/usr/bin/env bash
# The fused attention backward without register spills at d256, and quantize_both's amax atomics relaxed (one
# device call, about 7 minutes): the warp-specialized backward's GPU tests (several tiles a CTA, heads side by
# side, the causal GQA step under CUDA-graph replay) and the FP8 quantization and MoE MLP tests on the GPU; the
# harness bench of issue 16's headline preset (d64 / d128 / d256, causal and not) next to SDPA, twice; the MoE
# MLP layers, FP8 over bf16 (issue 17), 8 microbatches a step. Logs and CSVs land in $OUT/results.tgz.
#   run(command="bash scripts/gpu_bwd_spills.sh", carry=[".whl"], kind="nvidia-h100-x1", timeout_s=600)
source "$(dirname "$0")/gpu_env.sh"
install_wheels

step pytest-attention 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_attention.py \
  -k "backward or graph or side_by_side"
step pytest-fp8 150 python3 -m pytest -m "gpu or not gpu" -q -p no:cacheprovider tests/test_fp8_quant.py \
  tests/test_moe_mlp.py
for call in 1 2; do
  step "bench-headline-$call" 90 python3 -m harness bench --op attention --shapes headline --compare-baselines \
    --summary-csv "$WORK/attention-headline-$call.csv"
done
step moe-layer 150 python3 benchmarks/moe_layer.py --accumulate 8 --csv "$WORK/moe_layer.csv"
