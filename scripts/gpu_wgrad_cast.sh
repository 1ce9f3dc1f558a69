#!/usr/bin/env bash
# Issue 15, one device call: the rowwise wgrad casting the upstream gradient in warps of its own
# (kernels/grouped_gemm_fp8/wgrad_cast_ws.py). The GPU runs of the grouped FP8 tests (the casting kernel
# against the transposed copy's, bf16 SNR gates), the quantization and MoE tests; benchmarks/wgrad_cast_ab.py
# on the headline preset (both ways, interleaved, next to bf16; each GEMM alone) and on HYBRID's DeepSeek-V3
# shapes; then the per-pass table on DeepSeek-V3 (benchmarks/grouped_passes.py).
source scripts/gpu_env.sh
install_wheels
step tests 240 python3 -m pytest -q -m "gpu or not gpu" tests/test_grouped_gemm.py tests/test_moe_mlp.py \
  tests/test_fp8_quant.py -x
cd benchmarks
step wgrad_cast_ab 240 python3 wgrad_cast_ab.py --shapes headline --rounds 7 --csv "$WORK/wgrad_cast_ab.csv"
step wgrad_cast_ab_hybrid 120 python3 wgrad_cast_ab.py --shapes headline --only deepseek --format hybrid \
  --rounds 5 --csv "$WORK/wgrad_cast_ab_hybrid.csv"
step grouped_passes 180 python3 grouped_passes.py --shapes headline --only deepseek-v3 --rounds 9 \
  --csv "$WORK/grouped_passes.csv"
