"""grouped_gemm_fp8: the FP8 passes of the expert GEMMs, over the shared grouped kernels.

Each operand is quantized once per training step into every layout its passes read (fp8 operands
K-major, the reduction dim contiguous, as wgmma wants; `quantize_both` of kernels/common/fp8.py
writes both from one read), and the shared M-grouped or variable-K kernel gets strided scale views:

    pass    reduction   A operand (rows)          B operand (per group)
    fwd     K           a, along K                b as [N, K]
    dgrad   N           grad_out, along N         b as [K, N]
    wgrad   tokens      grad_out^T, per group     a^T, per group

On Hopper the passes whose bucket holds WS 1 run the warp-specialized kernel of
kernels/common/blockwise_ws.py instead (the wgrad as its token reduction) where the config means its tile.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.common import blockwise_ws
from kernels.common.device import cdiv
from kernels.common.fp8 import (
    BLOCK,
    Float8Config,
    Granularity,
    RowGroups,
    TokenLayout,
    layout_blocks,
    quantize_blocks_2d,
    quantize_both,
)
from kernels.common.scales import Scales
from kernels.common.tiles import TileConfig
from kernels.grouped_gemm.kernel import VarKScales, grouped_mm, grouped_mm_vark
from kernels.grouped_gemm_fp8.tuning import config_for


@dataclass(frozen=True)
class QuantizedWeight:
    """An expert weight quantized for one pass: `data` is [G, out, red] (red contiguous) plus its scales.

    `strides` index `scale` as [group, out, k_block]; `out_div` maps an output index to its scale
    row (128 for 128x128 blocks).
    """

    data: torch.Tensor
    scale: torch.Tensor
    strides: tuple[int, int, int]
    out_div: int = 1

    @classmethod
    def both(
        cls, w: torch.Tensor, fp8_dtype: torch.dtype, granularity: Granularity, over_cols: bool = True,
        over_rows: bool = True,
        blocks: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor] | None = None,
    ) -> tuple[QuantizedWeight | None, QuantizedWeight | None]:
        """`w`, stored [G, R, C] contiguous, quantized for the passes that reduce over C (the stored rows
        are K-major already) and over R (quantized column-wise, written transposed), each if asked for:
        the forward's operand and the dgrad's come out of one quantization (blockwise: one read of w;
        rowwise and tensorwise: an amax pass and a cast pass)."""
        G, R, C = w.shape
        if granularity == Granularity.BLOCKWISE:
            q, qt, s = blocks or quantize_blocks_2d(w, fp8_dtype, rows=over_cols, cols_t=over_rows)
            # s is indexed [g, row block, col block]; out is R (reducing over C) or C.
            return (cls(q, s, s.stride(), 128) if over_cols else None,
                    cls(qt, s, (s.stride(0), s.stride(2), s.stride(1)), 128) if over_rows else None)
        tensorwise = granularity == Granularity.TENSORWISE
        both = quantize_both(w.reshape(G * R, C), fp8_dtype, granularity, RowGroups.equal(G, R), rows=over_cols,
                             cols=over_rows, tensor_per_group=True)
        along_cols = along_rows = None
        if over_cols:
            q, s = both.rows
            along_cols = cls(q.view(G, R, C), s, (1, 0, 0) if tensorwise else (R, 1, 0))
        if over_rows:
            qt, s = both.cols_t
            padded_rows = cdiv(R, 128) * 128  # each expert's rows start on a 128 boundary
            # [G, C(out), R(red)], red contiguous; the zero padding past R is never read.
            data = qt.unflatten(1, (G, padded_rows)).permute(1, 0, 2)[:, :, :R]
            along_rows = cls(data, s, (1, 0, 0) if tensorwise else (s.stride(0), s.stride(1), 0))
        return along_cols, along_rows

    @classmethod
    def quantize(
        cls, w: torch.Tensor, reduce_over_rows: bool, fp8_dtype: torch.dtype, granularity: Granularity,
        blocks: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor] | None = None,
    ) -> QuantizedWeight:
        """`w` ([G, R, C]) quantized for one pass: reducing over R (reduce_over_rows) or over C."""
        along_cols, along_rows = cls.both(w, fp8_dtype, granularity, not reduce_over_rows, reduce_over_rows, blocks)
        return along_rows if reduce_over_rows else along_cols

    @classmethod
    def pair(
        cls, w: torch.Tensor, fwd_reduces_rows: bool, fp8_dtype: torch.dtype, granularity: Granularity, dgrad: bool,
    ) -> tuple[QuantizedWeight, QuantizedWeight | None]:
        """The forward's operand and, if `dgrad`, the dgrad's (which reduces over the other dim)."""
        along_cols, along_rows = cls.both(w, fp8_dtype, granularity, over_cols=dgrad or not fwd_reduces_rows,
                                          over_rows=dgrad or fwd_reduces_rows)
        forward, other = (along_rows, along_cols) if fwd_reduces_rows else (along_cols, along_rows)
        return forward, other if dgrad else None


@dataclass(frozen=True)
class WeightFp8:
    """A weight (a Linear's [N, K] or an expert stack [G, N, K]; [K, N] / [G, K, N] without trans_b)
    quantized for the forward and the dgrad, once: a training loop that accumulates gradients over
    microbatches quantizes its weights once per optimizer step and hands every microbatch the same copy
    (`b_fp8=`), where each step would otherwise quantize them again; the bf16 weight still gets its
    gradient. The caller owns the copy: after an optimizer step it is stale and must be made again (the
    ops cannot tell without reading the weight, and keep no state of their own)."""

    forward: QuantizedWeight
    dgrad: QuantizedWeight
    shape: tuple[int, ...]
    trans_b: bool
    fp8_dtype: torch.dtype
    granularity: Granularity

    @classmethod
    def of(cls, b: torch.Tensor, trans_b: bool, fp8_dtype: torch.dtype, granularity: Granularity) -> WeightFp8:
        """b (2-D, or a 3-D expert stack, bf16/fp16) quantized for the forward and the dgrad."""
        forward, dgrad = weight_operands(b.detach(), trans_b, fp8_dtype, granularity, need_dgrad=True)
        return cls(forward, dgrad, tuple(b.shape), trans_b, fp8_dtype, granularity)

    def check(self, op: str, b: torch.Tensor, trans_b: bool, fp8_dtype: torch.dtype, granularity: Granularity) -> None:
        """Refuse (ValueError, one line) a copy made for another weight shape, layout or config."""
        if self.shape != tuple(b.shape) or self.trans_b != trans_b:
            raise ValueError(f"{op}: b_fp8 is of a {list(self.shape)} weight with trans_b={self.trans_b}, "
                             f"b is {list(b.shape)} with trans_b={trans_b}")
        if (self.fp8_dtype, self.granularity) != (fp8_dtype, granularity):
            raise ValueError(f"{op}: b_fp8 is {self.fp8_dtype} {self.granularity.value}, the config wants "
                             f"{fp8_dtype} {granularity.value}")


def weight_operands(
    b: torch.Tensor, trans_b: bool, fp8_dtype: torch.dtype, granularity: Granularity, need_dgrad: bool,
    b_fp8: WeightFp8 | None = None,
) -> tuple[QuantizedWeight, QuantizedWeight | None]:
    """b (2-D, or a 3-D expert stack) as the forward's B operand and, if `need_dgrad`, the dgrad's: read
    from `b_fp8` when given, else quantized now, both from one quantization."""
    if b_fp8 is not None:
        return b_fp8.forward, b_fp8.dgrad if need_dgrad else None
    stack = b.contiguous()
    stack = stack[None] if stack.ndim == 2 else stack
    # Stored [.., N, K] (trans_b), the forward reduces over the weight's columns, else over its rows.
    return QuantizedWeight.pair(stack, not trans_b, fp8_dtype, granularity, need_dgrad)


def prequantize(b: object, trans_b: bool, config: Float8Config, ndim: int, expected: str) -> WeightFp8:
    """The ops' `prequantize_weight`: b checked to be an `ndim`-D bf16/fp16 weight (else a ValueError
    saying `expected`), then quantized for the forward and the dgrad under `config`."""
    if not isinstance(b, torch.Tensor) or b.ndim != ndim or b.dtype not in (torch.bfloat16, torch.float16):
        shown = f"{b.dtype} {tuple(b.shape)}" if isinstance(b, torch.Tensor) else type(b).__name__
        raise ValueError(f"prequantize_weight: {expected}, got {shown}")
    return WeightFp8.of(b, trans_b, config.forward_dtype, config.granularity)


def check_prequantized(
    op: str, b_fp8: object, b: torch.Tensor, trans_b: bool, fp8_dtype: torch.dtype, granularity: Granularity
) -> None:
    """Refuse (ValueError, one line) a `b_fp8` that is not prequantize_weight of this b under this config."""
    if not isinstance(b_fp8, WeightFp8):
        raise ValueError(f"{op}: b_fp8 must come from prequantize_weight, got {type(b_fp8).__name__}")
    b_fp8.check(op, b, trans_b, fp8_dtype, granularity)


def check_main_grad(op: str, main_grad: object, b: torch.Tensor) -> None:
    """Refuse (ValueError, one line) a gradient-accumulation buffer the wgrad cannot add into."""
    if not isinstance(main_grad, torch.Tensor) or main_grad.shape != b.shape \
            or main_grad.dtype not in (torch.float32, b.dtype) or not main_grad.is_contiguous():
        shown = (f"{main_grad.dtype} {list(main_grad.shape)}{'' if main_grad.is_contiguous() else ' non-contiguous'}"
                 if isinstance(main_grad, torch.Tensor) else type(main_grad).__name__)
        raise ValueError(f"{op}: main_grad must be a contiguous float32 or {b.dtype} tensor of b's shape "
                         f"{list(b.shape)}, got {shown}")
    if main_grad.device != b.device:
        raise ValueError(f"{op}: main_grad is on {main_grad.device}, b on {b.device}")
    if not b.requires_grad:
        raise ValueError(f"{op}: main_grad takes b's gradient, but b does not require grad")


def check_layout(op: str, layout: object, group_offs: torch.Tensor, rows: int) -> None:
    """Refuse (ValueError, one line) a `layout` that cannot be group_layout(group_offs, rows): another type, group
    count or block, or too few blocks for the kernels that read it. Its values stay on the device, unread."""
    if layout is None:
        return
    if not isinstance(layout, TokenLayout):
        raise ValueError(f"{op}: layout must be a TokenLayout (group_layout), got {type(layout).__name__}")
    groups, blocks = group_offs.numel() - 1, layout.block_groups.numel()
    needed = layout_blocks(rows, groups)
    if layout.block != BLOCK or layout.padded_offs.shape != group_offs.shape or blocks < needed:
        raise ValueError(f"{op}: layout must be group_layout(group_offs, {rows}): {needed} blocks of {BLOCK} rows "
                         f"over {groups} groups, got {blocks} blocks of {layout.block} over "
                         f"{layout.padded_offs.numel() - 1}")


@dataclass(frozen=True)
class ForBackward:
    """What an FP8 forward keeps for its backward, each part only if its gradient is wanted: the tokens
    quantized along each group's tokens and transposed (the wgrad's operand), with the groups' token
    layout (None for a dense GEMM's single group), and the weight quantized for the dgrad. FP8 copies
    only: the high-precision tokens are not kept."""

    a_cols: tuple[torch.Tensor, torch.Tensor] | None
    dgrad_weight: QuantizedWeight | None
    layout: TokenLayout | None = None


def row_scale_strides(scale: torch.Tensor, granularity: Granularity) -> tuple[int, int]:
    """A-operand scale view [row, k_block]: tensorwise broadcasts, rowwise per row, blockwise 1x128."""
    if granularity == Granularity.TENSORWISE:
        return (0, 0)
    if granularity == Granularity.ROWWISE:
        return (1, 0)
    return scale.stride()


def m_grouped_fp8(
    pass_name: str, x: tuple[torch.Tensor, torch.Tensor], weight: QuantizedWeight, offs: torch.Tensor,
    granularity: Granularity, out: torch.Tensor, layout: TokenLayout | None = None,
    row_index: torch.Tensor | None = None,
) -> None:
    """out[rows_g] = x[rows_g] @ weight_g^T, x = (q, scale) quantized along its rows (forward and dgrad);
    `layout`: the groups' token layout, if x's quantization made one (grouped_mm reads it); `row_index`: x's
    row r is q[row_index[r]] (quantize_both's row_index: read through it, rowwise)."""
    xq, sx = x
    scales = Scales(
        a=sx, a_strides=row_scale_strides(sx, granularity), b=weight.scale, b_strides=weight.strides,
        b_out_div=weight.out_div, per_k_block=granularity == Granularity.BLOCKWISE,
    )
    cfg = config_for(pass_name, out.shape[0], weight.data.shape[0], granularity, weight.data.shape[1:])
    ws_cfg = blockwise_ws.runnable(xq, weight.data, out, scales, cfg) if cfg.WS and row_index is None else None
    if ws_cfg is not None:
        blockwise_ws.blockwise_mm(xq, weight.data, out, scales, ws_cfg, offs, ping_pong=pass_name == "fwd")
    else:
        grouped_mm(xq, weight.data, offs, out, blockwise_ws.triton_tile(cfg) if scales.per_k_block else cfg, scales,
                   layout=layout, a_rows=row_index)


def vark_scale_strides(scale: torch.Tensor, granularity: Granularity) -> tuple[int, int, int]:
    """Variable-K operand scale view [group, row, token_block] for quantize_both's cols_t scales
    (ROWWISE [G, rows], BLOCKWISE [token blocks, rows])."""
    if granularity == Granularity.TENSORWISE:
        return (0, 0, 0)
    if granularity == Granularity.ROWWISE:
        return (scale.stride(0), scale.stride(1), 0)
    return (0, scale.stride(1), scale.stride(0))


def vark_fp8(
    x: tuple[torch.Tensor, torch.Tensor], y: tuple[torch.Tensor, torch.Tensor], padded_offs: torch.Tensor,
    tokens: int, granularity: Granularity, out: torch.Tensor, accumulate: bool = False,
    cfg: TileConfig | None = None,
) -> None:
    """out[g] = x_g^T @ y_g over group g's tokens (`accumulate`: out[g] += it): x = (q^T [P, capacity],
    scale) and y likewise, both in the padded transposed layout of quantize_both, quantized per group;
    under the tuned table's config unless `cfg` is given (a sweep)."""
    (xt, sx), (yt, sy) = x, y
    scales = VarKScales(
        x=sx, x_strides=vark_scale_strides(sx, granularity), y=sy, y_strides=vark_scale_strides(sy, granularity),
        per_k_block=granularity == Granularity.BLOCKWISE,
    )
    cfg = cfg or config_for("wgrad", tokens, out.shape[0], granularity, out.shape[1:])
    if cfg.WS:  # the warp-specialized kernel's token reduction, where it takes the call
        # A's scales indexed [row, token block] (blockwise) or [row, group] (scaled in the epilogue)
        x_strides = scales.x_strides[1:] if scales.per_k_block else (scales.x_strides[1], scales.x_strides[0])
        token_scales = Scales(sx, x_strides, sy, scales.y_strides, per_k_block=scales.per_k_block)
        token_cfg = blockwise_ws.runnable(xt, yt, out, token_scales, cfg, token_reduction=True, accumulate=accumulate)
        if token_cfg is not None:
            blockwise_ws.blockwise_token_mm(xt, yt, out, token_scales, token_cfg, padded_offs, accumulate)
            return
    if scales.per_k_block:
        cfg = blockwise_ws.triton_tile(cfg)
    grouped_mm_vark(xt, yt, padded_offs, out, cfg, scales, padded=True, accumulate=accumulate)
