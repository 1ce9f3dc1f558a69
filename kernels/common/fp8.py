"""FP8 formats, scaling granularities and the quantization kernels shared by the FP8 GEMMs.

Scaling: `x ~= q * scale` with `scale = amax / FP8_MAX` over the scaling group, `q` saturated to the
format's range. Granularities:
- TENSORWISE: one scale per tensor (per segment: per expert weight for grouped weights).
- ROWWISE: one scale per row along the reduction dim (per token, per output channel).
- BLOCKWISE: 1x128 blocks along the reduction dim for activations and gradients, 128x128 blocks
  for weights.

Every layout a GEMM pass needs comes out of one kernel that reads the high-precision tensor once:
`quantize_rows` (reduction dim contiguous), `quantize_cols_t` (reduction along rows, written
transposed so the GEMM reads it K-major; scaling groups never cross group boundaries, as the
variable-K wgrad of a grouped GEMM requires) and `quantize_blocks_2d` (128x128 weight blocks,
written in both orientations with one set of scales).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch
import triton
import triton.language as tl

from kernels.common.device import interpreter_mode

BLOCK = 128
FP8_MAX: dict[torch.dtype, float] = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
# (mantissa bits, smallest normal exponent) of each format, for the interpreter's rounding below.
FP8_GRID: dict[torch.dtype, tuple[int, int]] = {torch.float8_e4m3fn: (3, -6), torch.float8_e5m2: (2, -14)}
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
def _to_fp8_range(x, FP8_MAX: tl.constexpr, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr, EMULATE: tl.constexpr):
    """Saturate to the format's range; under the CPU interpreter also round to the fp8 grid.

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
    tl.atomic_max(amax_ptr + seg, tl.max(acc))


