"""grouped_gemm_fp8: the expert GEMMs of an MoE layer in FP8, forward and backward in Triton.

    from kernels.common.fp8 import Float8Config, Format, Granularity
    from kernels.grouped_gemm_fp8 import grouped_gemm_fp8
    cfg = Float8Config(Format.HYBRID, Granularity.BLOCKWISE)
    out = grouped_gemm_fp8(tokens, expert_weights, group_lens, config=cfg)   # bf16 in, bf16 out
    out.backward(grad)

    w8 = prequantize_weight(expert_weights, config=cfg)         # once per optimizer step
    out = grouped_gemm_fp8(tokens, expert_weights, group_lens, config=cfg, b_fp8=w8)  # every microbatch

    main_grad = torch.zeros_like(expert_weights)                # zeroed once per optimizer step
    out = grouped_gemm_fp8(tokens, expert_weights, group_lens, config=cfg, main_grad=main_grad)
    out.backward(grad)                                          # main_grad += dW; expert_weights.grad stays None

    layout = group_layout(group_offs, tokens.shape[0])          # the groups mapped once for the ops sharing them
    h = grouped_gemm_fp8(tokens, w_gate_up, group_lens, group_offs, config=cfg, layout=layout)
    out = swiglu_down_fp8(h, w_down, group_offs, cfg, layout=layout)   # kernels.moe: same tokens, same groups

Inputs stay in bf16/fp16. Each is quantized once per step into every layout its passes read
(kernels/grouped_gemm_fp8/kernel.py): the forward quantizes the tokens along K for itself and along
each group's tokens for the wgrad, and the weight both ways (the dgrad reads the second), keeping
for the backward only what a wanted gradient needs; the backward quantizes the upstream gradient
both ways in one pass. Like grouped_gemm, nothing reads `group_lens` on the host: the op is
CUDA-graph safe.
"""

from __future__ import annotations

import torch

from kernels.common.fp8 import (
    Float8Config,
    Format,
    Granularity,
    RowGroups,
    RowSource,
    TokenLayout,
    group_layout,
    quantize_both,
)
from kernels.grouped_gemm import check_grouped_inputs
from kernels.grouped_gemm_fp8.kernel import (
    ForBackward,
    QuantizedWeight,
    WeightFp8,
    check_layout,
    check_main_grad,
    check_prequantized,
    m_grouped_fp8,
    prequantize,
    vark_fp8,
    weight_operands,
)

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)


def prequantize_weight(b: torch.Tensor, trans_b: bool = True, config: Float8Config | None = None) -> WeightFp8:
    """The expert weight stack b ([G, N, K] if trans_b, else [G, K, N]) quantized for the forward and
    the dgrad under `config`, for `grouped_gemm_fp8(..., b_fp8=)`. Make it again after every update of
    b (an optimizer step): the op reads the copy as given."""
    return prequantize(b, trans_b, config or Float8Config(), 3, "b must be a [G, N, K] or [G, K, N] bf16/fp16 stack")


def fp8_forward(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, trans_b: bool, config: Float8Config, out: torch.Tensor,
    needs: tuple[bool, bool] = (False, False), b_fp8: WeightFp8 | None = None, a_glu: bool = False,
    a_source: RowSource | None = None, layout: TokenLayout | None = None,
) -> ForBackward:
    """out[rows_g] = a[rows_g] @ op(b[g]) in FP8; `needs` = (grad of a, grad of b) says what to keep;
    `b_fp8`, b already quantized (prequantize_weight), skips quantizing it. `a_glu`: a is a SwiGLU's input
    [rows, 2K] and the GEMM's A is silu(a[:, :K]) * a[:, K:], computed in its quantization (quantize_both's
    glu): an MoE layer's Down GEMM without the SwiGLU output ever written. `a_source`: the GEMM's A has
    a_source.rows.numel() rows, each a row of a read through the index (an MoE layer's GateUP GEMM on the
    tokens without their permuted copy ever written). `layout`: the groups' token layout (group_layout), made once by
    a caller for the ops that share the groups, else mapped here where a kernel reads it."""
    need_da, need_db = needs
    gran = config.granularity
    a_q = quantize_both(a, config.forward_dtype, gran, RowGroups.tokens(offs, layout), cols=need_db, glu=a_glu,
                        source=a_source)
    weight, dgrad_weight = weight_operands(b, trans_b, config.forward_dtype, gran, need_da, b_fp8)
    m_grouped_fp8("fwd", a_q.rows, weight, offs, gran, out, a_q.layout, a_q.row_index)
    return ForBackward(a_q.cols_t, dgrad_weight, a_q.layout)


def for_backward(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, trans_b: bool, config: Float8Config
) -> ForBackward:
    """What fp8_forward keeps for both gradients, quantized on its own (to time the backward alone)."""
    a_q = quantize_both(a, config.forward_dtype, config.granularity, RowGroups.tokens(offs), rows=False)
    dgrad_weight = QuantizedWeight.quantize(b.contiguous(), trans_b, config.forward_dtype, config.granularity)
    return ForBackward(a_q.cols_t, dgrad_weight, a_q.layout)


