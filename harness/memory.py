"""Activation memory: what a forward holds on the GPU for its backward."""

from __future__ import annotations

from collections.abc import Callable

import torch


def activation_bytes(forward: Callable[[], object]) -> int:
    """Peak GPU memory allocated while `forward` runs and its result (with the autograd graph it keeps) is
    alive, past what was allocated before. Call it warm: a first call's allocations (compiled kernels,
    workspaces, caches) are not the activations."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    kept = forward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del kept
    return peak
