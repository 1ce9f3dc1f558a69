"""Production Triton training kernels, one package per op family.

Kernels import nothing from `harness` or `agent`. On a machine without a CUDA GPU the Triton
interpreter is switched on here, so every op runs (slowly) on the CPU: import `kernels` before
triton, as `harness` does.
"""

import os

import torch

# Triton reads TRITON_INTERPRET when a kernel is decorated, so this must run before kernel modules load.
if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
# Fixed here for the same reason; kernels/common/device.py reads it, so no other kernel file needs os
# (the audit refuses it in kernel files).
INTERPRETER = os.environ.get("TRITON_INTERPRET", "0") == "1"
# TURBO_OPT_TRITON_LAUNCH=triton: every kernel launch goes through Triton's `kernel[grid]` instead of the
# cached launches of kernels/common/launch.py (an A/B switch for host-time measurements).
DIRECT_LAUNCH = os.environ.get("TURBO_OPT_TRITON_LAUNCH", "direct") != "triton"
