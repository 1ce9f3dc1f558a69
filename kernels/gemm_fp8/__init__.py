"""gemm_fp8: a Linear layer's GEMMs in FP8, forward and backward in Triton.

    from kernels.common.fp8 import Float8Config, Format, Granularity
    from kernels.gemm_fp8 import gemm_fp8, quantize
    cfg = Float8Config(Format.HYBRID, Granularity.BLOCKWISE)
    y = gemm_fp8(x, w, config=cfg)              # x [M, K], w [N, K] in bf16: quantized per pass
    y.backward(dy)                              # dgrad and wgrad in FP8 too (E5M2 gradients: HYBRID)

    w8 = quantize(w, torch.float8_e4m3fn, Granularity.BLOCKWISE, weight=True)
    y = gemm_fp8(x, w8, config=cfg)             # a weight kept in FP8: no gradient flows to it

Any M, N and K: a partial 128-block gets its own scale, nothing is padded by the caller. No host
sync: the op runs under CUDA-graph capture.
"""

from __future__ import annotations

import torch

from kernels.common.device import check_same_device
from kernels.common.fp8 import Float8Config, Format, Granularity, quantize_rows
from kernels.gemm_fp8.kernel import (
    Fp8Tensor,
    fp8_rows_times_weight,
    fp8_token_reduction,
    quantize,
    weight_operand,
)
from kernels.grouped_gemm_fp8.kernel import QuantizedWeight

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
SUPPORTED_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _quantized_rows(x: torch.Tensor, fp8_dtype: torch.dtype, granularity: Granularity) -> Fp8Tensor:
    return Fp8Tensor(*quantize_rows(x, fp8_dtype, granularity), granularity)


def fp8_forward(a: torch.Tensor | Fp8Tensor, b: torch.Tensor | None, trans_b: bool, config: Float8Config,
                out: torch.Tensor, weight: QuantizedWeight | None = None) -> QuantizedWeight:
    """out = a @ op(b) in FP8, quantizing what is not quantized yet (`a` may be an Fp8Tensor, `weight`
    the already-quantized b); returns the quantized weight (its 128x128 blocks serve the dgrad)."""
    gran = config.granularity
    # Stored [N, K] (trans_b), the forward reduces over the weight's columns, else over its rows.
    weight = weight or QuantizedWeight.quantize(b[None], not trans_b, config.forward_dtype, gran)
    a_q = a if isinstance(a, Fp8Tensor) else _quantized_rows(a, config.forward_dtype, gran)
    fp8_rows_times_weight("fwd", a_q, weight, out)
    return weight


def fp8_dgrad(grad_out: torch.Tensor, b: torch.Tensor, trans_b: bool, config: Float8Config, grad_a: torch.Tensor,
              forward_weight: QuantizedWeight | None = None) -> None:
    """grad_a = grad_out @ op(b)^T in FP8; reuses the forward's 128x128 weight blocks when given."""
    gran = config.granularity
    blocks = forward_weight.blocks if forward_weight is not None and gran == Granularity.BLOCKWISE else None
    weight = QuantizedWeight.quantize(b[None], trans_b, config.forward_dtype, gran, blocks)
    fp8_rows_times_weight("dgrad", _quantized_rows(grad_out, config.grad_dtype, gran), weight, grad_a)


def fp8_wgrad(grad_out: torch.Tensor, a: torch.Tensor, trans_b: bool, config: Float8Config,
              grad_b: torch.Tensor) -> None:
    """grad_b = grad_out^T @ a (trans_b) or a^T @ grad_out in FP8, reducing over the tokens."""
    if trans_b:
        fp8_token_reduction(grad_out, config.grad_dtype, a, config.forward_dtype, config.granularity, grad_b)
    else:
        fp8_token_reduction(a, config.forward_dtype, grad_out, config.grad_dtype, config.granularity, grad_b)


