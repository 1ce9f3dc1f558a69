"""What the Hopper copy engine (TMA) can read: a tensor descriptor needs a 16-byte aligned base, one
unit-stride dimension of at least 16 bytes, and every other stride a multiple of 16 bytes. Where an
operand breaks that (K = 61, an odd slice), the kernels fall back to pointer loads. And what a host
descriptor needs of the calling thread: a current CUDA context."""

from __future__ import annotations

import torch


def tma_layout(t: torch.Tensor) -> bool | None:
    """Whether TMA can read 2-D `t`: True if its rows are contiguous, False if its columns are, None if
    neither or if its base or its other stride is not a multiple of 16 bytes."""
    if t.data_ptr() % 16:
        return None
    for contiguous_dim in (1, 0):
        if t.stride(contiguous_dim) == 1:
            other = t.stride(1 - contiguous_dim)
            extent = t.shape[contiguous_dim] * t.element_size()
            if (other * t.element_size()) % 16 == 0 and extent >= 16:
                return contiguous_dim == 1
    return None


def stack_tma_layout(b: torch.Tensor) -> bool | None:
    """Whether TMA can read the 3-D weight stack b [G, N, K]: True if K is contiguous, False if N is,
    None if neither or if the base or another stride is not a multiple of 16 bytes."""
    if b.data_ptr() % 16:
        return None
    for contiguous_dim in (2, 1):
        others = [b.stride(d) * b.element_size() for d in (0, 1, 2) if d != contiguous_dim]
        if b.stride(contiguous_dim) == 1 and all(o % 16 == 0 for o in others) \
                and b.shape[contiguous_dim] * b.element_size() >= 16:
            return contiguous_dim == 2
    return None


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
        torch.cuda.set_device(device)
