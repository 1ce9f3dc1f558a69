"""CUDA-graph check shared by the GPU tests: a step captured once must replay like eager mode."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def replay_and_eager(
    step: Callable[[], Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor]
) -> tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]:
    """Warm `step` up on a side stream (compiles outside the capture), capture it, refill `inputs` with
    fresh random values, replay; then run it eagerly on the same values. Returns (replayed, eager)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = step()
    with torch.no_grad():
        for t in inputs:
            t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    return replayed, step()
