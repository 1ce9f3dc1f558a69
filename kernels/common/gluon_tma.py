"""Host tensor descriptors for the Gluon kernels (kernels/attention/hopper_ws.py, kernels/common/blockwise_ws.py).

A descriptor carries the shared-memory layout of its box. Gluon computes one (NVMMASharedLayout.get_default_for)
through its constexpr functions, about 6 us of host a call (CPU, 2026-11-27), and a launch builds three to five
descriptors: the layouts of every box the launchers use are computed once, at import, and looked up.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

GL_DTYPES: dict[torch.dtype, object] = {
    torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32,
    torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5,
}
# Box rows x columns of the launchers: query and key blocks (64, 128), the blockwise GEMM's B tiles (up to 256)
# by head dims and dQ chunks (32-256) or K blocks (128).
_BOX_LAYOUTS = {
    (rows, cols, dtype): gl.NVMMASharedLayout.get_default_for([rows, cols], gl_dtype)
    for rows in (64, 128, 256) for cols in (32, 64, 128, 256) for dtype, gl_dtype in GL_DTYPES.items()
}


def descriptor(t: torch.Tensor, box: Sequence[int]) -> TensorDescriptor:
    """A TMA descriptor over 2-D `t` (its own shape and strides) reading [rows, cols] boxes."""
    rows, cols = box
    layout = _BOX_LAYOUTS.get((rows, cols, t.dtype))
    if layout is None:  # a box no launcher used when the table was written
        layout = gl.NVMMASharedLayout.get_default_for([rows, cols], GL_DTYPES[t.dtype])
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [rows, cols], layout)
