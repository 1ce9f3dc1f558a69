"""What the Hopper copy engine (TMA) can read: a tensor descriptor needs a 16-byte aligned base, one
unit-stride dimension of at least 16 bytes, and every other stride a multiple of 16 bytes. Where an
operand breaks that (K = 61, an odd slice), the kernels fall back to pointer loads. And what a host
descriptor needs of the calling thread: a current CUDA context."""

from __future__ import annotations

import torch
from triton.tools.tensor_descriptor import TensorDescriptor


def tma_layout(t: torch.Tensor) -> bool | None:
    """Whether TMA can read 2-D `t`: True if its rows are contiguous, False if its columns are, None if
    neither or if its base or its other stride is not a multiple of 16 bytes."""
    if t.data_ptr() % 16:
        return None
    # Straight-line tests, not a loop over the dims: a MoE training step asks 12 times.
    (rows, cols), (row_stride, col_stride), size = t.shape, t.stride(), t.element_size()
    if col_stride == 1 and row_stride * size % 16 == 0 and cols * size >= 16:
        return True
    if row_stride == 1 and col_stride * size % 16 == 0 and rows * size >= 16:
        return False
    return None


def stack_tma_layout(b: torch.Tensor) -> bool | None:
    """Whether TMA can read the 3-D weight stack b [G, N, K]: True if K is contiguous, False if N is,
    None if neither or if the base or another stride is not a multiple of 16 bytes."""
    if b.data_ptr() % 16:
        return None
    (_, N, K), (group_stride, n_stride, k_stride), size = b.shape, b.stride(), b.element_size()
    if group_stride * size % 16:
        return None
    if k_stride == 1 and n_stride * size % 16 == 0 and K * size >= 16:
        return True
    if n_stride == 1 and k_stride * size % 16 == 0 and N * size >= 16:
        return False
    return None


class CheckedDescriptor(TensorDescriptor):
    """A host tensor descriptor over an operand that tma_layout or stack_tma_layout has let through (a 16-byte
    aligned base, a unit last stride, 16-byte multiples elsewhere) with a tuned config's block (powers of two
    from the tunable space). Triton's dataclass (3.6 to 3.9: its __post_init__ only asserts) checks all of that
    again on every construction, 1 us of the 1.5 a descriptor takes on the development CPU, a dozen
    descriptors a MoE step; the driver's encoding (cuTensorMapEncodeTiled, in the launcher) refuses a bad
    layout all the same. The launchers and the argument binder take it as the TensorDescriptor it is."""

    def __post_init__(self) -> None:
        """Only what the layout checks leave open: an empty dim, which the encoding would refuse unnamed."""
        if not all(self.shape):
            raise ValueError(f"a tensor descriptor needs every dim non-empty, got shape {self.shape}")


def descriptor(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    """A host descriptor of all of `t`, which tma_layout (or stack_tma_layout) has passed, in `block` tiles."""
    return CheckedDescriptor(t, list(t.shape), list(t.stride()), block)


def bind_context(device: torch.device) -> None:
    """Make `device`'s CUDA context current on the calling thread, before host tensor descriptors are built.

    Triton encodes a host descriptor with the driver API (cuTensorMapEncodeTiled), which needs a current
    context, before its launcher makes one current; PyTorch binds a context to a thread only at that
    thread's first runtime call. Autograd runs backward on a thread of its own, where a backward served
    by the caching allocator may have made none: on the H100 our TMA kernels then failed in a training
    step ("Failed to create tensor map descriptor: invalid device context"; pytorch/pytorch#124565 is
    the same for plain launches). `torch.cuda.set_device` calls cudaSetDevice even for the current
    device, which binds its primary context: a cheap call, allowed under CUDA-graph capture.
    """
    if device.type == "cuda":
        # By index: set_device resolves a torch.device through five Python checks first (a tensor's CUDA
        # device always has its index).
        torch.cuda.set_device(device.index)
