"""FP8 formats, scaling granularities and the quantization kernels shared by the FP8 GEMMs.

Scaling: `x ~= q * scale` with `scale = amax / FP8_MAX` over the scaling group, `q` saturated to the
format's range. Granularities:
- TENSORWISE: one scale per tensor (per segment: per expert weight for grouped weights).
- ROWWISE: one scale per row along the reduction dim (per token, per output channel).
- BLOCKWISE: 1x128 blocks along the reduction dim for activations and gradients, 128x128 blocks
  for weights.

A training step quantizes each operand once, into every layout its passes read:
- `quantize_both`: along the rows (the reduction dim contiguous: the forward's and the dgrad's A
  operand) and, from the same read of x, along the columns within each row group, written transposed
  and padded to 128-row blocks so the wgrad reads it K-major (scaling groups never cross group
  boundaries, as the variable-K wgrad of a grouped GEMM requires). Blockwise in one pass over x;
  rowwise and tensorwise in two (an amax pass, then the casts).
- `quantize_rows`: the rows' layout alone, one kernel; `quantize_cols_t`: the transposed one alone.
- `quantize_blocks_2d`: 128x128 weight blocks, written in either orientation or both, one set of scales.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch
import triton
import triton.language as tl

from kernels.common.device import cdiv, interpreter_mode, next_power_of_2
from kernels.common.launch import fast_launch

BLOCK = 128
# The widest row quantize_rows reads whole: 64 fp32 values a thread of 8 warps.
WHOLE_ROW_MAX = 16384
# Values a program of quantize_rows reads whole rows of (as many rows as fit, one at least).
ROW_VALUES = WHOLE_ROW_MAX // 2
FP8_MAX: dict[torch.dtype, float] = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
# (mantissa bits, smallest normal exponent) of each format, for the interpreter's rounding below.
FP8_GRID: dict[torch.dtype, tuple[int, int]] = {torch.float8_e4m3fn: (3, -6), torch.float8_e5m2: (2, -14)}
# The constexprs that describe each format to the quantization kernels (EMULATE: the interpreter's
# rounding, fixed when `kernels` is imported), built once: a launch's host time counts.
FORMAT_ARGS: dict[torch.dtype, dict[str, object]] = {
    dtype: {"FP8_MAX": FP8_MAX[dtype], "MANTISSA": mantissa, "MIN_EXP": min_exp, "EMULATE": interpreter_mode()}
    for dtype, (mantissa, min_exp) in FP8_GRID.items()
}
# amax floor: an all-zero scaling group gets a tiny positive scale instead of a division by zero.
AMAX_EPS = 1e-12


class Format(str, Enum):
    E4M3 = "e4m3"
    E5M2 = "e5m2"
    HYBRID = "hybrid"  # E4M3 forward, E5M2 gradients


class Granularity(str, Enum):
    TENSORWISE = "tensorwise"
    ROWWISE = "rowwise"
    BLOCKWISE = "blockwise"


@dataclass(frozen=True)
class Float8Config:
    format: Format = Format.E4M3
    granularity: Granularity = Granularity.ROWWISE
    block_size: int = BLOCK

    def __post_init__(self) -> None:
        if not isinstance(self.format, Format):
            raise ValueError(f"Float8Config.format must be a Format ({', '.join(f.value for f in Format)})")
        if not isinstance(self.granularity, Granularity):
            known = ", ".join(g.value for g in Granularity)
            raise ValueError(f"Float8Config.granularity must be a Granularity ({known})")
        if self.block_size != BLOCK:
            raise ValueError(f"Float8Config.block_size must be {BLOCK}, got {self.block_size}")

    @property
    def forward_dtype(self) -> torch.dtype:
        return torch.float8_e5m2 if self.format == Format.E5M2 else torch.float8_e4m3fn

    @property
    def grad_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn if self.format == Format.E4M3 else torch.float8_e5m2

    @property
    def forward_format(self) -> str:
        return "e5m2" if self.format == Format.E5M2 else "e4m3"

    @property
    def grad_format(self) -> str:
        return "e4m3" if self.format == Format.E4M3 else "e5m2"


# --- kernels ----------------------------------------------------------------------------------------


@triton.jit
def to_fp8_range(x, FP8_MAX: tl.constexpr, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr, EMULATE: tl.constexpr):
    """Saturate to the format's range; under the CPU interpreter also round to the fp8 grid.

    Callers scale by the reciprocal of the scale, one division per row or column instead of one per
    element: the casts then run at memory speed, and the fp8 rounding dwarfs the ulp it can change.

    The interpreter's fp32 -> fp8 cast drops the carry when a mantissa rounds up into the next
    binade (127.9 -> 64 in E4M3); values already on the grid cast exactly. On a GPU the hardware
    cast rounds correctly and EMULATE is off.
    """
    x = tl.clamp(x, -FP8_MAX, FP8_MAX)
    if EMULATE:
        exponent = tl.maximum(tl.floor(tl.log2(tl.abs(x) + 1e-30)), MIN_EXP)
        ulp = tl.exp2(exponent - MANTISSA)
        x = tl.clamp(tl.floor(x / ulp + 0.5) * ulp, -FP8_MAX, FP8_MAX)
    return x



@fast_launch
@triton.jit
def _segment_amax_kernel(x_ptr, amax_ptr, R, C, stride_r, SEGMENT_ROWS, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """amax[s] = max |x| over rows [s*SEGMENT_ROWS, (s+1)*SEGMENT_ROWS); grid (segments, row blocks)."""
    seg = tl.program_id(0)
    rows = seg.to(tl.int64) * SEGMENT_ROWS + tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = (rows < R) & (rows < (seg + 1).to(tl.int64) * SEGMENT_ROWS)
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        x = tl.load(x_ptr + rows[:, None] * stride_r + cols[None, :], mask=row_mask[:, None] & (cols[None, :] < C))
        acc = tl.maximum(acc, tl.abs(x.to(tl.float32)))
    tl.atomic_max(amax_ptr + seg, tl.max(acc), sem="relaxed")  # read by the next launch only


@fast_launch
@triton.jit
def _quantize_rows_kernel(
    x_ptr, q_ptr, scale_ptr, amax_ptr,
    R, C, stride_xr, stride_qr, SEGMENT_ROWS,
    FP8_MAX: tl.constexpr, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr, EMULATE: tl.constexpr, EPS: tl.constexpr,
    MODE: tl.constexpr,  # 0 tensorwise (amax per segment given), 1 rowwise, 2 a scale per row and SCALE_C columns
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, SCALE_C: tl.constexpr,
):
    """MODE 2 is blockwise 1x128 at SCALE_C 128 (or BLOCK_C, for rows narrower than 128) and rowwise at SCALE_C =
    BLOCK_C >= C (one block a row); read whole (BLOCK_C >= C) or BLOCK_C columns at a time."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = rows < R
    if MODE == 0:
        amax = tl.load(amax_ptr + rows // SEGMENT_ROWS, mask=row_mask, other=1.0)
        scale = tl.maximum(amax, EPS) / FP8_MAX
    elif MODE == 1:
        amax = tl.zeros((BLOCK_R,), dtype=tl.float32)
        for c0 in range(0, C, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            x = tl.load(x_ptr + rows[:, None] * stride_xr + cols[None, :], mask=row_mask[:, None] & (cols[None, :] < C))
            amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), axis=1))
        scale = tl.maximum(amax, EPS) / FP8_MAX
        tl.store(scale_ptr + rows, scale, mask=row_mask)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        mask = row_mask[:, None] & (cols[None, :] < C)
        x = tl.load(x_ptr + rows[:, None] * stride_xr + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if MODE == 2:  # a scale per row and SCALE_C columns: the tile as [rows, blocks, SCALE_C]
            blocks_x = tl.reshape(x, (BLOCK_R, BLOCK_C // SCALE_C, SCALE_C))
            block_scale = tl.maximum(tl.max(tl.abs(blocks_x), axis=2), EPS) / FP8_MAX
            blocks = c0 // SCALE_C + tl.arange(0, BLOCK_C // SCALE_C)
            tl.store(scale_ptr + rows[:, None] * tl.cdiv(C, SCALE_C) + blocks[None, :], block_scale,
                     mask=row_mask[:, None] & (blocks < tl.cdiv(C, SCALE_C))[None, :])
            q = tl.reshape(to_fp8_range(blocks_x * (1.0 / block_scale)[:, :, None], FP8_MAX, MANTISSA, MIN_EXP,
                                        EMULATE), (BLOCK_R, BLOCK_C))
        else:
            q = to_fp8_range(x * (1.0 / scale)[:, None], FP8_MAX, MANTISSA, MIN_EXP, EMULATE)
        tl.store(q_ptr + rows[:, None] * stride_qr + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=mask)

@triton.jit
def _token_block(tb, offs_ptr, padded_offs_ptr, block_groups_ptr, G, R, GROUP_ROWS, EQUAL_GROUPS: tl.constexpr,
                 BLOCK_T: tl.constexpr):
    """Rows of x behind padded token block `tb`, their mask, and the block's group (G past the last group).

    Equal groups of GROUP_ROWS rows (a dense tensor, stacked expert weights) are found by division;
    groups of any size in the token layout's block map (one load: a binary search of the padded offsets
    in every program cost 11-18% of the passes at 128 groups). Blocks past the last group (the buffer's
    slack) get an all-false mask: they write zeros.
    """
    if EQUAL_GROUPS:
        blocks_per_group = tl.maximum(tl.cdiv(GROUP_ROWS, BLOCK_T), 1)
        g = tb // blocks_per_group
        start = g.to(tl.int64) * GROUP_ROWS
        end = tl.where(g < G, tl.minimum(start + GROUP_ROWS, R), start)
        first_row = start + (tb - g * blocks_per_group).to(tl.int64) * BLOCK_T
    else:
        position = tb.to(tl.int64) * BLOCK_T
        g = tl.load(block_groups_ptr + tb)
        last = tl.minimum(g, G - 1)
        start = tl.load(offs_ptr + last).to(tl.int64)
        end = tl.where(g < G, tl.load(offs_ptr + last + 1).to(tl.int64), start)
        first_row = start + position - tl.load(padded_offs_ptr + last)
    rows = first_row + tl.arange(0, BLOCK_T)
    return rows, rows < end, g


@triton.jit
def _tile_of_program(column_blocks, LAST_FIRST: tl.constexpr = False):
    """(token block, column block) of this program of a 1-D grid, column blocks the faster: programs that
    run side by side read neighbouring column blocks of the same rows, whole rows of x between them. With
    token blocks the faster, they read one 256-byte piece of each row at a time, rows 4-14 KB apart at
    the widths of DeepSeek-V3's experts (docs/performance.md, "... the quantization kernels' grid order").
    LAST_FIRST: the tiles in reverse, for a pass that follows one over the same tiles in order (the casts
    after the amax pass): its first reads find in the L2 what the pass before read last."""
    pid = tl.program_id(0)
    if LAST_FIRST:
        pid = tl.num_programs(0) - 1 - pid
    return pid // column_blocks, pid % column_blocks


@fast_launch
@triton.jit
def _token_layout_kernel(offs_ptr, padded_ptr, block_groups_ptr, G, n_blocks,
                         BLOCK_G: tl.constexpr, BLOCK_T: tl.constexpr, BLOCKS: tl.constexpr):
    """padded[g+1] = sum over groups <= g of len rounded up to BLOCK_T (program 0 stores it); each program
    also maps BLOCKS token blocks to their group: the number of groups that end at or before the block
    (G for the slack past the last group; an empty group ends where it starts and is skipped)."""
    i = tl.arange(0, BLOCK_G)
    lens = tl.load(offs_ptr + i + 1, mask=i < G, other=0) - tl.load(offs_ptr + i, mask=i < G, other=0)
    padded = tl.cumsum((lens + BLOCK_T - 1) // BLOCK_T * BLOCK_T, 0)
    if tl.program_id(0) == 0:
        tl.store(padded_ptr + i + 1, padded, mask=i < G)
        tl.store(padded_ptr, tl.zeros((), padded_ptr.dtype.element_ty))
    blocks = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)
    ends_before = (padded[None, :] <= blocks.to(tl.int64)[:, None] * BLOCK_T) & (i < G)[None, :]
    tl.store(block_groups_ptr + blocks, tl.sum(ends_before.to(tl.int32), axis=1), mask=blocks < n_blocks)


@triton.jit
def _load_tile(x_ptr, rows, row_mask, cols, col_mask, stride_x, C, src_ptr, weight_ptr,
               GLU: tl.constexpr, GATHER: tl.constexpr, WEIGHTED: tl.constexpr):
    """Rows `rows` of the tensor being quantized, in fp32 (masked elements 0). GLU: x is a SwiGLU's input
    [R, 2C] (gate columns, then up) and the tile is silu(gate) * up, computed here instead of read from a
    written SwiGLU output. GATHER: row r is x's row src[r] (none where src[r] < 0: zeros); WEIGHTED:
    times weight[r] (see RowSource)."""
    if GATHER:
        src = tl.load(src_ptr + rows, mask=row_mask, other=-1)
        row_mask = row_mask & (src >= 0)
        x_rows = src.to(tl.int64)
    else:
        x_rows = rows
    mask = row_mask[:, None] & col_mask[None, :]
    ptrs = x_ptr + x_rows[:, None] * stride_x + cols[None, :]
    if GLU:
        gate = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(ptrs + C, mask=mask, other=0.0).to(tl.float32)
        x = gate * tl.sigmoid(gate) * up
    else:
        x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    if WEIGHTED:
        x = x * tl.load(weight_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)[:, None]
    return x


@fast_launch
@triton.jit
def _amax_both_kernel(
    x_ptr, row_amax_ptr, group_amax_ptr, offs_ptr, padded_offs_ptr, block_groups_ptr, src_ptr, weight_ptr,
    G, R, C, stride_x, GROUP_ROWS, ROWWISE: tl.constexpr, ROWS: tl.constexpr, TENSOR_PER_GROUP: tl.constexpr,
    EQUAL_GROUPS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, GLU: tl.constexpr,
    GATHER: tl.constexpr, WEIGHTED: tl.constexpr,
):
    """The first pass of a rowwise or tensorwise quantization, one read of x for every scale it needs:
    ROWWISE: amax per (group, column) and, for ROWS, per row; else amax per group or of the tensor."""
    tb, cb = _tile_of_program(tl.cdiv(C, BLOCK_C))
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < C
    rows, row_mask, g = _token_block(tb, offs_ptr, padded_offs_ptr, block_groups_ptr, G, R, GROUP_ROWS, EQUAL_GROUPS,
                                     BLOCK_T)
    last = tl.minimum(g, G - 1)  # a slack block (g == G) holds zeros: adding it to the last group changes nothing
    # Masked rows and columns read 0, the amax's initial value: they change nothing.
    x = tl.abs(_load_tile(x_ptr, rows, row_mask, cols, col_mask, stride_x, C, src_ptr, weight_ptr, GLU, GATHER,
                          WEIGHTED))
    # Non-negative floats order as their bit patterns do: one integer atomic max each, where a float
    # atomic max costs two (a max for positives, a min for negatives). Relaxed: only the next launch reads
    # the maxima, so the default acq_rel's fences around each atomic bought nothing (1.11-1.21x on this pass
    # with row maxima, H100).
    row_amax_bits = row_amax_ptr.to(tl.pointer_type(tl.int32))
    group_amax_bits = group_amax_ptr.to(tl.pointer_type(tl.int32))
    if ROWWISE:
        if ROWS:
            tl.atomic_max(row_amax_bits + rows, tl.max(x, axis=1).to(tl.int32, bitcast=True), mask=row_mask,
                          sem="relaxed")
        tl.atomic_max(group_amax_bits + last * C + cols, tl.max(x, axis=0).to(tl.int32, bitcast=True), mask=col_mask,
                      sem="relaxed")
    else:
        tl.atomic_max(group_amax_bits + last * TENSOR_PER_GROUP, tl.max(x).to(tl.int32, bitcast=True), sem="relaxed")


@fast_launch
@triton.jit
def _quantize_both_kernel(
    x_ptr, q_ptr, qt_ptr, scale_ptr, scale_t_ptr, row_amax_ptr, group_amax_ptr, offs_ptr, padded_offs_ptr,
    block_groups_ptr, src_ptr, weight_ptr, G, R, C, stride_x, stride_q, stride_qt, GROUP_ROWS, TOKEN_BLOCKS,
    SCALE_GROUPS,
    FP8_MAX: tl.constexpr, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr, EMULATE: tl.constexpr, EPS: tl.constexpr,
    MODE: tl.constexpr,  # 0 tensorwise, 1 rowwise (amax from _amax_both_kernel), 2 blockwise (scales here)
    ROWS: tl.constexpr, TENSOR_PER_GROUP: tl.constexpr, EQUAL_GROUPS: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, GLU: tl.constexpr, GATHER: tl.constexpr, WEIGHTED: tl.constexpr,
    SOURCE_AMAX: tl.constexpr = False, UNWEIGHTED_ROWS: tl.constexpr = False,
):
    """One read of a [BLOCK_T, BLOCK_C] tile of x (GLU: of silu(gate) * up; GATHER, WEIGHTED: of rows read
    through an index and scaled; see _load_tile), one or two fp8 layouts written from it:

    q^T [C, capacity] scaled along the rows within each group (per tensor, per (group, column), or per
    128x1 block), every group padded with zeros to whole 128-row blocks, the wgrad's operand; and for
    ROWS, q [R, C] scaled along C (per tensor, per row, or per 1x128 block), the forward's and the
    dgrad's A operand. Program tb < SCALE_GROUPS also writes group tb's scales, so that an empty group
    gets its own too.

    SOURCE_AMAX (rowwise, GATHER): the amaxes are those of x's own rows (row_amax, one a token) and columns
    (group_amax: one a column over all tokens, then the largest |weight|); see quantize_both.
    UNWEIGHTED_ROWS (WEIGHTED, rowwise or blockwise): the weight scales q^T only, q holds the rows as read.
    Rowwise and tensorwise, the tiles go in the amax pass's order reversed (_tile_of_program's LAST_FIRST).
    """
    tb, cb = _tile_of_program(tl.cdiv(C, BLOCK_C), MODE != 2)
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < C
    rows, row_mask, g = _token_block(tb, offs_ptr, padded_offs_ptr, block_groups_ptr, G, R, GROUP_ROWS, EQUAL_GROUPS,
                                     BLOCK_T)
    last = tl.minimum(g, G - 1)
    weighted_rows: tl.constexpr = WEIGHTED and not UNWEIGHTED_ROWS
    x = _load_tile(x_ptr, rows, row_mask, cols, col_mask, stride_x, C, src_ptr, weight_ptr, GLU, GATHER,
                   weighted_rows)
    if MODE == 2:  # BLOCK_C == BLOCK_T == 128: the tile is one 1x128 block per row, one 128x1 per column
        row_scale = tl.maximum(tl.max(tl.abs(x), axis=1), EPS) / FP8_MAX
        if ROWS:
            tl.store(scale_ptr + rows * tl.cdiv(C, BLOCK_C) + cb, row_scale, mask=row_mask)
    elif MODE == 1:
        if SOURCE_AMAX:
            # A row's amax is its token's times |weight| (exactly: rounding keeps the order), and the column's
            # over all tokens times the largest |weight| bounds every group's (the same scale for each group).
            if ROWS:  # (without, row_amax_ptr holds no token's amax)
                src = tl.load(src_ptr + rows, mask=row_mask, other=-1)
                row_amax = tl.load(row_amax_ptr + src, mask=row_mask & (src >= 0), other=0.0)
                if weighted_rows:
                    row_amax *= tl.abs(tl.load(weight_ptr + rows, mask=row_mask, other=0.0).to(tl.float32))
                row_scale = tl.maximum(row_amax, EPS) / FP8_MAX
            col_amax = tl.load(group_amax_ptr + cols, mask=col_mask, other=0.0)
            if WEIGHTED:
                col_amax *= tl.load(group_amax_ptr + C)
            col_scale = tl.maximum(col_amax, EPS) / FP8_MAX
        else:
            row_scale = tl.maximum(tl.load(row_amax_ptr + rows, mask=row_mask, other=0.0), EPS) / FP8_MAX
            col_scale = tl.maximum(tl.load(group_amax_ptr + last * C + cols, mask=col_mask, other=0.0),
                                   EPS) / FP8_MAX
        if ROWS:  # noqa: SIM102 (a compile-time flag, then a run-time test: Triton cannot `and` them)
            if cb == 0:
                tl.store(scale_ptr + rows, row_scale, mask=row_mask)
        if tb < SCALE_GROUPS:
            if SOURCE_AMAX:
                group_scale = col_scale
            else:
                group_scale = tl.maximum(tl.load(group_amax_ptr + tb * C + cols, mask=col_mask, other=0.0),
                                         EPS) / FP8_MAX
            tl.store(scale_t_ptr + tb * C + cols, group_scale, mask=col_mask)
    else:
        # The tensor's (group's) scale loaded as vectors along the tile's rows and columns, as the rowwise
        # scales are: broadcast from a scalar instead, Triton 3.6 wrote a wrong q^T on the H100 for tiles
        # computed in fp32 (fp32 inputs, a SwiGLU's, scaled rows).
        amax_at = group_amax_ptr + last * TENSOR_PER_GROUP
        row_scale = tl.maximum(tl.load(amax_at + rows * 0), EPS) / FP8_MAX
        col_scale = tl.maximum(tl.load(amax_at + cols * 0), EPS) / FP8_MAX
        if (cb == 0) & (tb < SCALE_GROUPS):
            tl.store(scale_ptr + tb, tl.maximum(tl.load(group_amax_ptr + tb), EPS) / FP8_MAX)
    if ROWS:
        q = to_fp8_range(x * (1.0 / row_scale)[:, None], FP8_MAX, MANTISSA, MIN_EXP, EMULATE)
        tl.store(q_ptr + rows[:, None] * stride_q + cols[None, :], q.to(q_ptr.dtype.element_ty),
                 mask=row_mask[:, None] & col_mask[None, :])
    if UNWEIGHTED_ROWS:  # the transposed layout's rows are weighted
        x = x * tl.load(weight_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)[:, None]
    if MODE == 2:
        col_scale = tl.maximum(tl.max(tl.abs(x), axis=0), EPS) / FP8_MAX
        if tb < TOKEN_BLOCKS:  # [capacity / 128, C]: a token block's scales are contiguous, as the wgrad reads them
            tl.store(scale_t_ptr + tb * C + cols, col_scale, mask=col_mask)
    qt = tl.trans(to_fp8_range(x * (1.0 / col_scale)[None, :], FP8_MAX, MANTISSA, MIN_EXP, EMULATE))
    dest = tl.multiple_of(tb * BLOCK_T, BLOCK_T) + tl.arange(0, BLOCK_T)
    # Programs past the layout (tb >= TOKEN_BLOCKS) only write scales.
    in_layout = dest < TOKEN_BLOCKS * BLOCK_T
    tl.store(qt_ptr + cols[:, None] * stride_qt + dest[None, :], qt.to(qt_ptr.dtype.element_ty),
             mask=col_mask[:, None] & in_layout[None, :])


@fast_launch
@triton.jit
def _quantize_blocks_2d_kernel(
    w_ptr, q_ptr, qt_ptr, scale_ptr, R, C,
    FP8_MAX: tl.constexpr, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr, EMULATE: tl.constexpr, EPS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, ROWS: tl.constexpr, COLS_T: tl.constexpr,
):
    """One 128x128 block of w[g] ([G, R, C]) -> q[g] ([G, R, C]) if ROWS and q^T[g] ([G, C, R]) if COLS_T,
    one scale."""
    # Column blocks the fastest of the grid, experts the slowest (see _tile_of_program).
    cb, rb, g = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    rows = rb * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    cols = cb * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    base = g * R * C
    w = tl.load(w_ptr + base + rows[:, None] * C + cols[None, :], mask=mask).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(w)), EPS) / FP8_MAX
    tl.store(scale_ptr + (g * tl.num_programs(1) + rb) * tl.num_programs(0) + cb, scale)
    q = to_fp8_range(w * (1.0 / scale), FP8_MAX, MANTISSA, MIN_EXP, EMULATE)
    if ROWS:
        tl.store(q_ptr + base + rows[:, None] * C + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=mask)
    if COLS_T:
        tl.store(qt_ptr + base + cols[:, None] * R + rows[None, :], tl.trans(q.to(qt_ptr.dtype.element_ty)),
                 mask=tl.trans(mask))


# --- launchers --------------------------------------------------------------------------------------


def _format_args(dtype: torch.dtype) -> dict[str, object]:
    """The constexprs that describe an fp8 format to the quantization kernels (read-only: shared)."""
    if dtype not in FORMAT_ARGS:
        raise ValueError(f"fp8 dtype must be float8_e4m3fn or float8_e5m2, got {dtype}")
    return FORMAT_ARGS[dtype]


def segment_amax(x: torch.Tensor, segment_rows: int) -> torch.Tensor:
    """max |x| over each run of `segment_rows` rows of a 2-D tensor: fp32 [R // segment_rows]."""
    R, C = x.shape
    segments = max(1, cdiv(R, segment_rows))
    amax = torch.zeros(segments, dtype=torch.float32, device=x.device)
    if R and C:
        grid = (segments, cdiv(min(segment_rows, R), 32))
        _segment_amax_kernel[grid](x, amax, R, C, x.stride(0), segment_rows, BLOCK_R=32, BLOCK_C=128)
    return amax


def whole_row_blocks(C: int) -> bool:
    """Whether quantize_rows reads rows of C columns whole (one program a few rows, every load at once)."""
    return C <= WHOLE_ROW_MAX


def quantize_rows(
    x: torch.Tensor, fp8_dtype: torch.dtype, granularity: Granularity, segment_rows: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a row-major [R, C] tensor along its rows (C is the GEMM's reduction dim).

    Returns (q [R, C], scale): TENSORWISE [R // segment_rows] (one per segment, default the whole
    tensor), ROWWISE [R], BLOCKWISE [R, cdiv(C, 128)].
    """
    if x.ndim != 2 or x.stride(1) != 1:
        raise ValueError(f"quantize_rows: x must be 2-D with contiguous rows, got {tuple(x.shape)} {x.stride()}")
    R, C = x.shape
    fmt = _format_args(fp8_dtype)
    fmax = FP8_MAX[fp8_dtype]
    q = torch.empty((R, C), dtype=fp8_dtype, device=x.device)
    amax = scale = None
    if granularity == Granularity.TENSORWISE:
        segment_rows = segment_rows or max(R, 1)
        amax = segment_amax(x, segment_rows)
        scale = torch.clamp_min(amax, AMAX_EPS) / fmax
        mode = 0
    elif granularity == Granularity.ROWWISE:
        scale, mode = torch.empty(R, dtype=torch.float32, device=x.device), 1
    else:
        scale, mode = torch.empty((R, cdiv(C, BLOCK)), dtype=torch.float32, device=x.device), 2
    if R and C:
        # A row up to WHOLE_ROW_MAX wide is read once, whole, as MODE 2 with one scale (rowwise) or one a
        # 128-column block (blockwise). Rowwise, 32 rows a program looping over the columns twice (amax, then
        # cast) read the row from HBM again; blockwise, looping over 128-column blocks read 2.52-2.55 TB/s
        # where whole rows read 2.92-2.97 and a copy 2.96-2.99 (H100, 32768 rows of 4096 and 7168).
        whole_rows = mode in (1, 2) and whole_row_blocks(C)
        block_c = next_power_of_2(C) if whole_rows else BLOCK
        block_r = max(1, ROW_VALUES // block_c) if whole_rows else 32
        _quantize_rows_kernel[(cdiv(R, block_r),)](
            x, q, scale, amax if amax is not None else scale, R, C, x.stride(0), q.stride(0), segment_rows or 1,
            **fmt, EPS=AMAX_EPS, MODE=2 if whole_rows else mode, BLOCK_R=block_r, BLOCK_C=block_c,
            SCALE_C=min(BLOCK, block_c) if mode == 2 else block_c, num_warps=8 if whole_rows else 4,
        )
    return q, scale


@dataclass(frozen=True)
class RowGroups:
    """Which rows of an [R, C] tensor form each group of the transposed layout: `offs` [G+1] on the
    device for token groups of any size (a router's split; `layout`, their token layout, if already
    made for as many rows: group_layout), else `count` groups of `size` rows each (a dense tensor is one
    group; a stack of expert weights, one per expert)."""

    count: int
    offs: torch.Tensor | None = None
    size: int = 0
    layout: TokenLayout | None = None

    @classmethod
    def tokens(cls, offs: torch.Tensor, layout: TokenLayout | None = None) -> RowGroups:
        return cls(offs.numel() - 1, offs, layout=layout)

    @classmethod
    def equal(cls, count: int, size: int) -> RowGroups:
        return cls(count, None, size)

    def capacity(self, rows: int) -> int:
        """Columns of the transposed layout: every group padded to whole 128-row blocks."""
        if self.offs is None:
            return self.count * cdiv(self.size, BLOCK) * BLOCK
        return padded_capacity(rows, self.count)


@dataclass(frozen=True)
class RowSource:
    """Rows of x read through an index: row r of the tensor quantized is weight[r] * x[rows[r]], zeros
    where rows[r] < 0, so that a permuted copy of x (an MoE layer's tokens sorted by expert; the
    combine's gradient, each copy scaled by its probability) is quantized without ever being written.
    rows: int32 [R] on x's device; weight: [R] (any float dtype) or None for 1. `weighted_rows=False`
    (rowwise or blockwise): the weight goes into the transposed layout only, the rows layout holding
    x[rows[r]] itself, for a GEMM over the rows whose caller applies the weight to its output rows (an
    MoE layer's Down dgrad, whose unweighted rows also give the probabilities' gradient)."""

    rows: torch.Tensor
    weight: torch.Tensor | None = None
    weighted_rows: bool = True


@dataclass(frozen=True)
class TokenLayout:
    """Where token groups sit in a layout of `block`-row blocks (128: the transposed FP8 layout's; a grouped
    GEMM's row tile): `padded_offs` [G+1], the group offsets with every length rounded up to `block`;
    `block_groups` int32, each block's group (G past the last one)."""

    padded_offs: torch.Tensor
    block_groups: torch.Tensor
    block: int = BLOCK


# Token blocks a program of _token_layout_kernel maps.
LAYOUT_BLOCKS = 128


def token_layout(group_offs: torch.Tensor, blocks: int, block: int = BLOCK) -> TokenLayout:
    """The token layout of groups at `group_offs` [G+1] over `blocks` blocks of `block` rows (128: the transposed
    FP8 layout's; a grouped GEMM's row tile), in one launch on the device (no host sync)."""
    G = group_offs.numel() - 1
    padded = torch.empty_like(group_offs)
    block_groups = torch.empty(blocks, dtype=torch.int32, device=group_offs.device)
    _token_layout_kernel[(max(1, cdiv(blocks, LAYOUT_BLOCKS)),)](
        group_offs, padded, block_groups, G, blocks, BLOCK_G=next_power_of_2(max(G, 1)), BLOCK_T=block,
        BLOCKS=LAYOUT_BLOCKS)
    return TokenLayout(padded, block_groups, block)


@dataclass(frozen=True)
class Quantized:
    """What `quantize_both` wrote: `rows` (q [R, C], scale) for the passes that reduce over C, `cols_t`
    (q^T [C, capacity], scale) for the wgrad, which reduces over the rows of each group, and the groups'
    token layout (token groups only). Scale shapes: see quantize_both. `row_index` (int32 [R]): `rows` holds
    the source's own rows (q [T, C], scale [T]), row r of the quantized tensor being row row_index[r] of
    them (zeros where it is negative), for a GEMM that reads them through the index (grouped_mm's a_rows)."""

    rows: tuple[torch.Tensor, torch.Tensor] | None
    cols_t: tuple[torch.Tensor, torch.Tensor] | None
    layout: TokenLayout | None
    row_index: torch.Tensor | None = None

    @property
    def padded_offs(self) -> torch.Tensor | None:
        return self.layout.padded_offs if self.layout is not None else None


def _aligned_floats(n: int) -> int:
    """n float32s rounded up to a whole number of 16 bytes."""
    return cdiv(n, 4) * 4


def padded_capacity(rows: int, groups: int) -> int:
    """Columns that hold `rows` rows split into `groups` segments each padded to 128, whatever the split."""
    return cdiv(rows + groups * (BLOCK - 1), BLOCK) * BLOCK


def layout_blocks(rows: int, groups: int) -> int:
    """128-row blocks the token layout of `rows` rows in `groups` token groups maps: every block of quantize_both's
    transposed layout (`padded_capacity`), and at least one a group (its grids give each group a program)."""
    return max(padded_capacity(rows, groups) // BLOCK, groups)


def group_layout(group_offs: torch.Tensor, rows: int) -> TokenLayout:
    """The token layout quantize_both maps `rows` rows in the token groups at `group_offs` [G+1] with, for a caller
    whose ops quantize rows in the same groups to make once and hand to each (`RowGroups.tokens(offs, layout)`): an
    MoE layer's GateUP input and the SwiGLU output after it are the same tokens in the same experts, and the
    backward's upstream gradients too; each op mapping them itself is one more launch (25-50 us of host time on
    the lent H100, kernels/common/launch.py)."""
    return token_layout(group_offs, layout_blocks(rows, group_offs.numel() - 1))


def rows_read_through_index(granularity: Granularity, glu: bool, source: RowSource) -> bool:
    """Whether quantize_both leaves the rows layout of rows read through `source` as x's own rows quantized
    (and the index for the GEMM to read them through: grouped_mm's a_rows) rather than writing the R rows:
    rowwise, rows read unweighted (no weight, or weighted_rows=False), no SwiGLU, where the rows' scales are
    their sources' own. An MoE layer's 32768 tokens and their 262144 copies (hidden 4096, H100): the
    quantization 1.80 -> 1.38 ms, its GEMM 1.01-1.05x slower (cp.async reads of A, not TMA), the two 1.05-1.16x
    faster (docs/performance.md, "The tokens' rows read through the expert order in the GEMM")."""
    return granularity == Granularity.ROWWISE and not glu and (source.weight is None or not source.weighted_rows)


def quantize_both(
    x: torch.Tensor, fp8_dtype: torch.dtype, granularity: Granularity, groups: RowGroups,
    rows: bool = True, cols: bool = True, tensor_per_group: bool = False, glu: bool = False,
    source: RowSource | None = None,
) -> Quantized:
    """Quantize a row-major [R, C] tensor into the layouts a training step reads, in one pass over x
    (blockwise) or two (rowwise, tensorwise: the amax, then the casts), each layout only if asked for.
    `glu`: x is a SwiGLU's input [R, 2C] (gate columns, then up) and what is quantized is
    silu(gate) * up, computed in fp32 in each pass: the SwiGLU output is never written. `source`: the
    tensor quantized has R = source.rows.numel() rows, each a row of x read through the index (and
    scaled), in fp32 in each pass (see RowSource); rowwise, its amaxes come from x's own rows (one read
    of x, not of its R gathered rows): the rows' scales are exactly those of the gathered rows, and
    cols_t's scale is one for all groups, each column's amax over x times the largest |weight| (a bound
    of every group's). With either, the transposed layout is written even without `cols`. Rowwise, where
    the rows are read unweighted (no weight, or `weighted_rows=False`), the rows layout is x's own rows
    quantized (q [T, C], scale [T]) and `row_index` the source's index, for the GEMM to read them through.

    rows: q [R, C] with TENSORWISE scale [1] ([G] with `tensor_per_group`), ROWWISE [R], BLOCKWISE
    [R, cdiv(C, 128)]. cols_t: q^T [C, groups.capacity(R)], group g in columns [padded[g],
    padded[g+1]) zero-padded to a multiple of 128 so readers take aligned, unmasked 128-token blocks;
    scale TENSORWISE the rows' tensor, ROWWISE [G, C], BLOCKWISE [capacity / 128, C] indexed by the
    padded column // 128 (blocks never cross groups). One program per 128-row block and column block:
    a group holding most tokens gets most programs (skew-balanced).
    """
    if x.ndim != 2 or x.stride(1) != 1:
        raise ValueError(f"quantize_both: x must be 2-D with contiguous rows, got {tuple(x.shape)} {x.stride()}")
    if glu and x.shape[1] % 2:
        raise ValueError(f"quantize_both: a SwiGLU input must have an even number of columns, got {x.shape[1]}")
    if source is not None and not source.weighted_rows and granularity == Granularity.TENSORWISE:
        raise ValueError("quantize_both: a RowSource's unweighted rows need rowwise or blockwise scales (tensorwise "
                         "shares one scale between both layouts)")
    if source is not None and (source.rows.dtype != torch.int32 or source.rows.ndim != 1 or (
            source.weight is not None and source.weight.shape != source.rows.shape)):
        raise ValueError("quantize_both: a RowSource holds int32 rows [R] and weights [R] or None, got "
                         f"{source.rows.dtype} {list(source.rows.shape)} and "
                         f"{None if source.weight is None else list(source.weight.shape)}")
    if rows and source is not None and rows_read_through_index(granularity, glu, source):
        rest = quantize_both(x, fp8_dtype, granularity, groups, rows=False, cols=cols, source=source)
        return Quantized(quantize_rows(x, fp8_dtype, granularity), rest.cols_t, rest.layout, source.rows)
    R = x.shape[0] if source is None else source.rows.numel()
    C = x.shape[1] // 2 if glu else x.shape[1]
    if not cols and not glu and source is None:  # one layout along the rows: quantize_rows, one kernel
        segment_rows = groups.size if tensor_per_group and granularity == Granularity.TENSORWISE else None
        # A layout given is handed on, for the GEMM over these rows (grouped_mm) not to map the groups again.
        return Quantized(quantize_rows(x, fp8_dtype, granularity, segment_rows), None, groups.layout)
    G, device = groups.count, x.device
    equal = groups.offs is None
    capacity = groups.capacity(R)
    token_blocks = capacity // BLOCK
    layout = None
    if not equal:  # the map covers every program of the grids below (those past the layout find group G)
        layout = groups.layout or token_layout(groups.offs, layout_blocks(R, G))
    offs = x if equal else groups.offs  # pointers the kernels never read for equal groups
    padded_ptr, block_groups_ptr = (x, x) if equal else (layout.padded_offs, layout.block_groups)
    q = torch.empty((R, C), dtype=fp8_dtype, device=device) if rows else None
    qt = torch.empty((C, capacity), dtype=fp8_dtype, device=device)
    row_amax = group_amax = scale = scale_t = None
    scale_groups = 0
    if granularity == Granularity.BLOCKWISE:
        scale = torch.empty((R, cdiv(C, BLOCK)), dtype=torch.float32, device=device) if rows else None
        scale_t = torch.empty((capacity // BLOCK, C), dtype=torch.float32, device=device)
        mode = 2
    elif granularity == Granularity.ROWWISE:
        # One zeroed buffer for both amaxes: one memset. Through a row source, they are the source's (below):
        # one a token, then one a column over all tokens and the largest |weight|. The scales share it (one
        # allocation, not three: 5 us of host each on the lent H100; the memset grows by under a MB), each on a
        # 16-byte boundary as a buffer of its own would be, so that every kernel reading them specializes as before.
        amax_rows, amax_cols = (x.shape[0], C + 1) if source is not None else (R, max(G, 1) * C)
        amax_size = amax_rows * rows + amax_cols
        scale_start = _aligned_floats(amax_size)
        scale_t_start = scale_start + _aligned_floats(R * rows)
        parts = torch.zeros(scale_t_start + G * C, dtype=torch.float32, device=device).split_with_sizes(
            [amax_rows * rows, amax_cols, scale_start - amax_size, R * rows, scale_t_start - scale_start - R * rows,
             G * C])
        row_amax, group_amax, _, scale, _, scale_t = parts
        row_amax = row_amax if rows else group_amax  # a pointer the kernels never read without rows
        scale, scale_t = scale if rows else None, scale_t.view(G, C)
        scale_groups, mode = G, 1
    else:
        scale_groups = G if tensor_per_group else 1
        group_amax = row_amax = torch.zeros(scale_groups, dtype=torch.float32, device=device)
        scale = scale_t = torch.empty(scale_groups, dtype=torch.float32, device=device)
        mode = 0
    src, weight = (source.rows, source.weight) if source is not None else (None, None)
    unweighted_rows = rows and weight is not None and not source.weighted_rows
    common = dict(src_ptr=x if src is None else src, weight_ptr=x if weight is None else weight, G=G, R=R, C=C,
                  stride_x=x.stride(0), GROUP_ROWS=groups.size, EQUAL_GROUPS=equal, GLU=glu,
                  GATHER=src is not None, WEIGHTED=weight is not None)
    # quant_sweep.py --sweep (H100, 2026-11-25): the amax pass's 4 warps read 1.2-1.4x faster than 8 on every
    # shape; a SwiGLU input (two tiles a program) is fastest 64 columns wide.
    amax_block_c = BLOCK // 2 if glu else BLOCK
    source_amax = mode == 1 and source is not None
    if source_amax and C:
        # A gathered tensor's amaxes from its source, one read of x's T rows rather than of the R rows read
        # through the index (an MoE layer's tokens and their top-k copies): each row's amax is its token's
        # times |weight|, and every group's column amax is at most the column's over all tokens times the
        # largest |weight|. A scale from that bound costs precision only below fp8's normal range.
        T = x.shape[0]
        if T:
            source_read = common | {"G": 1, "R": T, "GROUP_ROWS": T, "EQUAL_GROUPS": True, "GATHER": False,
                                    "WEIGHTED": False}
            _amax_both_kernel[(cdiv(T, BLOCK) * cdiv(C, amax_block_c),)](
                x, row_amax, group_amax, x, x, x, **source_read, ROWWISE=True, ROWS=rows, TENSOR_PER_GROUP=0,
                BLOCK_T=BLOCK, BLOCK_C=amax_block_c, num_warps=4,
            )
        if weight is not None:
            torch.linalg.vector_norm(weight, float("inf"), dtype=torch.float32, out=group_amax[C])
    if C and (R or scale_groups):
        if mode != 2 and R and not source_amax:
            _amax_both_kernel[(token_blocks * cdiv(C, amax_block_c),)](
                x, row_amax, group_amax, offs, padded_ptr, block_groups_ptr, **common, ROWWISE=mode == 1, ROWS=rows,
                TENSOR_PER_GROUP=int(tensor_per_group), BLOCK_T=BLOCK, BLOCK_C=amax_block_c, num_warps=4,
            )
        unused = scale_t  # stands in for the pointers a mode does not read
        _quantize_both_kernel[(max(token_blocks, scale_groups) * cdiv(C, BLOCK),)](
            x, qt if q is None else q, qt, unused if scale is None else scale, scale_t,
            unused if row_amax is None else row_amax, unused if group_amax is None else group_amax,
            offs, padded_ptr, block_groups_ptr, **common, stride_q=C, stride_qt=capacity,
            TOKEN_BLOCKS=token_blocks, SCALE_GROUPS=scale_groups, **_format_args(fp8_dtype), EPS=AMAX_EPS,
            MODE=mode, ROWS=rows, TENSOR_PER_GROUP=int(tensor_per_group), BLOCK_T=BLOCK, BLOCK_C=BLOCK,
            SOURCE_AMAX=source_amax, UNWEIGHTED_ROWS=unweighted_rows,
            # 4 warps measured up to 15% faster than 8 (H100, 2026-11-23), except on a SwiGLU input
            # (1.18x with 8, 2026-11-25)
            num_warps=8 if glu else 4,
        )
    elif mode == 0:  # nothing to read: the scale of an all-zero tensor
        scale.fill_(AMAX_EPS / FP8_MAX[fp8_dtype])
    return Quantized((q, scale) if rows else None, (qt, scale_t), layout)


def quantize_cols_t(
    x: torch.Tensor, group_offs: torch.Tensor, fp8_dtype: torch.dtype, granularity: Granularity
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize a row-major [M, C] tensor along its rows within each token group, written transposed:
    (q^T, scale, padded_offs), the cols_t layout of `quantize_both`."""
    both = quantize_both(x, fp8_dtype, granularity, RowGroups.tokens(group_offs), rows=False)
    return (*both.cols_t, both.padded_offs)


def quantize_blocks_2d(
    w: torch.Tensor, fp8_dtype: torch.dtype, rows: bool = True, cols_t: bool = True
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """128x128 block quantization of a contiguous [G, R, C] tensor.

    Returns (q [G, R, C] if `rows`, q^T [G, C, R] if `cols_t`, scale [G, cdiv(R, 128), cdiv(C, 128)]):
    both orientations share the scales, so the forward and the dgrad read one quantization of the
    weight; a pass that needs one orientation writes only that one.
    """
    if w.ndim != 3 or not w.is_contiguous():
        raise ValueError(f"quantize_blocks_2d: w must be a contiguous [G, R, C] tensor, got {tuple(w.shape)}")
    G, R, C = w.shape
    q = torch.empty_like(w, dtype=fp8_dtype) if rows else None
    qt = torch.empty((G, C, R), dtype=fp8_dtype, device=w.device) if cols_t else None
    scale = torch.empty((G, cdiv(R, BLOCK), cdiv(C, BLOCK)), dtype=torch.float32, device=w.device)
    if G and R and C:
        _quantize_blocks_2d_kernel[(cdiv(C, BLOCK), cdiv(R, BLOCK), G)](
            w, scale if q is None else q, scale if qt is None else qt, scale, R, C, **_format_args(fp8_dtype),
            EPS=AMAX_EPS, BLOCK_SIZE=BLOCK, ROWS=rows, COLS_T=cols_t,
        )
    return q, qt, scale
