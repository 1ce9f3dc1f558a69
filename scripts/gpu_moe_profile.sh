#!/usr/bin/env bash
# Issue 17, one device call: the MoE layer's FP8 path reading the tokens and the combine's gradient
# through the expert order (kernels/moe/experts.py) and the quantization's token layout (a block map, not
# a binary search per program): every test of the quantization and the MoE layer on the GPU and the GPU
# tests of the grouped GEMMs, each quantization kernel's TB/s (scripts/quant_sweep.py), each layer timed
# against the torch layer and our bf16 layer (gradient accumulation, 8 microbatches), and the kernel
# table of the SonicMoE layer.
#   run(command="bash scripts/gpu_moe_profile.sh", carry=[".whl"], timeout_s=590)
source "$(dirname "$0")/gpu_env.sh"
install_wheels

step tests 200 python3 -m pytest -q --tb=short -m "gpu or not gpu" -p no:cacheprovider tests/test_fp8_quant.py \
  tests/test_moe_mlp.py
step grouped-gpu-tests 120 python3 -m pytest -q --tb=short -m gpu -p no:cacheprovider tests/test_grouped_gemm.py
step quant 60 python3 scripts/quant_sweep.py
step layer 120 python3 benchmarks/moe_layer.py --accumulate 8 --csv "$WORK/moe_layer.csv"
step kernels-sonic 60 python3 benchmarks/moe_layer.py --kernels --only sonicmoe --accumulate 4
