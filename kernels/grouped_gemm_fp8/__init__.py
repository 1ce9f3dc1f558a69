"""grouped_gemm_fp8: the expert GEMMs of an MoE layer in FP8, forward and backward in Triton.

    from kernels.common.fp8 import Float8Config, Format, Granularity
    from kernels.grouped_gemm_fp8 import grouped_gemm_fp8
    cfg = Float8Config(Format.HYBRID, Granularity.BLOCKWISE)
    out = grouped_gemm_fp8(tokens, expert_weights, group_lens, config=cfg)   # bf16 in, bf16 out
    out.backward(grad)

Inputs stay in bf16/fp16; each pass quantizes what it reads (kernels/grouped_gemm_fp8/kernel.py).
Like grouped_gemm, nothing reads `group_lens` on the host: the op is CUDA-graph safe.
"""

from __future__ import annotations

import torch

from kernels.common.fp8 import Float8Config, Format, Granularity
from kernels.grouped_gemm import check_grouped_inputs
from kernels.grouped_gemm_fp8.kernel import QuantizedWeight, m_grouped_fp8, vark_fp8

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)


def _stored(b: torch.Tensor, trans_b: bool) -> tuple[torch.Tensor, bool]:
    """The weight as stored ([G, R, C], contiguous) and whether the forward reduces over its rows R."""
    return b.contiguous(), not trans_b


def fp8_forward(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, trans_b: bool, config: Float8Config, out: torch.Tensor
) -> QuantizedWeight:
    w, fwd_reduces_rows = _stored(b, trans_b)
    weight = QuantizedWeight.quantize(w, fwd_reduces_rows, config.forward_dtype, config.granularity)
    m_grouped_fp8("fwd", a, config.forward_dtype, weight, offs, config.granularity, out)
    return weight


def fp8_dgrad(
    grad_out: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, trans_b: bool, config: Float8Config,
    grad_a: torch.Tensor, forward_weight: QuantizedWeight | None = None,
) -> None:
    """grad_a = grad_out @ b_g per group; reuses the forward's 128x128 weight blocks when given."""
    w, fwd_reduces_rows = _stored(b, trans_b)
    blocks = forward_weight.blocks if forward_weight and config.granularity == Granularity.BLOCKWISE else None
    weight = QuantizedWeight.quantize(w, not fwd_reduces_rows, config.forward_dtype, config.granularity, blocks)
    m_grouped_fp8("dgrad", grad_out, config.grad_dtype, weight, offs, config.granularity, grad_a)


def fp8_wgrad(
    grad_out: torch.Tensor, a: torch.Tensor, offs: torch.Tensor, trans_b: bool, config: Float8Config,
    grad_b: torch.Tensor,
) -> None:
    """grad_b[g] = grad_out_g^T @ a_g (trans_b) or a_g^T @ grad_out_g, reducing over group g's tokens."""
    if trans_b:
        vark_fp8(grad_out, config.grad_dtype, a, config.forward_dtype, offs, config.granularity, grad_b)
    else:
        vark_fp8(a, config.forward_dtype, grad_out, config.grad_dtype, offs, config.granularity, grad_b)


class _GroupedGemmFp8(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, offs, trans_b, out_dtype, config):
        out = torch.empty((a.shape[0], b.shape[1] if trans_b else b.shape[2]), dtype=out_dtype, device=a.device)
        ctx.forward_weight = fp8_forward(a, b, offs, trans_b, config, out)
        ctx.save_for_backward(a, b, offs)
        ctx.trans_b, ctx.config = trans_b, config
        return out

    @staticmethod
    def backward(ctx, grad_out):
        a, b, offs = ctx.saved_tensors
        grad_out = grad_out.to(a.dtype).contiguous()
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_a = torch.empty_like(a)
            fp8_dgrad(grad_out, b, offs, ctx.trans_b, ctx.config, grad_a, ctx.forward_weight)
        if ctx.needs_input_grad[1]:
            grad_b = torch.empty_like(b)
            fp8_wgrad(grad_out, a, offs, ctx.trans_b, ctx.config, grad_b)
        ctx.forward_weight = None
        return grad_a, grad_b, None, None, None, None


def grouped_gemm_fp8(
    a: torch.Tensor,
    b: torch.Tensor,
    group_lens: torch.Tensor,
    group_offs: torch.Tensor | None = None,
    trans_b: bool = True,
    out_dtype: torch.dtype | None = None,
    config: Float8Config | None = None,
) -> torch.Tensor:
    """Per group g: out[rows_g] = a[rows_g] @ (b[g]^T if trans_b else b[g]) in FP8, with autograd.

    Shapes as for grouped_gemm; a and b are bf16/fp16 and are quantized per `config` (default E4M3
    rowwise). Any M per group, N and K: partial 128-blocks get their own scales, nothing is padded.
    """
    config = config or Float8Config()
    if not isinstance(config, Float8Config):
        raise ValueError(f"grouped_gemm_fp8: config must be a Float8Config, got {type(config).__name__}")
    offs = check_grouped_inputs("grouped_gemm_fp8", a, b, group_lens, group_offs, trans_b, SUPPORTED_DTYPES)
    out_dtype = out_dtype or a.dtype
    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"grouped_gemm_fp8: out_dtype must be bf16, fp16 or fp32, got {out_dtype}")
    return _GroupedGemmFp8.apply(a.contiguous(), b, offs, trans_b, out_dtype, config)


__all__ = ["Float8Config", "Format", "Granularity", "grouped_gemm_fp8"]
