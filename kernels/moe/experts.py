"""An MoE layer's experts for a given routing: permute -> GateUP grouped GEMM -> SwiGLU -> Down grouped
GEMM -> unpermute, forward and backward, bf16/fp16 or FP8; kernels, launchers and autograd Functions as one
story (kernels/moe/mlp.py's MoEMLP puts the router in front).

    from kernels.moe import ExpertWeightsFp8, moe_experts
    out = moe_experts(x, routing.expert_ids, routing.probs, w_gate_up, w_down, fp8=Float8Config())
    w8 = ExpertWeightsFp8.of(w_gate_up, w_down, Float8Config())   # once per optimizer step, then per microbatch:
    out = moe_experts(x, routing.expert_ids, routing.probs, w_gate_up, w_down, fp8=Float8Config(), weights_fp8=w8)

The SwiGLU is its own pair of kernels (`_swiglu_fwd_kernel`: silu(gate) * up in fp32; `_swiglu_bwd_kernel`
recomputing silu from the saved GateUP output). On the FP8 path it is computed inside the quantization of
the Down GEMM's input instead (`_SwiGLUDownFp8`, quantize_both's glu): its output is never written. Nothing
reads the routing on the host (CUDA-graph safe).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.common.device import cdiv
from kernels.common.fp8 import Float8Config, Granularity, RowSource, TokenLayout, group_layout
from kernels.common.launch import fast_launch
from kernels.grouped_gemm import grouped_gemm
from kernels.grouped_gemm_fp8 import WeightFp8, backward_from, fp8_forward, prequantize_weight
from kernels.grouped_gemm_fp8.kernel import check_layout, check_main_grad, check_prequantized
from kernels.moe.permute import gather_rows, permute, scatter_rows, sort_by_expert, unpermute

# 16-byte accesses of bf16: 8 a thread over 1024 columns, 4 rows a program.
SWIGLU_BLOCK_I = 1024
SWIGLU_ROWS = 4
SWIGLU_WARPS = 4
# The weighted backward walks each row's whole width (for its dot) in steps of 8 rows x 256 columns: a warp holds
# whole rows, so the dot is summed within warps. On [4, 1024] steps Triton 3.6 spread each row over the 4 warps
# (5 barriers and 155 registers a thread against 64): 0.88 ms on SonicMoE's rows, twice the unweighted kernel.
WEIGHTED_ROWS = 8
WEIGHTED_BLOCK_I = 256


@triton.jit
def _swiglu_tile(h_ptr, R, I, col0, ROWS: tl.constexpr, BLOCK_I: tl.constexpr):
    """The program's rows and columns [col0, col0 + BLOCK_I): their offsets into an [R, I] tensor, their mask,
    their offsets into h's gate half, and gate and up in fp32."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = col0 + tl.arange(0, BLOCK_I)
    mask = (rows < R)[:, None] & (cols < I)[None, :]
    base = rows.to(tl.int64)[:, None] * (2 * I) + cols[None, :]
    gate = tl.load(h_ptr + base, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(h_ptr + base + I, mask=mask, other=0.0).to(tl.float32)
    return rows.to(tl.int64)[:, None] * I + cols[None, :], mask, base, gate, up


@fast_launch
@triton.jit
def _swiglu_fwd_kernel(h_ptr, out_ptr, R, I, ROWS: tl.constexpr, BLOCK_I: tl.constexpr):
    """out[r] = silu(h[r, :I]) * h[r, I:] in fp32, for ROWS rows and BLOCK_I columns a program."""
    offsets, mask, _, gate, up = _swiglu_tile(h_ptr, R, I, tl.program_id(1) * BLOCK_I, ROWS, BLOCK_I)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


@fast_launch
@triton.jit
def _swiglu_bwd_kernel(h_ptr, grad_out_ptr, grad_h_ptr, weight_ptr, src_ptr, dot_ptr, R, I, ROWS: tl.constexpr,
                       BLOCK_I: tl.constexpr, WEIGHTED: tl.constexpr):
    """grad_h[r, :I] = g * up * silu'(gate), grad_h[r, I:] = g * silu(gate), with g = grad_out[r], for ROWS rows
    and BLOCK_I columns a program. WEIGHTED: g = weight[r] * grad_out[r] (0 where src[r] < 0: a row no pair
    fills, whose weight is unset), a program takes its rows' whole width, and dot[1 + r] = <grad_out[r],
    silu(gate) * up> (0 for such a row; dot[0] = 0, for pairs that have no row)."""
    if WEIGHTED:
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        filled = (rows < R) & (tl.load(src_ptr + rows, mask=rows < R, other=-1) >= 0)
        weight = tl.where(filled, tl.load(weight_ptr + rows, mask=filled, other=0.0).to(tl.float32), 0.0)
        dot = tl.zeros((ROWS,), tl.float32)
        first, last = 0, I
    else:
        first = tl.program_id(1) * BLOCK_I
        last = first + BLOCK_I
    for col0 in range(first, last, BLOCK_I):
        offsets, mask, base, gate, up = _swiglu_tile(h_ptr, R, I, col0, ROWS, BLOCK_I)
        grad = tl.load(grad_out_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        sig = tl.sigmoid(gate)
        silu = gate * sig
        if WEIGHTED:
            dot += tl.sum(grad * silu * up, axis=1)
            grad = grad * weight[:, None]
        dtype = grad_h_ptr.dtype.element_ty
        tl.store(grad_h_ptr + base, (grad * up * (sig + silu * (1.0 - sig))).to(dtype), mask=mask)
        tl.store(grad_h_ptr + base + I, (grad * silu).to(dtype), mask=mask)
    if WEIGHTED:
        tl.store(dot_ptr + 1 + rows, tl.where(filled, dot, 0.0), mask=rows < R)
        if tl.program_id(0) == 0:
            tl.store(dot_ptr, 0.0)


def _swiglu_grid(R: int, I: int) -> tuple[int, int]:
    return cdiv(R, SWIGLU_ROWS), cdiv(I, SWIGLU_BLOCK_I)


def swiglu_forward(h: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [R, I] = silu(h[:, :I]) * h[:, I:] for h [R, 2I], into the given buffer."""
    R, I = out.shape
    if R:
        _swiglu_fwd_kernel[_swiglu_grid(R, I)](h, out, R, I, ROWS=SWIGLU_ROWS, BLOCK_I=SWIGLU_BLOCK_I,
                                               num_warps=SWIGLU_WARPS)
    return out


def swiglu_backward(h: torch.Tensor, grad_out: torch.Tensor, grad_h: torch.Tensor | None = None) -> torch.Tensor:
    """grad_h [R, 2I] of swiglu(h) for its output's gradient grad_out [R, I] (into grad_h if given)."""
    R, I = h.shape[0], h.shape[1] // 2
    if grad_h is None:
        grad_h = torch.empty_like(h)
    if R:
        _swiglu_bwd_kernel[_swiglu_grid(R, I)](h, grad_out.contiguous(), grad_h, h, h, h, R, I, ROWS=SWIGLU_ROWS,
                                               BLOCK_I=SWIGLU_BLOCK_I, WEIGHTED=False, num_warps=SWIGLU_WARPS)
    return grad_h


def weighted_swiglu_backward(
    h: torch.Tensor, grad_out: torch.Tensor, weight: torch.Tensor, sources: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """For out[r] = weight[r] * swiglu(h[r]) (rows with sources[r] < 0 left out): h's gradient [R, 2I] and the
    weights' [R + 1], shifted by one (entry 1 + r is row r's <grad_out[r], swiglu(h[r])>, entry 0 is 0, so that
    a pair without a row, -1, reads 0 at index 0), for grad_out [R, I]: one read of h and grad_out."""
    R, I = h.shape[0], h.shape[1] // 2
    grad_h = torch.empty_like(h)
    dots = torch.empty(R + 1, dtype=torch.float32, device=h.device)
    if R:
        _swiglu_bwd_kernel[(cdiv(R, WEIGHTED_ROWS),)](h, grad_out.contiguous(), grad_h, weight, sources, dots, R, I,
                                                      ROWS=WEIGHTED_ROWS, BLOCK_I=WEIGHTED_BLOCK_I, WEIGHTED=True,
                                                      num_warps=SWIGLU_WARPS)
    else:
        dots.zero_()
    return grad_h, dots


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h):
        ctx.save_for_backward(h)
        return swiglu_forward(h, h.new_empty((h.shape[0], h.shape[1] // 2)))

    @staticmethod
    def backward(ctx, grad_out):
        (h,) = ctx.saved_tensors
        return swiglu_backward(h, grad_out)


class _PermutedGemmFp8(torch.autograd.Function):
    """An MoE layer's GateUP GEMM in FP8 on the tokens in expert order, never written permuted: rowwise, the
    GEMM reads the tokens' own quantized rows through the order's sources (quantize_both's row_index), and the
    wgrad's transposed layout is quantized through them; other granularities quantize both layouts through
    them. The backward's dgrad gives each row's gradient; each token's is the sum of its rows' (permute's
    backward)."""

    @staticmethod
    def forward(ctx, x, w, order, config, w_fp8, main_grad, layout):
        out = x.new_empty((order.sources.numel(), w.shape[1]))
        ctx.saved = fp8_forward(x, w, order.group_offs, True, config, out, needs=ctx.needs_input_grad[:2],
                                b_fp8=w_fp8, a_source=RowSource(order.sources), layout=layout)
        ctx.order, ctx.config, ctx.w_shape, ctx.main_grad = order, config, w.shape, main_grad
        ctx.x_shape, ctx.dtype = x.shape, x.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        order = ctx.order
        grad_out = grad_out.to(ctx.dtype).contiguous()
        need_x, need_w = ctx.needs_input_grad[:2]
        grad_rows = grad_out.new_empty((order.sources.numel(), ctx.x_shape[1])) if need_x else None
        grad_w = backward_from(ctx, grad_out, order.group_offs, True, grad_rows, need_w, ctx.w_shape)
        ctx.order = None
        grad_x = gather_rows(grad_rows, order.row_map.rows, None, grad_out.new_empty(ctx.x_shape)) if need_x else None
        return grad_x, grad_w, None, None, None, None, None


def probs_grad_from_rows(config: Float8Config) -> bool:
    """Whether the FP8 Down GEMM's combine takes the probabilities' gradient from the dgrad's unweighted rows in
    the SwiGLU backward (rowwise, blockwise) rather than from its kept output y (tensorwise: one scale serves
    both layouts of the gradient, so its rows cannot drop the probabilities). Against float64, E4M3, skewed
    routing: that gradient 22.4-25.7 dB from the rows (24.0-25.8 from y), x's 23.2-24.5 either way."""
    return config.granularity != Granularity.TENSORWISE


class _SwiGLUDownFp8(torch.autograd.Function):
    """The Down GEMM in FP8 on swiglu(h): the SwiGLU is computed in the quantization of the GEMM's input
    (quantize_both's glu, both layouts: the forward's rows and the wgrad's transposed groups), so its bf16
    output is neither written nor read back; the backward's dgrad gives the SwiGLU output's gradient, which
    swiglu_backward takes to h's.

    With an ExpertOrder, the combine (unpermute) too: out[t] = sum_k probs[t, k] * y[row(t, k)], and the
    backward quantizes each row's gradient probs[t, k] * grad_out[t] straight from grad_out through the
    order's sources, so it is never written permuted (rowwise, the dgrad reads grad_out's own quantized rows
    through the sources, quantize_both's row_index). probs' gradient is <grad_out[t], y[row]> =
    <grad_out[t] @ w_down, swiglu(h[row])>: rowwise and blockwise, the dgrad reads the rows unweighted
    (RowSource's weighted_rows=False; the wgrad's transposed layout keeps the probabilities) and the SwiGLU
    backward applies each row's probability and takes that dot from what it reads anyway, so y (R x H) is
    neither kept nor read again; tensorwise (one scale for both layouts) keeps y and takes the dot from it."""

    @staticmethod
    def forward(ctx, h, w, probs, offs, config, w_fp8, main_grad, order, layout):
        y = h.new_empty((h.shape[0], w.shape[1]))
        ctx.saved = fp8_forward(h, w, offs, True, config, y, needs=ctx.needs_input_grad[:2], b_fp8=w_fp8,
                                a_glu=True, layout=layout)
        ctx.config, ctx.w_shape, ctx.main_grad, ctx.order = config, w.shape, main_grad, order
        if order is None:
            ctx.save_for_backward(h, offs, None, None)
            return y
        out = gather_rows(y, order.row_map.rows, probs, y.new_empty((order.row_map.rows.shape[0], y.shape[1])))
        ctx.probs_from_rows = probs_grad_from_rows(config)
        keep_y = ctx.needs_input_grad[2] and not ctx.probs_from_rows
        ctx.save_for_backward(h, offs, probs, y if keep_y else None)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        h, offs, probs, y = ctx.saved_tensors
        order = ctx.order
        grad_out = grad_out.to(h.dtype).contiguous()
        need_h, need_w, need_probs = ctx.needs_input_grad[:3]
        grad_probs = None
        if y is not None:
            grad_probs = torch.empty(order.row_map.rows.shape, dtype=probs.dtype, device=probs.device)
            scatter_rows(grad_out, order.row_map, probs, None, y, grad_probs)
        from_rows = order is not None and ctx.probs_from_rows
        grad_a = h.new_empty((h.shape[0], h.shape[1] // 2)) if need_h or (from_rows and need_probs) else None
        source = None if order is None else RowSource(order.sources, order.permuted_probs, weighted_rows=not from_rows)
        grad_w = backward_from(ctx, grad_out, offs, True, grad_a, need_w, ctx.w_shape, source)
        ctx.order = None
        grad_h = None
        if from_rows and grad_a is not None:  # grad_a is each row's gradient before its probability
            grad_h, dots = weighted_swiglu_backward(h, grad_a, order.permuted_probs, order.sources)
            if need_probs:
                pairs = order.row_map.rows
                grad_probs = dots.index_select(0, (pairs + 1).view(-1)).view(pairs.shape).to(probs.dtype)
        elif need_h:
            grad_h = swiglu_backward(h, grad_a)
        return grad_h if need_h else None, grad_w, grad_probs, None, None, None, None, None, None


def swiglu_down_fp8(h: torch.Tensor, w_down: torch.Tensor, group_offs: torch.Tensor, config: Float8Config,
                    w_fp8: WeightFp8 | None = None, main_grad: torch.Tensor | None = None,
                    layout: TokenLayout | None = None) -> torch.Tensor:
    """The Down GEMM in FP8 on swiglu(h), with autograd to h and w_down: h [R, 2I] (the GateUP GEMM's output,
    gate half first, rows grouped by expert at `group_offs`, int64 [E + 1] on the device), w_down [E, H, I].
    The SwiGLU is computed inside the quantization of the GEMM's input and never written. `w_fp8`: w_down
    quantized once per optimizer step (prequantize_weight, same config); `main_grad`: a buffer w_down's
    gradient adds into (as grouped_gemm_fp8's); `layout`: the groups' token layout, group_layout(group_offs,
    rows), the one the GateUP GEMM before was given (h holds its rows, in its groups): mapped once for both."""
    if not isinstance(config, Float8Config):
        raise ValueError(f"swiglu_down_fp8: config must be a Float8Config, got {type(config).__name__}")
    if h.dtype != w_down.dtype:
        raise ValueError(f"swiglu_down_fp8: h and w_down must share a dtype, got {h.dtype} and {w_down.dtype}")
    if h.ndim != 2 or h.shape[1] % 2 or w_down.ndim != 3 or h.shape[1] // 2 != w_down.shape[2]:
        raise ValueError(f"swiglu_down_fp8: h must be [rows, 2 * I] and w_down [E, H, I], got {list(h.shape)} "
                         f"and {list(w_down.shape)}")
    if group_offs.ndim != 1 or group_offs.numel() != w_down.shape[0] + 1:
        raise ValueError(f"swiglu_down_fp8: group_offs must be [E + 1] = [{w_down.shape[0] + 1}], got "
                         f"{list(group_offs.shape)}")
    if w_fp8 is not None:
        check_prequantized("swiglu_down_fp8", w_fp8, w_down, True, config.forward_dtype, config.granularity)
    if main_grad is not None:
        check_main_grad("swiglu_down_fp8", main_grad, w_down)
    check_layout("swiglu_down_fp8", layout, group_offs, h.shape[0])
    return _SwiGLUDownFp8.apply(h.contiguous(), w_down, None, group_offs, config, w_fp8, main_grad, None, layout)


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """silu(h[:, :I]) * h[:, I:] for h [R, 2I] (the GateUP GEMM's output, gate half first), with autograd."""
    if h.ndim != 2 or h.shape[1] % 2:
        raise ValueError(f"swiglu: h must be [rows, 2 * I], got {list(h.shape)}")
    return _SwiGLU.apply(h.contiguous())


@dataclass(frozen=True)
class ExpertWeightsFp8:
    """An MoE layer's two expert weight stacks quantized for the forward and the dgrad, for a gradient
    accumulation loop: made once per optimizer step and handed to every microbatch (`weights_fp8=`),
    which then quantizes no weight; the bf16 stacks still get their gradients. Stale after the weights
    change: make it again after each optimizer step."""

    gate_up: WeightFp8
    down: WeightFp8

    @classmethod
    def of(cls, w_gate_up: torch.Tensor, w_down: torch.Tensor, config: Float8Config) -> ExpertWeightsFp8:
        return cls(prequantize_weight(w_gate_up, True, config), prequantize_weight(w_down, True, config))


def moe_experts(x: torch.Tensor, expert_ids: torch.Tensor, probs: torch.Tensor, w_gate_up: torch.Tensor,
                w_down: torch.Tensor, fp8: Float8Config | None = None,
                weights_fp8: ExpertWeightsFp8 | None = None,
                main_grads: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """An MoE layer's experts for a given routing (MoEMLP past its router): permute -> GateUP ->
    SwiGLU -> Down -> unpermute, with autograd to x, probs and both weight stacks. x [T, H]; expert_ids
    and probs [T, topk]; w_gate_up [E, 2I, H] (gate rows, then up rows); w_down [E, H, I]; fp8: the expert
    GEMMs in FP8 under that config (None: in x's dtype); weights_fp8: both stacks already quantized under
    it (ExpertWeightsFp8.of), read instead of quantizing them; main_grads: (gate_up's, down's) gradient
    accumulation buffers (FP8 only) the wgrads add into, leaving the stacks' .grad alone (Megatron's and
    TransformerEngine's main_grad; the caller zeroes them after each optimizer step)."""
    if w_gate_up.ndim != 3 or w_gate_up.shape[1] % 2 or w_down.ndim != 3:
        raise ValueError(f"moe_experts: w_gate_up must be [E, 2I, H] and w_down [E, H, I], got "
                         f"{list(w_gate_up.shape)} and {list(w_down.shape)}")
    E, I = w_gate_up.shape[0], w_gate_up.shape[1] // 2
    if tuple(w_down.shape) != (E, w_gate_up.shape[2], I):
        raise ValueError(f"moe_experts: w_down must be [E, H, I] = {[E, w_gate_up.shape[2], I]}, got "
                         f"{list(w_down.shape)}")
    if x.ndim != 2 or x.shape[1] != w_gate_up.shape[2] or x.dtype != w_gate_up.dtype:
        raise ValueError(f"moe_experts: x must be [T, H={w_gate_up.shape[2]}] in the weights' {w_gate_up.dtype}, got "
                         f"{x.dtype} {list(x.shape)}")
    if expert_ids.ndim != 2 or expert_ids.shape[0] != x.shape[0]:
        raise ValueError(f"moe_experts: expert_ids must be [T={x.shape[0]}, topk], got {list(expert_ids.shape)}")
    if fp8 is not None and x.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"moe_experts: the FP8 experts take bfloat16 or float16 tokens, got {x.dtype}")
    if weights_fp8 is not None:
        if fp8 is None:
            raise ValueError("moe_experts: weights_fp8 goes with an fp8 config (the one it was quantized under)")
        if not isinstance(weights_fp8, ExpertWeightsFp8):
            raise ValueError(f"moe_experts: weights_fp8 must be an ExpertWeightsFp8, got {type(weights_fp8).__name__}")
        for name, w8, w in (("gate_up", weights_fp8.gate_up, w_gate_up), ("down", weights_fp8.down, w_down)):
            check_prequantized(f"moe_experts ({name})", w8, w, True, fp8.forward_dtype, fp8.granularity)
    if main_grads is not None:
        if fp8 is None:
            raise ValueError("moe_experts: main_grads go with an fp8 config (the bf16 experts accumulate in .grad)")
        if not isinstance(main_grads, tuple) or len(main_grads) != 2:
            raise ValueError("moe_experts: main_grads must be a (gate_up, down) pair of buffers")
        for name, buffer, w in (("gate_up", main_grads[0], w_gate_up), ("down", main_grads[1], w_down)):
            check_main_grad(f"moe_experts ({name})", buffer, w)
    if fp8 is None:
        p = permute(x, expert_ids, num_experts=E)
        h = grouped_gemm(p.permuted, w_gate_up, p.group_lens, p.group_offs)
        y = grouped_gemm(swiglu(h), w_down, p.group_lens, p.group_offs)
        return unpermute(y, p.row_map, probs)
    # FP8: the tokens are quantized in expert order straight from x, and the combine's gradient straight
    # from the output's: neither is written permuted.
    order = sort_by_expert(expert_ids, probs, num_experts=E)
    gate_up_fp8, down_fp8 = (weights_fp8.gate_up, weights_fp8.down) if weights_fp8 else (None, None)
    gate_up_grad, down_grad = main_grads or (None, None)
    # The GateUP GEMM's rows in expert order and the Down GEMM's (its output's) are the same rows in the same
    # groups: their token layout mapped once for both, forward and backward.
    layout = group_layout(order.group_offs, order.sources.numel())
    h = _PermutedGemmFp8.apply(x.contiguous(), w_gate_up, order, fp8, gate_up_fp8, gate_up_grad, layout)
    return _SwiGLUDownFp8.apply(h, w_down, probs.contiguous(), order.group_offs, fp8, down_fp8, down_grad, order,
                                layout)