class _GemmFp8(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, a_fp8, b_fp8, trans_b, out_dtype, config):
        rows = a.shape[0] if a is not None else a_fp8.data.shape[0]
        cols = b_fp8.data.shape[0] if b_fp8 is not None else b.shape[0 if trans_b else 1]
        device = a.device if a is not None else a_fp8.data.device
        out = torch.empty((rows, cols), dtype=out_dtype, device=device)
        weight = weight_operand(b_fp8, reduce_over_n=False) if b_fp8 is not None else None
        weight = fp8_forward(a if a_fp8 is None else a_fp8, b, trans_b, config, out, weight)
        ctx.save_for_backward(a, b)
        ctx.a_fp8, ctx.b_fp8, ctx.trans_b, ctx.config = a_fp8, b_fp8, trans_b, config
        ctx.forward_weight = weight
        return out

    @staticmethod
    def backward(ctx, grad_out):
        a, b = ctx.saved_tensors
        config = ctx.config
        dtype = a.dtype if a is not None else b.dtype
        grad_out = grad_out.to(dtype).contiguous()
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_a = torch.empty_like(a)
            if ctx.b_fp8 is not None:
                grad_q = _quantized_rows(grad_out, config.grad_dtype, config.granularity)
                fp8_rows_times_weight("dgrad", grad_q, weight_operand(ctx.b_fp8, reduce_over_n=True), grad_a)
            else:
                fp8_dgrad(grad_out, b, ctx.trans_b, config, grad_a, ctx.forward_weight)
        if ctx.needs_input_grad[1]:
            grad_b = torch.empty_like(b)
            fp8_wgrad(grad_out, a if a is not None else ctx.a_fp8.dequantize(dtype), ctx.trans_b, config, grad_b)
        ctx.forward_weight = None
        return grad_a, grad_b, None, None, None, None, None


def _check(a: torch.Tensor | Fp8Tensor, b: torch.Tensor | Fp8Tensor, trans_b: bool, config: Float8Config) -> None:
    """Refuse (ValueError, one line naming the problem) what gemm_fp8 cannot compute."""
    if not isinstance(config, Float8Config):
        raise ValueError(f"gemm_fp8: config must be a Float8Config, got {type(config).__name__}")
    for name, t in (("a", a), ("b", b)):
        if isinstance(t, Fp8Tensor):
            t.check(name, config.forward_dtype, config.granularity, weight=name == "b")
        elif not isinstance(t, torch.Tensor) or t.ndim != 2 or t.dtype not in SUPPORTED_DTYPES:
            shown = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"gemm_fp8: {name} must be a 2-D bf16/fp16 tensor or an Fp8Tensor, got {shown}")
    if isinstance(b, Fp8Tensor) and not trans_b:
        raise ValueError("gemm_fp8: a pre-quantized weight is [N, K] (a Linear weight): call with trans_b=True")
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype != b.dtype:
        raise ValueError(f"gemm_fp8: a and b must share a dtype, got {a.dtype} and {b.dtype}")
    a_data = a.data if isinstance(a, Fp8Tensor) else a
    b_data = b.data if isinstance(b, Fp8Tensor) else b
    k_of_b = b_data.shape[1] if trans_b else b_data.shape[0]
    if a_data.shape[1] != k_of_b:
        layout = "[N, K]" if trans_b else "[K, N]"
        raise ValueError(f"gemm_fp8: inner dims differ: a is {tuple(a_data.shape)}, b is {tuple(b_data.shape)} "
                         f"as {layout} (K {a_data.shape[1]} != {k_of_b})")
    check_same_device(a=a_data, b=b_data)


def gemm_fp8(
    a: torch.Tensor | Fp8Tensor,
    b: torch.Tensor | Fp8Tensor,
    trans_b: bool = True,
    out_dtype: torch.dtype | None = None,
    config: Float8Config | None = None,
) -> torch.Tensor:
    """`a @ b^T` (trans_b, b [N, K]) or `a @ b` (b [K, N]) in FP8, with autograd.

    a [M, K] and b are bf16/fp16 tensors, quantized per `config` (default E4M3 rowwise) in each
    pass, or Fp8Tensors from `quantize` (constants: no gradient flows to them). out_dtype defaults
    to the high-precision operand's dtype (bf16 if both are FP8).
    """
    config = config or Float8Config()
    _check(a, b, trans_b, config)
    a_fp8 = a if isinstance(a, Fp8Tensor) else None
    b_fp8 = b if isinstance(b, Fp8Tensor) else None
    high = [t for t in (a, b) if isinstance(t, torch.Tensor)]
    out_dtype = out_dtype or (high[0].dtype if high else torch.bfloat16)
    if out_dtype not in SUPPORTED_OUT_DTYPES:
        raise ValueError(f"gemm_fp8: out_dtype must be bf16, fp16 or fp32, got {out_dtype}")
    return _GemmFp8.apply(None if a_fp8 else a.contiguous(), None if b_fp8 else b.contiguous(), a_fp8, b_fp8,
                          trans_b, out_dtype, config)


__all__ = ["Float8Config", "Format", "Fp8Tensor", "Granularity", "fp8_dgrad", "fp8_forward", "fp8_wgrad", "gemm_fp8",
           "quantize"]