def fp8_backward(
    grad_out: torch.Tensor, saved: ForBackward, offs: torch.Tensor, trans_b: bool, config: Float8Config,
    grad_a: torch.Tensor | None, grad_b: torch.Tensor | None, accumulate_b: bool = False,
    grad_source: RowSource | None = None,
) -> None:
    """grad_a = grad_out @ b_g per group (dgrad) and grad_b[g] = grad_out_g^T @ a_g (trans_b) or
    a_g^T @ grad_out_g (wgrad, reducing over group g's tokens), each into its buffer if given;
    `accumulate_b`: grad_b[g] += the wgrad instead. `grad_source`: the output's gradient is grad_out's
    rows read through the index and scaled (an MoE layer's Down GEMM under the combine's gradient,
    never written permuted)."""
    gran = config.granularity
    groups = RowGroups.tokens(offs, saved.layout)
    g = quantize_both(grad_out, config.grad_dtype, gran, groups, rows=grad_a is not None, cols=grad_b is not None,
                      source=grad_source)
    if grad_a is not None:
        m_grouped_fp8("dgrad", g.rows, saved.dgrad_weight, offs, gran, grad_a, g.layout, g.row_index)
    if grad_b is not None:
        x, y = (g.cols_t, saved.a_cols) if trans_b else (saved.a_cols, g.cols_t)
        tokens = grad_out.shape[0] if grad_source is None else grad_source.rows.numel()
        vark_fp8(x, y, g.padded_offs, tokens, gran, grad_b, accumulate_b)


def backward_from(
    ctx, grad_out: torch.Tensor, offs: torch.Tensor, trans_b: bool, grad_a: torch.Tensor | None, need_b: bool,
    b_shape: torch.Size, grad_source: RowSource | None = None,
) -> torch.Tensor | None:
    """fp8_backward for an autograd Function whose forward kept `ctx.saved` (fp8_forward's), `ctx.config`
    and `ctx.main_grad`, both released here: grad_a into its buffer if given; b's gradient added into the
    main_grad if there is one, else written to a fresh buffer in grad_out's dtype. Returns b's gradient for
    autograd: None with a main_grad (it went into the buffer; b.grad gets nothing)."""
    main_grad, ctx.main_grad = ctx.main_grad, None
    grad_b = (grad_out.new_empty(b_shape) if main_grad is None else main_grad) if need_b else None
    fp8_backward(grad_out, ctx.saved, offs, trans_b, ctx.config, grad_a, grad_b, main_grad is not None, grad_source)
    ctx.saved = None
    return grad_b if main_grad is None else None


class _GroupedGemmFp8(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, offs, trans_b, out_dtype, config, b_fp8, main_grad, layout):
        out = torch.empty((a.shape[0], b.shape[1] if trans_b else b.shape[2]), dtype=out_dtype, device=a.device)
        ctx.saved = fp8_forward(a, b, offs, trans_b, config, out, needs=ctx.needs_input_grad[:2], b_fp8=b_fp8,
                                layout=layout)
        ctx.save_for_backward(offs)
        ctx.trans_b, ctx.config, ctx.dtype, ctx.main_grad = trans_b, config, a.dtype, main_grad
        ctx.a_shape, ctx.b_shape = a.shape, b.shape
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (offs,) = ctx.saved_tensors
        grad_out = grad_out.to(ctx.dtype).contiguous()
        grad_a = grad_out.new_empty(ctx.a_shape) if ctx.needs_input_grad[0] else None
        grad_b = backward_from(ctx, grad_out, offs, ctx.trans_b, grad_a, ctx.needs_input_grad[1], ctx.b_shape)
        return grad_a, grad_b, None, None, None, None, None, None, None


def grouped_gemm_fp8(
    a: torch.Tensor,
    b: torch.Tensor,
    group_lens: torch.Tensor,
    group_offs: torch.Tensor | None = None,
    trans_b: bool = True,
    out_dtype: torch.dtype | None = None,
    config: Float8Config | None = None,
    b_fp8: WeightFp8 | None = None,
    main_grad: torch.Tensor | None = None,
    layout: TokenLayout | None = None,
) -> torch.Tensor:
    """Per group g: out[rows_g] = a[rows_g] @ (b[g]^T if trans_b else b[g]) in FP8, with autograd.

    Shapes as for grouped_gemm; a and b are bf16/fp16 and are quantized per `config` (default E4M3
    rowwise). Any M per group, N and K: partial 128-blocks get their own scales, nothing is padded.
    `b_fp8` (prequantize_weight of this b, same config and trans_b): the forward and the dgrad read it
    instead of quantizing b; b still gets its gradient.
    `main_grad` (b's shape, contiguous, fp32 or b's dtype): the backward adds b's gradient into it,
    in the wgrad's epilogue, and leaves b.grad alone: gradient accumulation over microbatches without
    a separate add of the whole weight gradient (Megatron's and TransformerEngine's main_grad). The
    caller zeroes it after each optimizer step.
    `layout` (group_layout(offs, a.shape[0])): the groups' token layout, made once by a caller whose ops
    share the groups (an MoE layer's GateUP and swiglu_down_fp8), where each op would map them again.
    """
    config = config or Float8Config()
    if not isinstance(config, Float8Config):
        raise ValueError(f"grouped_gemm_fp8: config must be a Float8Config, got {type(config).__name__}")
    offs = check_grouped_inputs("grouped_gemm_fp8", a, b, group_lens, group_offs, trans_b, SUPPORTED_DTYPES)
    out_dtype = out_dtype or a.dtype
    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"grouped_gemm_fp8: out_dtype must be bf16, fp16 or fp32, got {out_dtype}")
    if b_fp8 is not None:
        check_prequantized("grouped_gemm_fp8", b_fp8, b, trans_b, config.forward_dtype, config.granularity)
    if main_grad is not None:
        check_main_grad("grouped_gemm_fp8", main_grad, b)
    check_layout("grouped_gemm_fp8", layout, offs, a.shape[0])
    return _GroupedGemmFp8.apply(a.contiguous(), b, offs, trans_b, out_dtype, config, b_fp8, main_grad, layout)


__all__ = ["Float8Config", "Format", "Granularity", "TokenLayout", "WeightFp8", "backward_from", "for_backward",
           "fp8_backward", "fp8_forward", "group_layout", "grouped_gemm_fp8", "prequantize_weight"]
