"""Grouped GEMM kernels for MoE experts: one M-grouped kernel (forward and dgrad; tensor descriptors
where TMA can read the operands, pointers elsewhere) and one K-grouped kernel (the variable-K
wgrad), shared by the bf16 op and the FP8 op.

Group g owns rows [offs[g], offs[g+1]) of the token-major tensors (the M-grouped kernel's A may be read
through a row index instead: the rows of a permuted copy never written). `offs` stays on the device: no
host sync, so every launch is CUDA-graph safe and nothing is specialized on group sizes. Operand
layouts are strides, so NT, NN and TN need no copies. FP8 scales are strided views (see
kernels/common/scales.py); SCALE picks where they apply.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.common.device import cdiv, persistent_programs
from kernels.common.fp8 import TokenLayout, token_layout
from kernels.common.launch import fast_launch
from kernels.common.scales import SCALE_EPILOGUE, SCALE_NONE, SCALE_PER_K_BLOCK, Scales
from kernels.common.tiles import TileConfig, grouped_tile
from kernels.common.tma import bind_context, descriptor, stack_tma_layout, tma_layout


@fast_launch
@triton.jit
def _grouped_mm_kernel(
    a_ptr, b_ptr, a_desc, b_desc, c_ptr, offs_ptr, padded_offs_ptr, block_groups_ptr, sa_ptr, sb_ptr, a_rows_ptr,
    G, N, K,
    stride_am, stride_bg, stride_bn, stride_bk, stride_cm,
    stride_sam, stride_sak, stride_sbg, stride_sbn, stride_sbk,
    TMA: tl.constexpr,
    B_K_MAJOR: tl.constexpr,
    SB_OUT_DIV: tl.constexpr,
    SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    EPILOGUE_SLICES: tl.constexpr,
    FLAT: tl.constexpr,
    A_GATHER: tl.constexpr = False,
):
    """C[rows_g] = A[rows_g] @ B_g^T for every group (ACCUMULATE: C += it, summed in fp32); B_g is
    [N, K] through its strides.

    Persistent: NUM_PROGRAMS programs walk the tiles of all groups in order, so the tile count
    (which depends on the group sizes) is never needed on the host; empty groups have no tiles. FLAT: in one
    loop over the row blocks of the groups' token layout (`padded_offs`, `block_groups`: BLOCK_M-row blocks),
    which Triton fuses with the K loop; else a loop over the groups, each walking its own tiles.

    TMA: A and B are read through tensor descriptors. A is one [M, K] descriptor: a tile may run past
    its group's last row into the next group's rows, which only feed output rows the masked store
    drops. B is a 3-D descriptor, so the copy engine zero-fills at each group's own edges; B_K_MAJOR:
    stored [G, N, K], else [G, K, N]. Otherwise masked pointer loads through the strides. A_GATHER: A's rows
    are read through `a_rows_ptr` by pointer loads (cp.async; see _grouped_tile), B as TMA says.
    """
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    if FLAT:
        # One loop over every group's tiles, the group of each read from the token layout: Triton flattens it
        # into the K loop, so the next tile's loads are in flight during this tile's epilogue.
        num_m = (tl.load(padded_offs_ptr + G) // BLOCK_M).to(tl.int32)
        for tile in tl.range(pid, num_m * num_n, NUM_PROGRAMS, flatten=True):
            pid_m, pid_n = grouped_tile(tile, num_m, num_n, GROUP_M)
            g = tl.load(block_groups_ptr + pid_m)
            start = tl.load(offs_ptr + g)
            row0 = start + pid_m * BLOCK_M - tl.load(padded_offs_ptr + g)
            _grouped_tile(a_ptr, b_ptr, a_desc, b_desc, c_ptr, sa_ptr, sb_ptr, a_rows_ptr, g, row0,
                          tl.load(offs_ptr + g + 1), pid_n * BLOCK_N, N, K, stride_am, stride_bg, stride_bn, stride_bk,
                          stride_cm, stride_sam, stride_sak, stride_sbg, stride_sbn, stride_sbk, TMA, B_K_MAJOR,
                          SB_OUT_DIV, SCALE, BLOCK_M, BLOCK_N, BLOCK_K, ACCUMULATE, EPILOGUE_SLICES, A_GATHER)
    else:
        tile = pid
        tiles_before = 0
        for g in range(G):
            start = tl.load(offs_ptr + g)
            end = tl.load(offs_ptr + g + 1)
            num_m = tl.cdiv((end - start).to(tl.int32), BLOCK_M)
            tiles_g = num_m * num_n
            while tile < tiles_before + tiles_g:
                pid_m, pid_n = grouped_tile(tile - tiles_before, num_m, num_n, GROUP_M)
                _grouped_tile(a_ptr, b_ptr, a_desc, b_desc, c_ptr, sa_ptr, sb_ptr, a_rows_ptr, g,
                              start + pid_m * BLOCK_M, end, pid_n * BLOCK_N, N, K, stride_am, stride_bg, stride_bn,
                              stride_bk, stride_cm, stride_sam, stride_sak, stride_sbg, stride_sbn, stride_sbk, TMA,
                              B_K_MAJOR, SB_OUT_DIV, SCALE, BLOCK_M, BLOCK_N, BLOCK_K, ACCUMULATE, EPILOGUE_SLICES,
                              A_GATHER)
                tile += NUM_PROGRAMS
            tiles_before += tiles_g


@triton.jit
def _grouped_tile(a_ptr, b_ptr, a_desc, b_desc, c_ptr, sa_ptr, sb_ptr, a_rows_ptr, g, row0, end, col0, N, K,
                  stride_am, stride_bg, stride_bn, stride_bk, stride_cm,
                  stride_sam, stride_sak, stride_sbg, stride_sbn, stride_sbk,
                  TMA: tl.constexpr, B_K_MAJOR: tl.constexpr, SB_OUT_DIV: tl.constexpr, SCALE: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ACCUMULATE: tl.constexpr,
                  EPILOGUE_SLICES: tl.constexpr, A_GATHER: tl.constexpr):
    """The output tile of group g at rows [row0, row0 + BLOCK_M) (those before `end`) and columns from col0.
    A_GATHER: A's row r is a[a_rows[r]] (zeros where a_rows[r] < 0), its scale that row's: loaded through
    pointers (cp.async), B still by TMA."""
    rows = row0 + tl.arange(0, BLOCK_M)
    cols = col0 + tl.arange(0, BLOCK_N)
    row_mask = rows < end
    col_mask = cols < N
    offs_k = tl.arange(0, BLOCK_K)
    if A_GATHER:
        a_rows = tl.load(a_rows_ptr + rows, mask=row_mask, other=-1)
        a_mask = a_rows >= 0
        a_rows = a_rows.to(tl.int64)
    else:
        a_rows, a_mask = rows, row_mask
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :]
    # int64: a transposed FP8 weight copy has an out-stride of G*N, and G*N*K passes 2**31.
    b_base = b_ptr + tl.cast(g, tl.int64) * stride_bg
    b_ptrs = b_base + cols.to(tl.int64)[:, None] * stride_bn + offs_k[None, :] * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_mask = offs_k < K - kb * BLOCK_K
        if TMA and not A_GATHER:
            a = a_desc.load([row0.to(tl.int32), kb * BLOCK_K])
        else:
            a = tl.load(a_ptrs, mask=a_mask[:, None] & k_mask[None, :], other=0.0)
            a_ptrs += BLOCK_K
        if TMA:
            if B_K_MAJOR:
                b = b_desc.load([g, col0, kb * BLOCK_K]).reshape(BLOCK_N, BLOCK_K).T
            else:
                b = b_desc.load([g, kb * BLOCK_K, col0]).reshape(BLOCK_K, BLOCK_N)
        else:
            b = tl.load(b_ptrs, mask=col_mask[:, None] & k_mask[None, :], other=0.0).T
            b_ptrs += BLOCK_K * stride_bk
        if SCALE == 2:  # blockwise: promote each K block's product with its own scales
            sa = tl.load(sa_ptr + a_rows * stride_sam + kb * stride_sak, mask=a_mask, other=0.0)
            sb_g = sb_ptr + g * stride_sbg + kb * stride_sbk
            if SB_OUT_DIV % BLOCK_N == 0:  # the tile lies in one 128-wide weight block: one scale
                acc += tl.dot(a, b) * (sa * tl.load(sb_g + (col0 // SB_OUT_DIV) * stride_sbn))[:, None]
            else:
                sb = tl.load(sb_g + (cols // SB_OUT_DIV) * stride_sbn, mask=col_mask, other=0.0)
                acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
        else:
            acc = tl.dot(a, b, acc)
    sa = tl.load(sa_ptr + a_rows * stride_sam, mask=a_mask, other=0.0) if SCALE == 1 else None
    _store_tile(acc, c_ptr + rows[:, None] * stride_cm, row_mask, col0, N, sa, sb_ptr + g * stride_sbg,
                stride_sbn, SB_OUT_DIV, SCALE == 1, ACCUMULATE, EPILOGUE_SLICES)


@fast_launch
@triton.jit
def _grouped_mm_vark_kernel(
    x_ptr, y_ptr, x_desc, y_desc, c_ptr, offs_ptr, sx_ptr, sy_ptr,
    P, Q,
    stride_xp, stride_xt, stride_yq, stride_yt, stride_cg, stride_cp,
    stride_sxg, stride_sxp, stride_sxb, stride_syg, stride_syq, stride_syb,
    SCALE: tl.constexpr,
    PADDED: tl.constexpr,
    TMA: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    EPILOGUE_SLICES: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_P: tl.constexpr,
):
    """C[g] = X_g @ Y_g^T, reducing over group g's tokens t in [offs[g], offs[g+1]) (variable K).

    X is [P, tokens] and Y is [Q, tokens] through their strides: token-major bf16 operands, or the
    K-major transposed FP8 copies, whose groups are PADDED to whole zero-filled 128-token blocks
    (aligned, unmasked loads; the j-th block of a group is block offs[g] // 128 + j). TMA (padded,
    K-major operands): both read through tensor descriptors, the copy engine zero-filling past P and
    Q. Grid: (tiles of one [P, Q] output, groups); an empty group's tiles store zeros. ACCUMULATE:
    C[g] += the product instead (gradient accumulation into a main_grad buffer, fp32 sums).
    EPILOGUE_SLICES (1, 2 or 4): the output tile stored in that many column slices (_store_tile).
    """
    g = tl.program_id(1)
    pid_p, pid_q = grouped_tile(tl.program_id(0), tl.cdiv(P, BLOCK_P), tl.cdiv(Q, BLOCK_Q), GROUP_P)

    start = tl.load(offs_ptr + g)
    end = tl.load(offs_ptr + g + 1)
    if PADDED:  # tell the compiler what the padding guarantees: aligned starts, vectorized loads
        start = tl.multiple_of(start, 128)
    ps = (pid_p * BLOCK_P + tl.arange(0, BLOCK_P)).to(tl.int64)
    qs = (pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)).to(tl.int64)
    p_mask = ps < P
    q_mask = qs < Q
    offs_t = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + ps[:, None] * stride_xp + (start + offs_t)[None, :] * stride_xt
    y_ptrs = y_ptr + qs[:, None] * stride_yq + (start + offs_t)[None, :] * stride_yt
    acc = tl.zeros((BLOCK_P, BLOCK_Q), dtype=tl.float32)
    if SCALE == 2:
        blk = start // BLOCK_K
    for kb in range(0, tl.cdiv((end - start).to(tl.int32), BLOCK_K)):
        if TMA:
            t0 = (start + kb * BLOCK_K).to(tl.int32)
            x = x_desc.load([pid_p * BLOCK_P, t0])
            y = y_desc.load([pid_q * BLOCK_Q, t0])
        elif PADDED:
            x = tl.load(x_ptrs, mask=p_mask[:, None], other=0.0)
            y = tl.load(y_ptrs, mask=q_mask[:, None], other=0.0)
        else:
            t_mask = offs_t < end - start - kb * BLOCK_K
            x = tl.load(x_ptrs, mask=p_mask[:, None] & t_mask[None, :], other=0.0)
            y = tl.load(y_ptrs, mask=q_mask[:, None] & t_mask[None, :], other=0.0)
        if SCALE == 2:
            sx = tl.load(sx_ptr + ps * stride_sxp + blk * stride_sxb, mask=p_mask, other=0.0)
            sy = tl.load(sy_ptr + qs * stride_syq + blk * stride_syb, mask=q_mask, other=0.0)
            acc += tl.dot(x, y.T) * sx[:, None] * sy[None, :]
            blk += 1
        else:
            acc = tl.dot(x, y.T, acc)
        x_ptrs += BLOCK_K * stride_xt
        y_ptrs += BLOCK_K * stride_yt
    sx = tl.load(sx_ptr + g * stride_sxg + ps * stride_sxp, mask=p_mask, other=0.0) if SCALE == 1 else None
    _store_tile(acc, c_ptr + tl.cast(g, tl.int64) * stride_cg + ps[:, None] * stride_cp, p_mask, pid_q * BLOCK_Q, Q,
                sx, sy_ptr + g * stride_syg, stride_syq, 1, SCALE == 1, ACCUMULATE, EPILOGUE_SLICES)


@triton.jit
def _store_tile(acc, c_rows, row_mask, col0, N, row_scale, col_scale_ptr, stride_col_scale,
                COL_SCALE_DIV: tl.constexpr, SCALED: tl.constexpr, ACCUMULATE: tl.constexpr, SLICES: tl.constexpr):
    """Store an output tile whose columns start at col0: `c_rows` points at each of its rows' first element of C.
    SCALED: times row_scale (per row) and the column scales at col_scale_ptr (column j's at
    (j // COL_SCALE_DIV) * stride_col_scale); ACCUMULATE: C's values added (fp32 sums). SLICES (1, 2 or 4): column
    slices stored one after the other, so C's tile and its addresses take a slice's registers beside the
    accumulator (whole, an accumulating 128x256 tile spills 376-924 bytes a thread under Triton 3.6)."""
    if SLICES == 1:
        _store_columns(acc, c_rows, row_mask, col0, N, row_scale, col_scale_ptr, stride_col_scale,
                       COL_SCALE_DIV, SCALED, ACCUMULATE)
    else:
        left, right = _column_halves(acc)
        _store_tile(left, c_rows, row_mask, col0, N, row_scale, col_scale_ptr, stride_col_scale,
                    COL_SCALE_DIV, SCALED, ACCUMULATE, SLICES // 2)
        _store_tile(right, c_rows, row_mask, col0 + acc.shape[1] // 2, N, row_scale, col_scale_ptr,
                    stride_col_scale, COL_SCALE_DIV, SCALED, ACCUMULATE, SLICES // 2)


@triton.jit
def _column_halves(tile):
    return tl.split(tl.permute(tl.reshape(tile, (tile.shape[0], 2, tile.shape[1] // 2)), (0, 2, 1)))


@triton.jit
def _store_columns(acc, c_rows, row_mask, col0, N, row_scale, col_scale_ptr, stride_col_scale,
                   COL_SCALE_DIV: tl.constexpr, SCALED: tl.constexpr, ACCUMULATE: tl.constexpr):
    """_store_tile's work on one slice: columns [col0, col0 + acc's width)."""
    cols = col0 + tl.arange(0, acc.shape[1])
    col_mask = cols < N
    if SCALED:
        col_scale = tl.load(col_scale_ptr + (cols // COL_SCALE_DIV) * stride_col_scale, mask=col_mask, other=0.0)
        acc = acc * row_scale[:, None] * col_scale[None, :]
    c_ptrs = c_rows + cols[None, :]
    mask = row_mask[:, None] & col_mask[None, :]
    if ACCUMULATE:
        acc += tl.load(c_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(c_ptrs, acc.to(c_ptrs.dtype.element_ty), mask=mask)


def flat_tiles(operand_bytes: int, K: int, output_bytes: int) -> bool:
    """Whether the M-grouped kernel walks every group's tiles in one loop (each tile's group from a token layout)
    that Triton flattens into the K loop, so that the next tile's loads are in flight during this tile's
    epilogue, rather than group by group (more than one group, scales applied after the K loop). H100
    against the nested loops (benchmarks/flat_tiles_ab.py, MoE forward and dgrad passes): FP8 rowwise
    1.00-1.31x (SonicMoE's Down forward, K 512: 1.31x; its GateUP dgrad, K 1024: 1.14x); bf16 1.08-1.15x at
    K <= 1024, 0.96-1.02x above (docs/performance.md, "The grouped kernel's tiles in one flattened loop").

    Not for an fp32 output: the stages' buffers stay allocated through the flattened loop's epilogue, and the
    conversion of an fp32 tile beside them outgrows an SM's shared memory (the tuned FP8 128x256 tiles: 279 /
    328 KB at 3 / 4 stages against 227 KB, where a bf16 tile takes 180 / 229 KB and the nested loops 147 / 197;
    tests/test_grouped_gemm.py compiles them)."""
    return output_bytes <= 2 and (operand_bytes == 1 or K <= 1024)


def epilogue_slices(accumulate: bool) -> int:
    """Column slices of a grouped kernel's epilogue (see _store_tile): two where it adds into C. H100, adding into
    a bf16 main_grad, against one slice: FP8 var-K wgrads 1.028-1.060x (128x256 and 4-warp 128x128 tiles; four
    slices 0.89-0.98x), into an fp32 one 1.445x, the dense wgrad on the M-grouped kernel 1.066-1.070x; writing
    a fresh gradient 0.995-1.001x, so one slice there (docs/performance.md, "The accumulating epilogue's
    spills")."""
    return 2 if accumulate else 1


def grouped_mm(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out: torch.Tensor, cfg: TileConfig,
    scales: Scales | None = None, accumulate: bool = False, layout: TokenLayout | None = None,
    a_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[rows_g] = a[rows_g] @ b[g]^T (`accumulate`: out[rows_g] += it): a [M, K] with contiguous rows,
    b [G, N, K] any strides.

    Through tensor descriptors when the operands meet TMA's 16-byte rules (tma_layout,
    stack_tma_layout), else through pointers. Tiles in one flattened loop where `flat_tiles` says so, their
    groups from `layout` (the groups' token layout, as quantize_both returns it) if it has BLOCK_M-row blocks,
    else from one made here (one more launch). `a_rows` (int32 [M]): A's row r is a[a_rows[r]] (zeros where
    a_rows[r] < 0), with that row's scale: the rows of a permuted copy of a, read without it being written."""
    (M, K), (G, N, _) = a.shape, b.shape
    if a_rows is not None:
        if a_rows.dtype != torch.int32 or a_rows.ndim != 1:
            raise ValueError(f"grouped_mm: a_rows must be int32 [M], got {a_rows.dtype} {list(a_rows.shape)}")
        M = a_rows.numel()
    per_k_block = scales is not None and scales.per_k_block
    if per_k_block and cfg.BLOCK_K != 128:
        raise ValueError(f"blockwise scaling needs BLOCK_K=128, got {cfg.BLOCK_K}")
    if M == 0 or N == 0:
        return out
    # Each group adds at most one partial row tile: an upper bound that needs no group sizes.
    row_blocks = cdiv(M, cfg.BLOCK_M) + G
    programs = persistent_programs(a.device, row_blocks * cdiv(N, cfg.BLOCK_N))
    s = scales or Scales(a, (0, 0), a, (0, 0, 0))
    mode = SCALE_NONE if scales is None else scales.mode
    b_k_major = stack_tma_layout(b)
    tma = tma_layout(a) is True and b_k_major is not None
    a_desc = b_desc = None
    if G > 1 and not per_k_block and flat_tiles(a.element_size(), K, out.element_size()):
        if layout is None or layout.block != cfg.BLOCK_M:
            layout = token_layout(offs, row_blocks, cfg.BLOCK_M)
    else:
        layout = None
    if tma:
        bind_context(a.device)
        b_stored = b if b_k_major else b.transpose(1, 2)
        b_block = [1, cfg.BLOCK_N, cfg.BLOCK_K] if b_k_major else [1, cfg.BLOCK_K, cfg.BLOCK_N]
        if a_rows is None:
            a_desc = descriptor(a, [cfg.BLOCK_M, cfg.BLOCK_K])
        b_desc = descriptor(b_stored, b_block)
    _grouped_mm_kernel[(programs,)](
        a, b, a_desc, b_desc, out, offs, *((layout.padded_offs, layout.block_groups) if layout else (offs, offs)),
        s.a, s.b, a if a_rows is None else a_rows, G, N, K,
        a.stride(0), b.stride(0), b.stride(1), b.stride(2), out.stride(0),
        *s.a_strides, *s.b_strides,
        TMA=tma, B_K_MAJOR=bool(b_k_major), SB_OUT_DIV=s.b_out_div, SCALE=mode,
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M,
        NUM_PROGRAMS=programs, ACCUMULATE=accumulate, EPILOGUE_SLICES=epilogue_slices(accumulate),
        FLAT=layout is not None, A_GATHER=a_rows is not None, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


@dataclass(frozen=True)
class VarKScales:
    """Scale views for the variable-K kernel: X's indexed [group, p, token_block], Y's [group, q, token_block]."""

    x: torch.Tensor
    x_strides: tuple[int, int, int]
    y: torch.Tensor
    y_strides: tuple[int, int, int]
    per_k_block: bool = False


def grouped_mm_vark(
    x: torch.Tensor, y: torch.Tensor, offs: torch.Tensor, out: torch.Tensor, cfg: TileConfig,
    scales: VarKScales | None = None, padded: bool = False, accumulate: bool = False,
) -> torch.Tensor:
    """out[g] = x[:, cols_g] @ y[:, cols_g]^T (`accumulate`: out[g] += it): x [P, M], y [Q, M] (any
    strides), out [G, P, Q] with unit-stride rows.

    `padded`: x and y hold every group zero-padded to whole 128-token blocks at 128-aligned
    `offs` (as quantize_both writes them).
    """
    (P, _), (Q, _) = x.shape, y.shape
    G = offs.numel() - 1
    if scales is not None and scales.per_k_block and cfg.BLOCK_K != 128:
        raise ValueError(f"blockwise scaling needs BLOCK_K=128, got {cfg.BLOCK_K}")
    if padded and 128 % cfg.BLOCK_K:
        raise ValueError(f"padded groups need BLOCK_K to divide 128, got {cfg.BLOCK_K}")
    if G == 0 or P == 0 or Q == 0:
        return out
    s = scales or VarKScales(x, (0, 0, 0), x, (0, 0, 0))
    mode = SCALE_NONE if scales is None else (SCALE_PER_K_BLOCK if scales.per_k_block else SCALE_EPILOGUE)
    grid = (cdiv(P, cfg.BLOCK_M) * cdiv(Q, cfg.BLOCK_N), G)
    # Padded K-major operands (the FP8 wgrad's) are whole 128-token blocks TMA can read; the bf16
    # token-major ones have groups that end mid-tile, which only masks can cut.
    tma = padded and tma_layout(x) is True and tma_layout(y) is True
    x_desc = y_desc = None
    if tma:
        bind_context(x.device)
        x_desc = descriptor(x, [cfg.BLOCK_M, cfg.BLOCK_K])
        y_desc = descriptor(y, [cfg.BLOCK_N, cfg.BLOCK_K])
    _grouped_mm_vark_kernel[grid](
        x, y, x_desc, y_desc, out, offs, s.x, s.y,
        P, Q,
        x.stride(0), x.stride(1), y.stride(0), y.stride(1), out.stride(0), out.stride(1),
        *s.x_strides, *s.y_strides,
        SCALE=mode, PADDED=padded, TMA=tma, ACCUMULATE=accumulate,
        EPILOGUE_SLICES=epilogue_slices(accumulate),
        BLOCK_P=cfg.BLOCK_M, BLOCK_Q=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_P=cfg.GROUP_M,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out