@triton.jit
def _quantize_rows_kernel(
    x_ptr, q_ptr, scale_ptr, amax_ptr,
    R, C, stride_xr, stride_qr, SEGMENT_ROWS,
    FP8_MAX: tl.constexpr, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr, EMULATE: tl.constexpr, EPS: tl.constexpr,
    MODE: tl.constexpr,  # 0 tensorwise (amax per segment given), 1 rowwise, 2 blockwise 1x128
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
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
        x = tl.load(x_ptr + rows[:, None] * stride_xr + cols[None, :], mask=mask).to(tl.float32)
        if MODE == 2:  # BLOCK_C == 128: one scale per row per block
            scale = tl.maximum(tl.max(tl.abs(x), axis=1), EPS) / FP8_MAX
            tl.store(scale_ptr + rows * tl.cdiv(C, BLOCK_C) + c0 // BLOCK_C, scale, mask=row_mask)
        q = _to_fp8_range(x / scale[:, None], FP8_MAX, MANTISSA, MIN_EXP, EMULATE)
        tl.store(q_ptr + rows[:, None] * stride_qr + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _token_block(tb, block_group_ptr, offs_ptr, padded_offs_ptr, G, BLOCK_T: tl.constexpr):
    """Rows of x behind padded token block `tb`, their mask, and the block's group (clamped to G-1).

    Blocks past the last group (the buffer's slack) get an all-false mask: they write zeros.
    """
    g = tl.load(block_group_ptr + tb)
    last = tl.minimum(g, G - 1)
    start = tl.load(offs_ptr + last)
    end = tl.where(g < G, tl.load(offs_ptr + last + 1), start)  # a slack block: empty row range
    j = tb - tl.load(padded_offs_ptr + last) // BLOCK_T
    rows = start + j * BLOCK_T + tl.arange(0, BLOCK_T)
    return rows, rows < end, last


@triton.jit
def _cols_t_amax_kernel(
    x_ptr, amax_ptr, offs_ptr, padded_offs_ptr, block_group_ptr, G, C, stride_xm,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """amax[g, c] over group g's rows, one program per (128-row block, column block): balanced under skew."""
    tb = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    rows, row_mask, g = _token_block(tb, block_group_ptr, offs_ptr, padded_offs_ptr, G, BLOCK_T)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=row_mask[:, None] & (cols[None, :] < C))
    # A block without rows contributes 0, the amax's initial value: no need to mask it out.
    tl.atomic_max(amax_ptr + g * C + cols, tl.max(tl.abs(x.to(tl.float32)), axis=0), mask=cols < C)


@triton.jit
def _quantize_cols_t_kernel(
    x_ptr, qt_ptr, scale_ptr, offs_ptr, padded_offs_ptr, block_group_ptr,
    G, C, stride_xm, stride_qc, stride_sg, stride_sc, stride_sb,
    FP8_MAX: tl.constexpr, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr, EMULATE: tl.constexpr, EPS: tl.constexpr,
    BLOCKWISE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """q^T[c, 128*tb + i] for padded token block tb (grid: padded blocks x column blocks).

    Scales: given per (group, column) through strides (tensorwise, rowwise), or computed per
    column of this 128-row block (BLOCKWISE) and stored at [c, tb]. Every column of q^T is
    written, padding and slack as zeros, at 128-aligned offsets (vectorized stores).
    """
    tb = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < C
    rows, row_mask, g = _token_block(tb, block_group_ptr, offs_ptr, padded_offs_ptr, G, BLOCK_T)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=row_mask[:, None] & col_mask[None, :])
    x = x.to(tl.float32)
    if BLOCKWISE:
        scale = tl.maximum(tl.max(tl.abs(x), axis=0), EPS) / FP8_MAX
        tl.store(scale_ptr + cols * stride_sc + tb * stride_sb, scale, mask=col_mask)
    else:
        scale = tl.load(scale_ptr + g * stride_sg + cols * stride_sc, mask=col_mask, other=1.0)
    q = _to_fp8_range(x / scale[None, :], FP8_MAX, MANTISSA, MIN_EXP, EMULATE).to(qt_ptr.dtype.element_ty)
    dest = tl.multiple_of(tb * BLOCK_T, BLOCK_T) + tl.arange(0, BLOCK_T)
    tl.store(qt_ptr + cols[:, None] * stride_qc + dest[None, :], tl.trans(q), mask=col_mask[:, None])


@triton.jit
def _quantize_blocks_2d_kernel(
    w_ptr, q_ptr, qt_ptr, scale_ptr, R, C,
    FP8_MAX: tl.constexpr, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr, EMULATE: tl.constexpr, EPS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """One 128x128 block of w[g] ([G, R, C]) -> q[g] ([G, R, C]) and q^T[g] ([G, C, R]), one scale."""
    g = tl.program_id(0).to(tl.int64)
    rb, cb = tl.program_id(1), tl.program_id(2)
    rows = rb * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    cols = cb * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    base = g * R * C
    w = tl.load(w_ptr + base + rows[:, None] * C + cols[None, :], mask=mask).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(w)), EPS) / FP8_MAX
    tl.store(scale_ptr + (g * tl.num_programs(1) + rb) * tl.num_programs(2) + cb, scale)
    q = _to_fp8_range(w / scale, FP8_MAX, MANTISSA, MIN_EXP, EMULATE).to(q_ptr.dtype.element_ty)
    tl.store(q_ptr + base + rows[:, None] * C + cols[None, :], q, mask=mask)
    tl.store(qt_ptr + base + cols[:, None] * R + rows[None, :], tl.trans(q), mask=tl.trans(mask))


# --- launchers --------------------------------------------------------------------------------------


def _format_args(dtype: torch.dtype) -> dict[str, object]:
    """The constexprs that describe an fp8 format to the quantization kernels."""
    if dtype not in FP8_MAX:
        raise ValueError(f"fp8 dtype must be float8_e4m3fn or float8_e5m2, got {dtype}")
    mantissa, min_exp = FP8_GRID[dtype]
    return {"FP8_MAX": FP8_MAX[dtype], "MANTISSA": mantissa, "MIN_EXP": min_exp, "EMULATE": interpreter_mode()}


def segment_amax(x: torch.Tensor, segment_rows: int) -> torch.Tensor:
    """max |x| over each run of `segment_rows` rows of a 2-D tensor: fp32 [R // segment_rows]."""
    R, C = x.shape
    segments = max(1, triton.cdiv(R, segment_rows))
    amax = torch.zeros(segments, dtype=torch.float32, device=x.device)
    if R and C:
        grid = (segments, triton.cdiv(min(segment_rows, R), 32))
        _segment_amax_kernel[grid](x, amax, R, C, x.stride(0), segment_rows, BLOCK_R=32, BLOCK_C=128)
    return amax


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
        scale, mode = torch.empty((R, triton.cdiv(C, BLOCK)), dtype=torch.float32, device=x.device), 2
    if R and C:
        block_r = 32
        _quantize_rows_kernel[(triton.cdiv(R, block_r),)](
            x, q, scale, amax if amax is not None else scale, R, C, x.stride(0), q.stride(0), segment_rows or 1,
            **fmt, EPS=AMAX_EPS, MODE=mode, BLOCK_R=block_r, BLOCK_C=BLOCK,
        )
    return q, scale


def padded_offsets(group_offs: torch.Tensor) -> torch.Tensor:
    """Group offsets [G+1] with every group's length rounded up to 128 (on the device, no host sync)."""
    lens = group_offs[1:] - group_offs[:-1]
    out = torch.zeros_like(group_offs)
    torch.cumsum(torch.div(lens + BLOCK - 1, BLOCK, rounding_mode="floor") * BLOCK, dim=0, out=out[1:])
    return out


def padded_capacity(rows: int, groups: int) -> int:
    """Columns that hold `rows` rows split into `groups` segments each padded to 128, whatever the split."""
    return triton.cdiv(rows + groups * (BLOCK - 1), BLOCK) * BLOCK


def quantize_cols_t(
    x: torch.Tensor,
    group_offs: torch.Tensor,
    fp8_dtype: torch.dtype,
    granularity: Granularity,
    per_segment_tensor_scale: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize a row-major [M, C] tensor along its rows within each group, written transposed.

    Rows [group_offs[g], group_offs[g+1]) form group g. Returns (q^T, scale, padded_offs): q^T is
    [C, padded_capacity(M, G)] with group g in columns [padded_offs[g], padded_offs[g+1]), each
    group padded with zeros to a multiple of 128 so readers take aligned, unmasked 128-token
    blocks. scale: TENSORWISE [1] (or [G] with `per_segment_tensor_scale`, for equal-sized groups
    such as stacked expert weights), ROWWISE [G, C], BLOCKWISE [C, capacity / 128] indexed by the
    padded column // 128 (blocks never cross groups). The kernels run one program per 128-row
    block, so a group holding most tokens gets most programs (skew-balanced).
    """
    if x.ndim != 2 or x.stride(1) != 1:
        raise ValueError(f"quantize_cols_t: x must be 2-D with contiguous rows, got {tuple(x.shape)}")
    M, C = x.shape
    G = group_offs.numel() - 1
    fmt = _format_args(fp8_dtype)
    fmax = FP8_MAX[fp8_dtype]
    capacity = padded_capacity(M, G)
    padded = padded_offsets(group_offs)
    # Group of every padded 128-row block, found on the device (G for the slack past the last group).
    block_group = torch.searchsorted(padded[1:], torch.arange(0, capacity, BLOCK, device=x.device), right=True)
    qt = torch.empty((C, capacity), dtype=fp8_dtype, device=x.device)
    block_c = 64
    grid = (capacity // BLOCK, triton.cdiv(C, block_c))
    if granularity == Granularity.TENSORWISE:
        segment_rows = M // G if per_segment_tensor_scale and G else max(M, 1)
        scale = torch.clamp_min(segment_amax(x, segment_rows), AMAX_EPS) / fmax
        strides = (int(per_segment_tensor_scale), 0, 0)
    elif granularity == Granularity.ROWWISE:
        amax = torch.zeros((max(G, 1), C), dtype=torch.float32, device=x.device)
        if G and C:
            _cols_t_amax_kernel[grid](x, amax, group_offs, padded, block_group, G, C, x.stride(0),
                                      BLOCK_T=BLOCK, BLOCK_C=block_c)
        scale = torch.clamp_min(amax[:G], AMAX_EPS) / fmax
        strides = (scale.stride(0), scale.stride(1), 0)
    else:
        scale = torch.empty((C, capacity // BLOCK), dtype=torch.float32, device=x.device)
        strides = (0, scale.stride(0), scale.stride(1))
    if G and C:
        _quantize_cols_t_kernel[grid](
            x, qt, scale, group_offs, padded, block_group, G, C, x.stride(0), qt.stride(0), *strides,
            **fmt, EPS=AMAX_EPS, BLOCKWISE=granularity == Granularity.BLOCKWISE, BLOCK_T=BLOCK, BLOCK_C=block_c,
        )
    return qt, scale, padded


def quantize_blocks_2d(w: torch.Tensor, fp8_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """128x128 block quantization of a contiguous [G, R, C] tensor.

    Returns (q [G, R, C], q^T [G, C, R], scale [G, cdiv(R, 128), cdiv(C, 128)]): both orientations
    share the scales, so the forward and the dgrad read one quantization of the weight.
    """
    if w.ndim != 3 or not w.is_contiguous():
        raise ValueError(f"quantize_blocks_2d: w must be a contiguous [G, R, C] tensor, got {tuple(w.shape)}")
    G, R, C = w.shape
    q = torch.empty_like(w, dtype=fp8_dtype)
    qt = torch.empty((G, C, R), dtype=fp8_dtype, device=w.device)
    grid = (G, triton.cdiv(R, BLOCK), triton.cdiv(C, BLOCK))
    scale = torch.empty(grid, dtype=torch.float32, device=w.device)
    if G and R and C:
        _quantize_blocks_2d_kernel[grid](
            w, q, qt, scale, R, C, **_format_args(fp8_dtype), EPS=AMAX_EPS, BLOCK_SIZE=BLOCK
        )
    return q, qt, scale
