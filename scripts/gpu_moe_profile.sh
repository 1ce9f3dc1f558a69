#!/usr/bin/env bash
# Issues 15 and 17, one device call: after a change to the quantization kernels, every test of the
# quantization and the MoE layer on the GPU, each kernel's TB/s (scripts/quant_sweep.py), each MoE layer against the torch layer and our bf16 layer (gradient
# accumulation, 8 microbatches), the DeepSeek-V3 headline passes with their quantization, and the expert
# step's gradient-accumulation loop (rowwise and blockwise, eager).
#   run(command="bash scripts/gpu_moe_profile.sh", carry=[".whl"], timeout_s=590)
# Kernel tables: python3 benchmarks/moe_layer.py --kernels --only sonicmoe --accumulate 4
source "$(dirname "$0")/gpu_env.sh"
install_wheels

step tests 220 python3 -m pytest -q --tb=short -m "gpu or not gpu" -p no:cacheprovider tests/test_fp8_quant.py \
  tests/test_moe_mlp.py
step quant 60 python3 scripts/quant_sweep.py
step layer 120 python3 benchmarks/moe_layer.py --accumulate 8 --csv "$WORK/moe_layer.csv"
step passes 150 python3 benchmarks/grouped_passes.py --shapes headline --only deepseek-v3 --csv "$WORK/passes.csv"
cd benchmarks || exit 1
step moe-loop 220 python3 training_step.py --suite moe --accumulate 8 --steps 4 --no-torchao \
  --variants e4m3-rowwise e4m3-blockwise --csv "$WORK/moe_loop.csv"
