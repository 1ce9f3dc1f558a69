#!/usr/bin/env bash
# Issues 15 and 17, one device call: every test of the quantization on the GPU (tensorwise included:
# tiles computed in fp32 once got a wrong transposed layout there), then scripts/quant_sweep.py (each
# quantization kernel's TB/s on the SonicMoE layer's rows, next to a copy; --sweep: under each tile width and warps).
#   run(command="bash scripts/gpu_quant_sweep.sh", carry=[".whl"], timeout_s=300)
source "$(dirname "$0")/gpu_env.sh"
install_wheels
step tests 150 python3 -m pytest -q --tb=short -m "gpu or not gpu" -p no:cacheprovider tests/test_fp8_quant.py
step quant 150 python3 scripts/quant_sweep.py --sweep
