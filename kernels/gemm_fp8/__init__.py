"""gemm_fp8: a Linear layer's GEMMs in FP8, forward and backward in Triton.

    from kernels.common.fp8 import Float8Config, Format, Granularity
    from kernels.gemm_fp8 import gemm_fp8, quantize
    cfg = Float8Config(Format.HYBRID, Granularity.BLOCKWISE)
    y = gemm_fp8(x, w, config=cfg)              # x [M, K], w [N, K] in bf16: each quantized once a step
    y.backward(dy)                              # dgrad and wgrad in FP8 too (E5M2 gradients: HYBRID)

    w8 = quantize(w, torch.float8_e4m3fn, Granularity.BLOCKWISE, weight=True)
    y = gemm_fp8(x, w8, config=cfg)             # a weight kept in FP8: no gradient flows to it

    w8 = prequantize_weight(w, config=cfg)      # once per optimizer step, for every microbatch:
    y = gemm_fp8(x, w, config=cfg, b_fp8=w8)    # w is not quantized again, and still gets its gradient

    y = gemm_fp8(x, w, config=cfg, main_grad=w_main_grad)   # the wgrad adds into w_main_grad, w.grad stays None

Any M, N and K: a partial 128-block gets its own scale, nothing is padded by the caller. No host
sync: the op runs under CUDA-graph capture.
"""

from __future__ import annotations

import torch

from kernels.common.device import check_same_device
from kernels.common.fp8 import Float8Config, Format, Granularity, RowGroups, quantize_both
from kernels.gemm_fp8.kernel import Fp8Tensor, fp8_rows_times_weight, fp8_token_reduction, quantize, weight_operand
from kernels.grouped_gemm_fp8.kernel import (
    ForBackward,
    QuantizedWeight,
    WeightFp8,
    check_main_grad,
    check_prequantized,
    prequantize,
    weight_operands,
)

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
SUPPORTED_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _tokens(rows: int) -> RowGroups:
    """A dense operand's tokens: one group."""
    return RowGroups.equal(1, rows)


def prequantize_weight(w: torch.Tensor, trans_b: bool = True, config: Float8Config | None = None) -> WeightFp8:
    """The weight w ([N, K] if trans_b, else [K, N]) quantized for the forward and the dgrad under
    `config`, for `gemm_fp8(..., b_fp8=)`. Make it again after every update of w (an optimizer step):
    the op reads the copy as given."""
    return prequantize(w, trans_b, config or Float8Config(), 2, "w must be a 2-D bf16/fp16 weight")


def fp8_forward(
    a: torch.Tensor | Fp8Tensor, b: torch.Tensor | Fp8Tensor, trans_b: bool, config: Float8Config, out: torch.Tensor,
    needs: tuple[bool, bool] = (False, False), b_fp8: WeightFp8 | None = None,
) -> ForBackward:
    """out = a @ op(b) in FP8, quantizing what is not quantized yet (an Fp8Tensor b is [N, K]; `b_fp8`
    is b already quantized by prequantize_weight); `needs` = (grad of a, grad of b) says what to keep
    for the backward."""
    need_da, need_db = needs
    gran, fp8 = config.granularity, config.forward_dtype
    if isinstance(a, Fp8Tensor):
        a_rows, a_cols = a, None
        if need_db:  # b is a tensor then: the wgrad reads a's values again, along the tokens
            a_high = a.dequantize(b.dtype)
            a_cols = quantize_both(a_high, fp8, gran, _tokens(a_high.shape[0]), rows=False).cols_t
    else:
        a_q = quantize_both(a, fp8, gran, _tokens(a.shape[0]), cols=need_db)
        a_rows, a_cols = Fp8Tensor(*a_q.rows, gran), a_q.cols_t
    if isinstance(b, Fp8Tensor):
        weight = weight_operand(b, reduce_over_n=False)
        dgrad_weight = weight_operand(b, reduce_over_n=True) if need_da else None
    else:
        weight, dgrad_weight = weight_operands(b, trans_b, fp8, gran, need_da, b_fp8)
    fp8_rows_times_weight("fwd", a_rows, weight, out)
    return ForBackward(a_cols, dgrad_weight)


def for_backward(a: torch.Tensor, b: torch.Tensor, trans_b: bool, config: Float8Config) -> ForBackward:
    """What fp8_forward keeps for both gradients, quantized on its own (to time the backward alone)."""
    gran, fp8 = config.granularity, config.forward_dtype
    a_cols = quantize_both(a, fp8, gran, _tokens(a.shape[0]), rows=False).cols_t
    return ForBackward(a_cols, QuantizedWeight.quantize(b[None], trans_b, fp8, gran))


