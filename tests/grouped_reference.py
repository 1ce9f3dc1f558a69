"""A float64 per-expert loop: the reference every grouped-GEMM test compares with."""

from __future__ import annotations

import torch


def grouped_reference(
    a: torch.Tensor, b: torch.Tensor, lens: list[int], grad_out: torch.Tensor, trans_b: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    outs = [x @ (w.t() if trans_b else w) for x, w in zip(a64.split(lens), b64, strict=True)]
    out = torch.cat(outs)
    out.backward(grad_out.double())
    return out, a64.grad, b64.grad
