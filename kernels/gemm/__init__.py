"""gemm: bf16/fp16 matrix product with fp32 accumulation, forward and backward in Triton.

    from kernels.gemm import gemm
    y = gemm(x, weight, trans_b=True)     # x [M, K], weight [N, K]: a Linear layer
    y.backward(dy)                         # dgrad and wgrad through the same kernel
"""

from __future__ import annotations

import torch

from kernels.gemm.kernel import matmul
from kernels.gemm.tuning import config_for


def _op(t: torch.Tensor, trans: bool) -> torch.Tensor:
    return t.t() if trans else t


def _layer_matmul(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None,
                  out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """matmul(a, b) as one pass of the layer whose weight is `weight` (gemm's b, whichever pass): the tuned
    table's entry of that layer, where it splits the bucket by layer. Operands matmul refuses reach it
    unconfigured, for its one-line error."""
    config = None
    if a.ndim == 2 and b.ndim == 2 and weight.ndim == 2:
        config = config_for(a.shape[0], b.shape[1], a.shape[1], tuple(weight.shape))
    return matmul(a, b, out=out, out_dtype=out_dtype, config=config)


def gemm_forward(
    a: torch.Tensor,
    b: torch.Tensor,
    trans_a: bool = False,
    trans_b: bool = False,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`op(a) @ op(b)`, op transposing where asked (as a view: no copy)."""
    return _layer_matmul(_op(a, trans_a), _op(b, trans_b), b, out=out, out_dtype=out_dtype)


def gemm_backward(
    grad_out: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    trans_a: bool = False,
    trans_b: bool = False,
    grad_a: torch.Tensor | None = None,
    grad_b: torch.Tensor | None = None,
    need_grad_a: bool = True,
    need_grad_b: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of `op(a) @ op(b)`: dgrad `dO @ op(b)^T` and wgrad `op(a)^T @ dO`, shaped like a and b.

    Gradients are computed in the operands' precision (grad_out is cast to it if needed) and written
    into grad_a / grad_b when given.
    """
    grad_out = grad_out.to(a.dtype)
    if need_grad_a:
        if grad_a is None:
            grad_a = torch.empty_like(a)
        # d op(a) = dO @ op(b)^T; writing through op(grad_a) puts it in a's layout.
        _layer_matmul(grad_out, _op(b, trans_b).t(), b, out=_op(grad_a, trans_a))
    if need_grad_b:
        if grad_b is None:
            grad_b = torch.empty_like(b)
        _layer_matmul(_op(a, trans_a).t(), grad_out, b, out=_op(grad_b, trans_b))
    return grad_a, grad_b


class _Gemm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, trans_a, trans_b, out_dtype):
        ctx.save_for_backward(a, b)
        ctx.trans = (trans_a, trans_b)
        return gemm_forward(a, b, trans_a, trans_b, out_dtype=out_dtype)

    @staticmethod
    def backward(ctx, grad_out):
        a, b = ctx.saved_tensors
        trans_a, trans_b = ctx.trans
        grad_a, grad_b = gemm_backward(
            grad_out, a, b, trans_a, trans_b,
            need_grad_a=ctx.needs_input_grad[0], need_grad_b=ctx.needs_input_grad[1],
        )
        return grad_a, grad_b, None, None, None


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    trans_a: bool = False,
    trans_b: bool = False,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`op(a) @ op(b)` with autograd. a, b: 2-D bf16/fp16 tensors of any strides on one device.

    trans_b=True takes b as [N, K] (a Linear weight). out_dtype defaults to the operands' dtype.
    """
    return _Gemm.apply(a, b, trans_a, trans_b, out_dtype)


__all__ = ["gemm", "gemm_backward", "gemm_forward"]