def fp8_backward(
    grad_out: torch.Tensor, saved: ForBackward, trans_b: bool, config: Float8Config,
    grad_a: torch.Tensor | None, grad_b: torch.Tensor | None, accumulate_b: bool = False,
) -> None:
    """grad_a = grad_out @ op(b)^T (dgrad) and grad_b = grad_out^T @ a (trans_b) or a^T @ grad_out
    (wgrad, reducing over the tokens), each into its buffer if given (`accumulate_b`: grad_b += the
    wgrad); the upstream gradient is quantized once, into both layouts."""
    gran = config.granularity
    g = quantize_both(grad_out, config.grad_dtype, gran, _tokens(grad_out.shape[0]), rows=grad_a is not None,
                      cols=grad_b is not None)
    if grad_a is not None:
        fp8_rows_times_weight("dgrad", Fp8Tensor(*g.rows, gran), saved.dgrad_weight, grad_a)
    if grad_b is not None:
        x, y = (g.cols_t, saved.a_cols) if trans_b else (saved.a_cols, g.cols_t)
        fp8_token_reduction(x, y, gran, grad_b, accumulate_b)


class _GemmFp8(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, a_const, b_const, trans_b, out_dtype, config, b_fp8, main_grad):
        a_op = a if a_const is None else a_const
        b_op = b if b_const is None else b_const
        rows = a.shape[0] if a is not None else a_const.data.shape[0]
        cols = b_const.data.shape[0] if b_const is not None else b.shape[0 if trans_b else 1]
        device = a.device if a is not None else a_const.data.device
        out = torch.empty((rows, cols), dtype=out_dtype, device=device)
        ctx.saved = fp8_forward(a_op, b_op, trans_b, config, out, needs=ctx.needs_input_grad[:2], b_fp8=b_fp8)
        ctx.trans_b, ctx.config, ctx.main_grad = trans_b, config, main_grad
        ctx.dtype = next((t.dtype for t in (a, b) if t is not None), out_dtype)  # of the gradients
        ctx.a_shape = a.shape if a is not None else None
        ctx.b_shape = b.shape if b is not None else None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        grad_out = grad_out.to(ctx.dtype).contiguous()
        empty = lambda shape: torch.empty(shape, dtype=ctx.dtype, device=grad_out.device)  # noqa: E731
        grad_a = empty(ctx.a_shape) if ctx.needs_input_grad[0] else None
        main_grad, ctx.main_grad = ctx.main_grad, None
        grad_b = None
        if ctx.needs_input_grad[1]:
            grad_b = empty(ctx.b_shape) if main_grad is None else main_grad
        fp8_backward(grad_out, ctx.saved, ctx.trans_b, ctx.config, grad_a, grad_b, main_grad is not None)
        ctx.saved = None
        # With main_grad, b's gradient went into the buffer: autograd gets none to add to b.grad.
        return grad_a, grad_b if main_grad is None else None, None, None, None, None, None, None, None


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
    b_fp8: WeightFp8 | None = None,
    main_grad: torch.Tensor | None = None,
) -> torch.Tensor:
    """`a @ b^T` (trans_b, b [N, K]) or `a @ b` (b [K, N]) in FP8, with autograd.

    a [M, K] and b are bf16/fp16 tensors, quantized per `config` (default E4M3 rowwise) once a step
    into the layouts its passes read, or Fp8Tensors from `quantize` (constants: no gradient flows to
    them). out_dtype defaults to the high-precision operand's dtype (bf16 if both are FP8). `b_fp8`
    (prequantize_weight of this b, same config and trans_b): the forward and the dgrad read it instead
    of quantizing b, which still gets its gradient. `main_grad` (b's shape, contiguous, fp32 or b's
    dtype): the backward adds b's gradient into it, in the wgrad's epilogue, and leaves b.grad alone
    (gradient accumulation over microbatches, Megatron's and TransformerEngine's main_grad); the
    caller zeroes it after each optimizer step.
    """
    config = config or Float8Config()
    if out_dtype is not None and out_dtype not in SUPPORTED_OUT_DTYPES:
        raise ValueError(f"gemm_fp8: out_dtype must be bf16, fp16 or fp32, got {out_dtype}")
    _check(a, b, trans_b, config)
    if b_fp8 is not None:
        if not isinstance(b, torch.Tensor):
            raise ValueError("gemm_fp8: b_fp8 goes with a bf16/fp16 b (the weight that gets the gradient)")
        check_prequantized("gemm_fp8", b_fp8, b, trans_b, config.forward_dtype, config.granularity)
    if main_grad is not None:
        if not isinstance(b, torch.Tensor):
            raise ValueError("gemm_fp8: main_grad goes with a bf16/fp16 b (the weight that gets the gradient)")
        check_main_grad("gemm_fp8", main_grad, b)
    a_const = a if isinstance(a, Fp8Tensor) else None  # FP8 constants: no gradient flows to them
    b_const = b if isinstance(b, Fp8Tensor) else None
    high = [t for t in (a, b) if isinstance(t, torch.Tensor)]
    out_dtype = out_dtype or (high[0].dtype if high else torch.bfloat16)
    return _GemmFp8.apply(None if a_const else a.contiguous(), None if b_const else b.contiguous(), a_const,
                          b_const, trans_b, out_dtype, config, b_fp8, main_grad)


__all__ = [
    "Float8Config",
    "Format",
    "Fp8Tensor",
    "Granularity",
    "for_backward",
    "fp8_backward",
    "fp8_forward",
    "gemm_fp8",
    "prequantize_weight",
    "quantize",
]
