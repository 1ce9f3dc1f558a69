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
