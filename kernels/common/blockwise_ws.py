"""FP8 GEMM on Hopper with warp specialization (Gluon), blockwise above all: forward, dgrad and wgrad, dense and
grouped.

Blockwise scaling (1x128 activations, 128x128 weights) promotes each 128-wide K block's product into
the fp32 accumulator with that block's scales, so every K block's MMA must finish before its
result can be scaled. A Triton `tl.dot` kernel then waits for the tensor cores after each K block,
and its CTA-wide barriers keep its warpgroups in step: the FMAs of promotion never overlap an MMA.

Here the roles are split (DeepGEMM's design): one producer warp streams A and B tiles through a ring
of shared-memory stages with TMA, and two consumer warpgroups, each owning 64 rows of the 128-row
tile, issue the MMA of a stage, release the stage, and scale. The two consumers synchronize through
the stage barriers, and in the forward through a pair of turn barriers a stage that orders their MMAs
(ping-pong), so while one scales the other's MMA runs.

The M-grouped walk keeps one accumulator: the sum so far divided by the current K block's scale, so
each block's MMA adds its raw product into it (rescaled by previous / current scale first). That is
what lets a consumer own a 64x256 tile (128 registers a thread, where a sum and a separate product
would need 256): 128x256 tiles read each A tile once per 256 columns and halve the stage traffic per
FLOP, as the rowwise kernels' tiles do. The token reduction scales per column as well (an outer
product of scales): up to 128 wide it keeps each block's product separate and promotes it; at 256 wide
the consumers split the tile by columns (128 each, all 128 rows), each keeping rescaled sums too, by an
outer product of row ratios and column ratios, the latter computed by the producer warp into shared
memory, and an accumulating sum starts from C.

One kernel, two ways to group (TOKEN_REDUCTION picks):

- M-grouped (the forward and the dgrad, `blockwise_mm`): C[rows_g] = A[rows_g] @ B_g^T with A [tokens, K]
  and B [G * N, K] (or [N, G * stride], each group's K range beside the others': `_weight_view`), A
  scaled per row and 128-wide K block, B per 128x128 block. A tile may read past its group's last row
  (or B's last column into the next group's rows): those products only feed outputs the masked store
  drops.
- Token reduction (the wgrad, `blockwise_token_mm`): C[g] = X_g @ Y_g^T over group g's tokens, X [P,
  tokens] and Y [Q, tokens] both quantized along the tokens (1x128: per row and 128-token block, so the
  promotion scales by an outer product), each group's tokens zero-padded to whole 128-token blocks.
  Every group owns a whole [P, Q] output; an empty group's tiles store zeros (or add nothing).

Scales constant along K (rowwise, tensorwise: PER_K_BLOCK off) take either walk too: the MMAs add into
one accumulator back to back with one in flight, and the scales multiply the sum once before the store.
Against the Triton kernels the rowwise passes run on (H200, 2026-11-28, docs/performance.md "Descriptors
encoded once, and the rowwise FP8 passes on the warp-specialized kernel"), the GEMMs alone ran 1.00-1.04x the
grouped kernel's forwards and 0.68-0.86x on a small ragged one; in training microbatches (graphed) the
rowwise buckets on it ran 0.92-1.03x, so the tables keep them on the Triton kernels (WS 0) and the search may
move them.

Both operands are fp8 and K-major; a dense GEMM is one group. ACCUMULATE adds into C (fp32 sums, a
main_grad's gradient accumulation). Gluon kernels do not run in the CPU interpreter; `supported` says
when this kernel can take a launch.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from kernels.common.device import SHARED_MEMORY_BYTES, cdiv, interpreter_mode, is_hopper, persistent_programs
from kernels.common.gluon_tma import descriptor
from kernels.common.launch import fast_launch
from kernels.common.scales import Scales
from kernels.common.tiles import TileConfig
from kernels.common.tma import bind_context, tma_layout

# The TMA load's name since Triton 3.7 (async_copy_global_to_shared before, which 3.7 turned into an error).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# The CTA's (a partition's, under warp specialization) thread barrier: gl.barrier since Triton 3.7 or so,
# gl.thread_barrier before.
_thread_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

BLOCK_M = gl.constexpr(128)  # two consumer warpgroups of 64 rows
HALF_M = gl.constexpr(64)
BLOCK_K = gl.constexpr(128)  # the scale block
# The smallest scale the M-grouped walk divides by: a zero scale (an all-zero block) would make its
# rescaling 0/0. A block under it adds its product times 1e-30 instead of times 0, and the rescaled sum
# stays finite while the output is under 3e8.
MIN_SCALE = gl.constexpr(1e-30)


@gluon.jit
def _group_rows(offs_ptr, g, M, G, GROUPED: gl.constexpr):
    """Rows [start, end) of group g (clamped to the last group, for the walk's final step)."""
    if GROUPED:
        g = gl.minimum(g, G - 1)
        return gl.load(offs_ptr + g).to(gl.int32), gl.load(offs_ptr + g + 1).to(gl.int32)
    return gl.to_tensor(0), gl.to_tensor(M)  # tensors even where M was specialized to a constant


@gluon.jit
def _find_group(tile, g, tiles_before, offs_ptr, M, G, num_n, GROUPED: gl.constexpr):
    """Move (g, tiles_before) forward to the group that holds `tile`; g reaches G past the last tile.
    Empty groups hold no tiles and are stepped over."""
    start, end = _group_rows(offs_ptr, g, M, G, GROUPED)
    tiles_g = gl.cdiv(end - start, BLOCK_M) * num_n
    while (g < G) & (tile >= tiles_before + tiles_g):
        tiles_before += tiles_g
        g += 1
        start, end = _group_rows(offs_ptr, g, M, G, GROUPED)
        tiles_g = gl.cdiv(end - start, BLOCK_M) * num_n
    return g, tiles_before, start, end


@gluon.jit
def _tile_origin(tile, tiles_before, start, end, num_n, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """First row and column of a group's tile, walked in grouped-M order so operands stay in L2."""
    num_m = gl.cdiv(end - start, BLOCK_M)
    local = tile - tiles_before
    band = GROUP_M * num_n
    first_m = (local // band) * GROUP_M
    band_m = gl.minimum(num_m - first_m, GROUP_M)
    return start + (first_m + (local % band) % band_m) * BLOCK_M, ((local % band) // band_m) * BLOCK_N


@gluon.jit
def _tile_at(tile, g, tiles_before, offs_ptr, M, N, K, G,
             BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, GROUPED: gl.constexpr, TOKEN_REDUCTION: gl.constexpr):
    """Where `tile` lies, walking on from an earlier tile's (g, tiles_before): its group (G past the last
    tile), the walk's new state, the tile's first row and column, the first K element, the number of K
    blocks, and the end of the rows the tile may write."""
    num_n = gl.cdiv(N, BLOCK_N)
    if TOKEN_REDUCTION:  # every group: a whole [M, N] output over its own K range (tokens)
        tiles_g = gl.cdiv(M, BLOCK_M) * num_n
        g = tile // tiles_g
        tiles_before = g * tiles_g
        k_start, k_end = _group_rows(offs_ptr, g, K, G, GROUPED)
        row0, col0 = _tile_origin(tile, tiles_before, gl.to_tensor(0), M, num_n, BLOCK_N, GROUP_M)
        row_end = gl.to_tensor(M)
    else:  # groups own rows of A; every tile reduces over all of K
        g, tiles_before, start, row_end = _find_group(tile, g, tiles_before, offs_ptr, M, G, num_n, GROUPED)
        row0, col0 = _tile_origin(tile, tiles_before, start, row_end, num_n, BLOCK_N, GROUP_M)
        k_start = gl.to_tensor(0)
        k_end = gl.to_tensor(K)
    return g, tiles_before, row0, col0, k_start, gl.cdiv(k_end - k_start, BLOCK_K), row_end


@gluon.jit
def _load_partition(a_desc, b_desc, a_bufs, b_bufs, ratio_bufs, ready, free, sb_ptr, offs_ptr, M, N, K, G,
                    stride_sbn, stride_sbk, b_group_rows, b_group_cols, BLOCK_N: gl.constexpr,
                    GROUP_M: gl.constexpr, STAGES: gl.constexpr, GROUPED: gl.constexpr,
                    TOKEN_REDUCTION: gl.constexpr, NUM_PROGRAMS: gl.constexpr, PER_K_BLOCK: gl.constexpr):
    stage_bytes: gl.constexpr = 2 * a_desc.block_type.nbytes + b_desc.block_type.nbytes
    # The wide token reduction's column ratios (see _mma_partition): BLOCK_N // 32 columns a lane.
    ratio_layout: gl.constexpr = gl.BlockedLayout([BLOCK_N // 32], [32], [1], [0])
    tile = gl.program_id(0)
    it = 0
    g, tiles_before, row0, col0, k0, k_tiles, _row_end = _tile_at(
        tile, gl.to_tensor(0), gl.to_tensor(0), offs_ptr, M, N, K, G, BLOCK_N, GROUP_M, GROUPED, TOKEN_REDUCTION)
    while g < G:
        # B's tile: the token reduction's own tokens; M-grouped, group g's weight, its rows after the earlier
        # groups' (b_group_rows apart) or its K range beside theirs (b_group_cols apart).
        b_row0 = col0 if TOKEN_REDUCTION else g * b_group_rows + col0
        b_k0 = 0 if TOKEN_REDUCTION else g * b_group_cols
        if _rescales_columns(TOKEN_REDUCTION, BLOCK_N, PER_K_BLOCK):
            cols = col0 + gl.arange(0, BLOCK_N, layout=ratio_layout)
            # A scalar base and int32 offsets: a tensor of 64-bit pointers would take twice the registers.
            sb_base = sb_ptr + (k0 // BLOCK_K).to(gl.int64) * stride_sbk
            prev_b = gl.full([BLOCK_N], 1.0, gl.float32, ratio_layout)
        for kb in range(k_tiles):
            s = it % STAGES
            if _rescales_columns(TOKEN_REDUCTION, BLOCK_N, PER_K_BLOCK):  # loaded before the wait: latency hidden
                cur_b = gl.maximum(gl.load(sb_base + kb * stride_sbk + cols * stride_sbn, mask=cols < N, other=1.0),
                                   MIN_SCALE)
            # A fresh barrier counts as having completed the phase before its first: the first lap passes.
            mbarrier.wait(free.index(s), ((it // STAGES) & 1) ^ 1)
            if _rescales_columns(TOKEN_REDUCTION, BLOCK_N, PER_K_BLOCK):  # the block's column ratios, its scales
                ratio_bufs.index(2 * s).store(prev_b / cur_b)
                ratio_bufs.index(2 * s + 1).store(cur_b)
                prev_b = cur_b
                _thread_barrier()  # every lane's ratios written before the stage's arrival publishes them
            mbarrier.expect(ready.index(s), stage_bytes)
            k = k0 + kb * BLOCK_K
            _tma_load(a_desc, [row0, k], ready.index(s), a_bufs.index(2 * s))
            _tma_load(a_desc, [row0 + HALF_M, k], ready.index(s), a_bufs.index(2 * s + 1))
            _tma_load(b_desc, [b_row0, b_k0 + k], ready.index(s), b_bufs.index(s))
            it += 1
        tile += NUM_PROGRAMS
        g, tiles_before, row0, col0, k0, k_tiles, _row_end = _tile_at(
            tile, g, tiles_before, offs_ptr, M, N, K, G, BLOCK_N, GROUP_M, GROUPED, TOKEN_REDUCTION)


@gluon.jit
def _c_tile(c_ptr, g, first_row, col0, row_end, N, stride_cg, stride_cm, ROWS: gl.constexpr, COLS: gl.constexpr,
            row_layout: gl.constexpr, col_layout: gl.constexpr):
    """C[g]'s [ROWS, COLS] tile at (first_row, col0), in the layout the slices describe. Past its last row or
    column it reads the last one again (clamped, not masked: a mask per element would take registers beside
    the tile; the store drops what lies past the edges)."""
    rows = gl.minimum(gl.arange(0, ROWS, layout=row_layout), row_end - 1 - first_row)
    cols = gl.minimum(col0 + gl.arange(0, COLS, layout=col_layout), N - 1)
    base = c_ptr + g.to(gl.int64) * stride_cg + first_row.to(gl.int64) * stride_cm
    return gl.load(base + gl.expand_dims(rows * stride_cm, 1) + gl.expand_dims(cols, 0))


@gluon.constexpr_function
def _mma_layout(cols):
    """A consumer warpgroup's fp8 wgmma accumulator, 64 rows x `cols`."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, cols, 32])


@gluon.constexpr_function
def _row_pieces_layout(cols):
    """A 64 x `cols` tile in 16-byte row pieces: each thread 8 consecutive elements of a row (stores, C's reads)."""
    return gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 * 8 // cols, cols // 8], warps_per_cta=[4, 1],
                            order=[1, 0])


@gluon.constexpr_function
def _out_layout(out_dtype, block_n, mma_layout, store_layout):
    """The epilogue's layout: 16-byte rows (store_layout), or for fp32 out of a 256-wide tile the
    accumulator's own (each thread's column pairs, 8 bytes), as converting its 128 registers a thread
    through shared memory spills."""
    return mma_layout if out_dtype == gl.float32 and block_n > BLOCK_K.value else store_layout


@gluon.constexpr_function
def _rescales_columns(token_reduction, block_n, per_k_block):
    """Whether the token reduction keeps rescaled sums (tiles wider than a scale block, where a separate
    product would not fit in registers: _wide_token_tiles) instead of promoting each block's product."""
    return token_reduction and block_n > BLOCK_K.value and per_k_block


@gluon.jit
def _block_scales(sa_ptrs, sb_ptrs, kb, row_ok, has_hi, stride_sak, stride_sbn, stride_sbk, TWO: gl.constexpr):
    """K block kb's scales in the M-grouped walk: A's per row, and the weight block's (and with TWO, the
    next weight block's, for the tile's upper 128 columns; 1.0 past N)."""
    sa = gl.load(sa_ptrs + kb * stride_sak, mask=row_ok, other=1.0)
    sb = gl.load(sb_ptrs + kb * stride_sbk)
    sb_hi = sb
    if TWO:
        sb_hi = gl.load(sb_ptrs + stride_sbn + kb * stride_sbk, mask=has_hi, other=1.0)
    return sa, sb, sb_hi


@gluon.jit
def _await_turn(turns, it, HALF: gl.constexpr, STAGES: gl.constexpr, PING_PONG: gl.constexpr):
    """PING_PONG (the M-grouped walk; see blockwise_mm): the consumers issue their MMAs in turns, consumer 0's
    of step `it`, then consumer 1's, then consumer 0's of step it + 1: consumer 1 waits for consumer 0's
    issue of the same step (turns[it % STAGES]), consumer 0 for consumer 1's of the step before
    (turns[STAGES + (it - 1) % STAGES], which a fresh barrier passes at it = 0). The tensor cores run the
    MMAs in the order they were issued, so one consumer's finish while the other's run and its rescaling
    overlaps them, where two issued at once would share the tensor cores and finish together."""
    if PING_PONG:
        if HALF == 1:
            mbarrier.wait(turns.index(it % STAGES), (it // STAGES) & 1)
        else:
            before = it + STAGES - 1
            mbarrier.wait(turns.index(STAGES + before % STAGES), (before // STAGES + 1) & 1)


@gluon.jit
def _pass_turn(turns, it, HALF: gl.constexpr, STAGES: gl.constexpr, PING_PONG: gl.constexpr):
    """After this consumer issued step `it`'s MMA: the other consumer's turn (see _await_turn)."""
    if PING_PONG:
        mbarrier.arrive(turns.index(HALF * STAGES + it % STAGES), count=1)


@gluon.jit
def _stage_mma(a_bufs, b_bufs, ready, turns, acc, it, HALF: gl.constexpr, STAGES: gl.constexpr,
               PING_PONG: gl.constexpr):
    """This consumer's MMA of step `it` into `acc`, issued asynchronously once the step's stage has landed, in
    its turn (see _await_turn): its 64 rows of A times the stage's B tile."""
    s = it % STAGES
    mbarrier.wait(ready.index(s), (it // STAGES) & 1)
    _await_turn(turns, it, HALF, STAGES, PING_PONG)
    acc = warpgroup_mma(a_bufs.index(2 * s + HALF), b_bufs.index(s).permute((1, 0)), acc, is_async=True)
    _pass_turn(turns, it, HALF, STAGES, PING_PONG)
    return acc


@gluon.jit
def _store_tile(c_ptr, acc, g, first_row, col0, row_end, N, stride_cg, stride_cm, ROWS: gl.constexpr,
                COLS: gl.constexpr, layout: gl.constexpr):
    """C[g]'s [ROWS, COLS] tile at (first_row, col0) = acc, stored in `layout`, masked at the edges."""
    rows = first_row + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    ptrs = (c_ptr + g.to(gl.int64) * stride_cg + gl.expand_dims(rows.to(gl.int64) * stride_cm, 1)
            + gl.expand_dims(cols, 0))
    mask = gl.expand_dims(rows < row_end, 1) & gl.expand_dims(cols < N, 0)
    gl.store(ptrs, gl.convert_layout(acc.to(c_ptr.dtype.element_ty), layout), mask=mask)


@gluon.jit
def _wide_token_tiles(a_bufs, b_bufs, ratio_bufs, ready, free, c_ptr, sa_ptr, offs_ptr, M, N, K, G,
                      stride_cg, stride_cm, stride_sam, stride_sak, HALF: gl.constexpr, BLOCK_N: gl.constexpr,
                      GROUP_M: gl.constexpr, STAGES: gl.constexpr, GROUPED: gl.constexpr,
                      ACCUMULATE: gl.constexpr, NUM_PROGRAMS: gl.constexpr):
    """A consumer's part of the token reduction on tiles wider than a scale block (128 x BLOCK_N): B is
    scaled per row (column of C) and 128-token block too, so each block's product is promoted by an outer
    product of scales. The consumers split the tile by columns: each takes its BLOCK_N / 2 columns over all
    128 rows, as two 64-row accumulators, each the sum so far divided by the current block's row scale and
    column scale, rescaled before each block's MMAs by the row ratios (previous / current, here) and the
    column ratios (the producer's, through shared memory), and by the last block's scales at the end.
    Split by rows (64 x 256 a consumer, until 2026-11-27), each read the whole B tile and twice the column
    ratios a thread; split by columns a block reads a fifth less shared memory (1.00-1.02x on bf16 outputs,
    bit for bit the same), a 64-row output tile half as wide leaves room for 4 stages, and the sums fit
    beside an fp32 C without spills (the row split spilled there, so fp32 outputs took 128x128: 1.35x that
    on a dense 8192^3 wgrad into an fp32 main_grad; H100, scratch A/B, docs/performance.md). ACCUMULATE: the
    sums start from C (in units of 1, the scales before the first block), which leaves the epilogue no C to
    hold beside them."""
    COLS: gl.constexpr = BLOCK_N // 2
    mma_layout: gl.constexpr = _mma_layout(COLS)
    store_layout: gl.constexpr = _row_pieces_layout(COLS)  # the stores and C's reads
    row_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, mma_layout)
    tile = gl.program_id(0)
    it = 0
    g, tiles_before, row0, col0, k0, k_tiles, row_end = _tile_at(
        tile, gl.to_tensor(0), gl.to_tensor(0), offs_ptr, M, N, K, G, BLOCK_N, GROUP_M, GROUPED, True)
    while g < G:
        cols0 = col0 + HALF * COLS
        top = row0 + gl.arange(0, HALF_M, layout=row_layout)
        bottom = top + HALF_M
        first_block = k0 // BLOCK_K
        top_ptrs = sa_ptr + top.to(gl.int64) * stride_sam + first_block * stride_sak
        bottom_ptrs = sa_ptr + bottom.to(gl.int64) * stride_sam + first_block * stride_sak
        top_ok = top < row_end
        bottom_ok = bottom < row_end
        prev_top = gl.full([HALF_M], 1.0, gl.float32, row_layout)
        prev_bottom = prev_top
        sa_top = gl.load(top_ptrs, mask=top_ok & (k_tiles > 0), other=1.0)
        sa_bottom = gl.load(bottom_ptrs, mask=bottom_ok & (k_tiles > 0), other=1.0)
        if ACCUMULATE:  # C read in 16-byte rows, then moved into the accumulators' layout (4 bytes a thread)
            acc_top = gl.convert_layout(_c_tile(c_ptr, g, row0, cols0, row_end, N, stride_cg, stride_cm, HALF_M, COLS,
                                                gl.SliceLayout(1, store_layout), gl.SliceLayout(0, store_layout)),
                                        mma_layout).to(gl.float32)
            acc_bottom = gl.convert_layout(_c_tile(c_ptr, g, row0 + HALF_M, cols0, row_end, N, stride_cg, stride_cm,
                                                   HALF_M, COLS, gl.SliceLayout(1, store_layout),
                                                   gl.SliceLayout(0, store_layout)), mma_layout).to(gl.float32)
        else:
            acc_top = gl.zeros([HALF_M, COLS], gl.float32, mma_layout)
            acc_bottom = gl.zeros([HALF_M, COLS], gl.float32, mma_layout)
        for kb in range(k_tiles):
            s = it % STAGES
            cur_top = gl.maximum(sa_top, MIN_SCALE)
            cur_bottom = gl.maximum(sa_bottom, MIN_SCALE)
            ratio_top = gl.expand_dims(prev_top / cur_top, 1)
            ratio_bottom = gl.expand_dims(prev_bottom / cur_bottom, 1)
            prev_top = cur_top
            prev_bottom = cur_bottom
            following = gl.minimum(kb + 1, k_tiles - 1)  # the next block's row scales, loaded a block ahead
            sa_top = gl.load(top_ptrs + following * stride_sak, mask=top_ok, other=1.0)
            sa_bottom = gl.load(bottom_ptrs + following * stride_sak, mask=bottom_ok, other=1.0)
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            ratio_cols = gl.expand_dims(ratio_bufs.index(2 * s).slice(HALF * COLS, COLS).load(col_layout), 0)
            acc_top = acc_top * ratio_top * ratio_cols
            acc_bottom = acc_bottom * ratio_bottom * ratio_cols
            b_cols = b_bufs.index(s).slice(HALF * COLS, COLS).permute((1, 0))
            acc_top = warpgroup_mma(a_bufs.index(2 * s), b_cols, acc_top, is_async=True)
            acc_bottom = warpgroup_mma(a_bufs.index(2 * s + 1), b_cols, acc_bottom, is_async=True)
            acc_top, acc_bottom = warpgroup_mma_wait(num_outstanding=0, deps=(acc_top, acc_bottom))
            # The last block's stage stays held until its column scales are read, below.
            mbarrier.arrive(free.index(s), count=1, pred=kb < k_tiles - 1)
            it += 1
        last = (it + STAGES - 1) % STAGES
        last_b = gl.expand_dims(gl.where(k_tiles > 0, ratio_bufs.index(2 * last + 1).slice(HALF * COLS, COLS)
                                         .load(col_layout), 1.0), 0)
        mbarrier.arrive(free.index(last), count=1, pred=k_tiles > 0)
        _store_tile(c_ptr, acc_top * gl.expand_dims(prev_top, 1) * last_b, g, row0, cols0, row_end, N, stride_cg,
                    stride_cm, HALF_M, COLS, store_layout)
        _store_tile(c_ptr, acc_bottom * gl.expand_dims(prev_bottom, 1) * last_b, g, row0 + HALF_M, cols0, row_end,
                    N, stride_cg, stride_cm, HALF_M, COLS, store_layout)
        tile += NUM_PROGRAMS
        g, tiles_before, row0, col0, k0, k_tiles, row_end = _tile_at(
            tile, g, tiles_before, offs_ptr, M, N, K, G, BLOCK_N, GROUP_M, GROUPED, True)


@gluon.jit
def _mma_partition(a_bufs, b_bufs, ratio_bufs, ready, free, turns, c_ptr, sa_ptr, sb_ptr, offs_ptr, M, N, K, G,
                   stride_cg, stride_cm, stride_sam, stride_sak, stride_sbg, stride_sbn, stride_sbk,
                   HALF: gl.constexpr, BLOCK_N: gl.constexpr,
                   GROUP_M: gl.constexpr, STAGES: gl.constexpr, GROUPED: gl.constexpr,
                   TOKEN_REDUCTION: gl.constexpr, ACCUMULATE: gl.constexpr, NUM_PROGRAMS: gl.constexpr,
                   PING_PONG: gl.constexpr, PER_K_BLOCK: gl.constexpr):
    if _rescales_columns(TOKEN_REDUCTION, BLOCK_N, PER_K_BLOCK):
        _wide_token_tiles(a_bufs, b_bufs, ratio_bufs, ready, free, c_ptr, sa_ptr, offs_ptr, M, N, K, G, stride_cg,
                          stride_cm, stride_sam, stride_sak, HALF, BLOCK_N, GROUP_M, STAGES, GROUPED, ACCUMULATE,
                          NUM_PROGRAMS)
    else:
        _tiles(a_bufs, b_bufs, ready, free, turns, c_ptr, sa_ptr, sb_ptr, offs_ptr, M, N, K, G, stride_cg, stride_cm,
               stride_sam, stride_sak, stride_sbg, stride_sbn, stride_sbk, HALF, BLOCK_N, GROUP_M, STAGES, GROUPED,
               TOKEN_REDUCTION, ACCUMULATE, NUM_PROGRAMS, PING_PONG, PER_K_BLOCK)


@gluon.jit
def _tiles(a_bufs, b_bufs, ready, free, turns, c_ptr, sa_ptr, sb_ptr, offs_ptr, M, N, K, G, stride_cg, stride_cm,
           stride_sam, stride_sak, stride_sbg, stride_sbn, stride_sbk, HALF: gl.constexpr, BLOCK_N: gl.constexpr,
           GROUP_M: gl.constexpr, STAGES: gl.constexpr, GROUPED: gl.constexpr, TOKEN_REDUCTION: gl.constexpr,
           ACCUMULATE: gl.constexpr, NUM_PROGRAMS: gl.constexpr, PING_PONG: gl.constexpr, PER_K_BLOCK: gl.constexpr):
    """A consumer's part of the M-grouped walk and of the token reduction (promoting per block: up to a scale
    block wide): its 64 rows of each tile."""
    mma_layout: gl.constexpr = _mma_layout(BLOCK_N)
    store_layout: gl.constexpr = _row_pieces_layout(BLOCK_N)
    out_layout: gl.constexpr = _out_layout(c_ptr.dtype.element_ty, BLOCK_N, mma_layout, store_layout)
    row_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, mma_layout)
    tile = gl.program_id(0)
    it = 0
    g, tiles_before, row0, col0, k0, k_tiles, row_end = _tile_at(
        tile, gl.to_tensor(0), gl.to_tensor(0), offs_ptr, M, N, K, G, BLOCK_N, GROUP_M, GROUPED, TOKEN_REDUCTION)
    while g < G:
        rows = row0 + HALF * HALF_M + gl.arange(0, HALF_M, layout=row_layout)
        row_ok = rows < row_end
        first_block = k0 // BLOCK_K
        sa_ptrs = sa_ptr + rows.to(gl.int64) * stride_sam + first_block * stride_sak
        if TOKEN_REDUCTION and PER_K_BLOCK:  # B is scaled per row (column of C) and 128-token block too
            cols = col0 + gl.arange(0, BLOCK_N, layout=col_layout)
            col_ok = cols < N
            # A scalar base and int32 offsets: a tensor of 64-bit pointers would hold 64 registers a thread.
            sb_ptrs = sb_ptr + first_block.to(gl.int64) * stride_sbk
            acc = gl.zeros([HALF_M, BLOCK_N], gl.float32, mma_layout)
            for kb in range(k_tiles):
                s = it % STAGES
                # Loaded before the wait, so their latency hides behind it.
                sa = gl.load(sa_ptrs + kb * stride_sak, mask=row_ok, other=0.0)
                sb = gl.load(sb_ptrs + kb * stride_sbk + cols * stride_sbn, mask=col_ok, other=0.0)
                mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                # The product of one K block, waited for at once: the promotion's FMAs overlap the other
                # warpgroup's MMA. (Promoting a block late, with the next block's MMA in flight, makes ptxas
                # serialize the wgmmas: measured 0.6-0.7x.)
                part = warpgroup_mma(a_bufs.index(2 * s + HALF), b_bufs.index(s).permute((1, 0)), acc,
                                     use_acc=False, is_async=True)
                part = warpgroup_mma_wait(num_outstanding=0, deps=(part,))
                mbarrier.arrive(free.index(s), count=1)
                acc += part * gl.expand_dims(sa, 1) * gl.expand_dims(sb, 0)
                it += 1
        elif not PER_K_BLOCK:
            # Scales constant along K (rowwise, tensorwise): the MMAs add into one accumulator back to back, one
            # left in flight; a stage is released once the MMA after it is issued and its own has finished, and
            # the scales multiply the sum once, before the store. A's scales are indexed [row, group] (the token
            # reduction's per group; M-grouped, A's rows are the group's own and the group stride is 0), B's
            # [group, column]. An empty group's (no K blocks) are not read.
            # B's scales are loaded spread over the warpgroup (a few registers a thread through the K loop; in
            # the accumulator's column layout they would hold 64, and 256-wide tiles spilled), moved into that
            # layout after it.
            spread: gl.constexpr = gl.BlockedLayout([max(BLOCK_N // 128, 1)], [32], [4], [0])
            cols = col0 + gl.arange(0, BLOCK_N, layout=spread)
            sa = gl.load(sa_ptr + rows.to(gl.int64) * stride_sam + g.to(gl.int64) * stride_sak,
                         mask=row_ok & (k_tiles > 0), other=0.0)
            sb = gl.load(sb_ptr + g.to(gl.int64) * stride_sbg + cols * stride_sbn, mask=(cols < N) & (k_tiles > 0),
                         other=0.0)
            acc = gl.zeros([HALF_M, BLOCK_N], gl.float32, mma_layout)
            for kb in range(k_tiles):
                acc = _stage_mma(a_bufs, b_bufs, ready, turns, acc, it, HALF, STAGES, PING_PONG)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                if kb > 0:
                    mbarrier.arrive(free.index((it + STAGES - 1) % STAGES), count=1)
                it += 1
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            if k_tiles > 0:
                mbarrier.arrive(free.index((it + STAGES - 1) % STAGES), count=1)
            acc = acc * gl.expand_dims(sa, 1) * gl.expand_dims(gl.convert_layout(sb, col_layout), 0)
        else:
            # The tile's columns lie in one 128x128 weight block, or two (BLOCK_N 256: lo and hi). One
            # accumulator holds the sum so far divided by the current block's scale: rescaled by
            # previous / current before each block's MMA adds into it, and by the last scale at the end.
            # A 64x256 sum and a separate product would take 256 registers a thread.
            sb_ptrs = sb_ptr + g.to(gl.int64) * stride_sbg + (col0 // BLOCK_K) * stride_sbn
            in_hi = gl.expand_dims(gl.arange(0, BLOCK_N, layout=col_layout) >= BLOCK_K, 0)
            has_hi = col0 + BLOCK_K < N
            prev = gl.full([HALF_M], 1.0, gl.float32, row_layout)
            prev_hi = prev
            # Each block's scales are loaded one block ahead: they are needed before its MMA, and a load's
            # latency on that path left the tensor cores idle (128x128 tiles ran 12% slower than promoting).
            sa, sb, sb_hi = _block_scales(sa_ptrs, sb_ptrs, 0, row_ok, has_hi, stride_sak, stride_sbn, stride_sbk,
                                          BLOCK_N > BLOCK_K)
            acc = gl.zeros([HALF_M, BLOCK_N], gl.float32, mma_layout)
            for kb in range(k_tiles):
                s = it % STAGES
                cur = gl.maximum(sa * sb, MIN_SCALE)
                ratio = gl.expand_dims(prev / cur, 1)
                prev = cur
                if BLOCK_N > BLOCK_K:
                    cur_hi = gl.maximum(sa * sb_hi, MIN_SCALE)
                    ratio = gl.where(in_hi, gl.expand_dims(prev_hi / cur_hi, 1), ratio)
                    prev_hi = cur_hi
                sa, sb, sb_hi = _block_scales(sa_ptrs, sb_ptrs, gl.minimum(kb + 1, k_tiles - 1), row_ok, has_hi,
                                              stride_sak, stride_sbn, stride_sbk, BLOCK_N > BLOCK_K)
                # Rescaled before the wait: the FMULs hide behind it and the other warpgroup's MMA.
                acc = acc * ratio
                acc = _stage_mma(a_bufs, b_bufs, ready, turns, acc, it, HALF, STAGES, PING_PONG)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                mbarrier.arrive(free.index(s), count=1)
                it += 1
            last = gl.expand_dims(prev, 1)
            if BLOCK_N > BLOCK_K:
                last = gl.where(in_hi, gl.expand_dims(prev_hi, 1), last)
            acc = acc * last
        out_rows = row0 + HALF * HALF_M + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, out_layout))
        out_cols = col0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out_layout))
        c_ptrs = (c_ptr + g.to(gl.int64) * stride_cg + gl.expand_dims(out_rows.to(gl.int64) * stride_cm, 1)
                  + gl.expand_dims(out_cols, 0))
        mask = gl.expand_dims(out_rows < row_end, 1) & gl.expand_dims(out_cols < N, 0)
        # ACCUMULATE: summed in fp32, rounded once (a masked read of C: clamped reads, _c_tile's, ran the
        # 128-wide token reduction 2-8% slower).
        if ACCUMULATE:
            out = gl.convert_layout(acc, out_layout) + gl.load(c_ptrs, mask=mask, other=0.0).to(gl.float32)
            gl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=mask)
        else:
            gl.store(c_ptrs, gl.convert_layout(acc.to(c_ptr.dtype.element_ty), out_layout), mask=mask)
        tile += NUM_PROGRAMS
        g, tiles_before, row0, col0, k0, k_tiles, row_end = _tile_at(
            tile, g, tiles_before, offs_ptr, M, N, K, G, BLOCK_N, GROUP_M, GROUPED, TOKEN_REDUCTION)


@fast_launch
@gluon.jit
def _blockwise_ws_kernel(a_desc, b_desc, c_ptr, sa_ptr, sb_ptr, offs_ptr, M, N, K, G,
                         stride_cg, stride_cm, stride_sam, stride_sak, stride_sbg, stride_sbn, stride_sbk,
                         b_group_rows, b_group_cols,
                         BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, GROUPED: gl.constexpr,
                         TOKEN_REDUCTION: gl.constexpr, ACCUMULATE: gl.constexpr, NUM_PROGRAMS: gl.constexpr,
                         PING_PONG: gl.constexpr, PER_K_BLOCK: gl.constexpr):
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [2 * STAGES, HALF_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    # The wide token reduction's column ratios and scales, two rows a stage (see _mma_partition); a token
    # stands in elsewhere.
    ratio_rows: gl.constexpr = 2 * STAGES if _rescales_columns(TOKEN_REDUCTION, BLOCK_N, PER_K_BLOCK) else 1
    ratio_cols: gl.constexpr = BLOCK_N if _rescales_columns(TOKEN_REDUCTION, BLOCK_N, PER_K_BLOCK) else 1
    ratio_bufs = gl.allocate_shared_memory(gl.float32, [ratio_rows, ratio_cols],
                                           gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    # Each consumer's MMA issues, a barrier a stage (see _await_turn).
    turns = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(free.index(s), count=2)  # one arrival per consumer warpgroup
        mbarrier.init(turns.index(s), count=1)
        mbarrier.init(turns.index(STAGES + s), count=1)
    gl.warp_specialize([
        (_mma_partition, (a_bufs, b_bufs, ratio_bufs, ready, free, turns, c_ptr, sa_ptr, sb_ptr, offs_ptr, M, N,
                          K, G, stride_cg, stride_cm, stride_sam, stride_sak, stride_sbg, stride_sbn, stride_sbk,
                          0, BLOCK_N, GROUP_M, STAGES, GROUPED, TOKEN_REDUCTION, ACCUMULATE, NUM_PROGRAMS,
                          PING_PONG, PER_K_BLOCK)),
        (_mma_partition, (a_bufs, b_bufs, ratio_bufs, ready, free, turns, c_ptr, sa_ptr, sb_ptr, offs_ptr, M, N,
                          K, G, stride_cg, stride_cm, stride_sam, stride_sak, stride_sbg, stride_sbn, stride_sbk,
                          1, BLOCK_N, GROUP_M, STAGES, GROUPED, TOKEN_REDUCTION, ACCUMULATE, NUM_PROGRAMS,
                          PING_PONG, PER_K_BLOCK)),
        (_load_partition, (a_desc, b_desc, a_bufs, b_bufs, ratio_bufs, ready, free, sb_ptr, offs_ptr, M, N, K, G,
                           stride_sbn, stride_sbk, b_group_rows, b_group_cols, BLOCK_N, GROUP_M, STAGES, GROUPED,
                           TOKEN_REDUCTION, NUM_PROGRAMS, PER_K_BLOCK)),
    ], [4, 1], [232, 40])


_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def _weight_view(b: torch.Tensor) -> tuple[torch.Tensor, int, int] | None:
    """The weight stack b [G, N, K] as one 2-D tensor TMA reads, with where group g's weight starts in it: at
    row g * N of [G * N, K] (the stack's rows one after another), or at column g * stride of [N, G * stride]
    (each group's K range beside the others': quantize_both's transposed layout, a rowwise dgrad's weight;
    past K, up to the stride, the A operand's zero-filled K tail meets it, so it must hold finite values,
    the layout's zeros). None if b is neither, or TMA cannot read it."""
    G, N, K = b.shape
    group_stride, n_stride, k_stride = b.stride()
    if G == 1 or group_stride == N * n_stride:
        rows = b.as_strided((G * N, K), (n_stride, k_stride))
        return (rows, N, 0) if tma_layout(rows) is True else None
    if k_stride == 1 and n_stride == G * group_stride and group_stride >= K:
        side_by_side = b.as_strided((N, G * group_stride), (n_stride, 1))
        return (side_by_side, 0, group_stride) if tma_layout(side_by_side) is True else None
    return None


def shared_bytes(block_n: int, stages: int, out_element_size: int, token_reduction: bool = False,
                 per_k_block: bool = True) -> int:
    """An upper bound of the shared memory a launch takes (tests/hopper_compile.py checks it against the
    compiled kernel's): the stage ring (two 64-row A halves and a block_n-row B tile of 128 fp8 each),
    one consumer's 64-row output tile (all block_n columns, or its half of them in the wide token
    reduction), through which the epilogue changes layout, the wide token reduction's column ratios and
    scales (two fp32 rows a stage), and 1 KB for the barriers."""
    wide = _rescales_columns(token_reduction, block_n, per_k_block)
    ratios = 2 * stages * block_n * 4 if wide else 0
    out_cols = block_n // 2 if wide else block_n
    return (stages * (2 * HALF_M.value + block_n) * BLOCK_K.value + HALF_M.value * out_cols * out_element_size
            + ratios + 1024)


def fits(block_n: int, stages: int, out_element_size: int, token_reduction: bool = False,
         per_k_block: bool = True) -> bool:
    """Whether a launch fits a Hopper SM's shared memory (128x256 tiles: 4 stages at most)."""
    return shared_bytes(block_n, stages, out_element_size, token_reduction, per_k_block) <= SHARED_MEMORY_BYTES


def fitted(cfg: TileConfig, out: torch.Tensor, token_reduction: bool = False, per_k_block: bool = True,
           accumulate: bool = False) -> TileConfig:
    """`cfg` with as many of its stages as fit this kernel's shared memory beside `out`'s tile, 2 at least: a
    table tuned on bf16 outputs may hold 4 stages at 128x256, which an fp32 output (a main_grad) leaves no
    room for, and this kernel at 3 stages serves such a call where the Triton kernels would otherwise take it.
    A token reduction scaled in the epilogue and adding into C takes 128-wide tiles: at 256 its sum and C's
    tile together spill registers (tests/test_blockwise_ws.py)."""
    if token_reduction and accumulate and not per_k_block and cfg.BLOCK_N > 128:
        cfg = replace(cfg, BLOCK_N=128)
    stages = cfg.num_stages
    while stages > 2 and not fits(cfg.BLOCK_N, stages, out.element_size(), token_reduction, per_k_block):
        stages -= 1
    return cfg if stages == cfg.num_stages else replace(cfg, num_stages=stages)


def runnable(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, scales: Scales, cfg: TileConfig,
             token_reduction: bool = False, accumulate: bool = False) -> TileConfig | None:
    """The config this kernel runs an FP8 GEMM under, the table's `cfg` (a bucket with WS 1) with its stages
    fitted beside `out`'s tile (fitted), or None where the kernel does not take the call (supported)."""
    cfg = fitted(cfg, out, token_reduction, scales.per_k_block, accumulate)
    return cfg if supported(a, b, out, scales, cfg, token_reduction) else None


TRITON_MAX_BLOCK_N = 128


def triton_tile(cfg: TileConfig) -> TileConfig:
    """A blockwise config for the Triton kernels, where this kernel does not run (other GPUs, the
    interpreter): they keep each K block's product in a second fp32 tile, which spills registers at 256
    wide, so the tables' 128x256 (this kernel's) narrows to 128x128 there."""
    if cfg.BLOCK_N > TRITON_MAX_BLOCK_N:
        return replace(cfg, BLOCK_N=TRITON_MAX_BLOCK_N)
    return cfg


def supported(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, scales: Scales, cfg: TileConfig,
              token_reduction: bool = False) -> bool:
    """Whether this kernel runs an FP8 GEMM under `cfg`: M-grouped `out = a @ b^T` (b [G, N, K], 128x128 blocks
    or scales constant along K) or, with `token_reduction`, the wgrad `out = a @ b^T` over tokens (b [Q,
    tokens], 1x128 blocks along the tokens as a's, or a scale per row of each group). Both want a Hopper GPU
    (not the interpreter), fp8 operands TMA reads K-major, a row-major output, and a config that means two
    64-row warpgroups (BLOCK_M 128, 8 warps) with BLOCK_N 64, 128 or 256, and stages that fit in shared
    memory."""
    # The cheap tests first: every call of a WS bucket asks.
    return (
        scales.b_out_div == (BLOCK_K.value if scales.per_k_block and not token_reduction else 1)
        and BLOCK_M.value == cfg.BLOCK_M and cfg.num_warps == 8
        and cfg.BLOCK_N in (64, 128, 256)
        and fits(cfg.BLOCK_N, cfg.num_stages, out.element_size(), token_reduction, scales.per_k_block)
        and BLOCK_K.value == cfg.BLOCK_K and not interpreter_mode() and is_hopper(a.device)
        and a.dtype in _FP8_DTYPES and b.dtype in _FP8_DTYPES and a.shape[-1] > 0
        and out.stride(-1) == 1 and tma_layout(a) is True
        and ((b.ndim == 2 and tma_layout(b) is True) if token_reduction
             else (b.ndim == 3 and _weight_view(b) is not None))
    )


def _launch(a: torch.Tensor, b_view: torch.Tensor, out: torch.Tensor, scales: Scales, cfg: TileConfig,
            offs: torch.Tensor | None, M: int, N: int, K: int, G: int, tiles: int, token_reduction: bool,
            accumulate: bool, ping_pong: bool, b_group_rows: int = 0, b_group_cols: int = 0) -> torch.Tensor:
    """One launch over b's 2-D view (see _weight_view), group g's weight at row g * b_group_rows and column
    g * b_group_cols of it (M-grouped)."""
    programs = persistent_programs(a.device, tiles)
    bind_context(a.device)
    _blockwise_ws_kernel[(programs,)](
        descriptor(a, (HALF_M.value, BLOCK_K.value)), descriptor(b_view, (cfg.BLOCK_N, BLOCK_K.value)),
        out, scales.a, scales.b, a if offs is None else offs,
        M, N, K, G,
        out.stride(0) if out.ndim == 3 else 0, out.stride(-2), *scales.a_strides, *scales.b_strides,
        b_group_rows, b_group_cols,
        BLOCK_N=cfg.BLOCK_N, GROUP_M=cfg.GROUP_M, STAGES=cfg.num_stages, GROUPED=offs is not None,
        TOKEN_REDUCTION=token_reduction, ACCUMULATE=accumulate, NUM_PROGRAMS=programs,
        PING_PONG=ping_pong, PER_K_BLOCK=scales.per_k_block, num_warps=4,
    )
    return out


def blockwise_mm(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, scales: Scales, cfg: TileConfig,
    offs: torch.Tensor | None = None, ping_pong: bool = False,
) -> torch.Tensor:
    """out[rows_g] = (a[rows_g] @ b[g]^T) promoted per 128-wide K block (blockwise scales), or scaled once (scales
    constant along K): a [M, K], b [G, N, K], both fp8 K-major, out [M, N]. `offs` (int64 [G + 1], on the device)
    bounds the groups; None: one group, all of a's rows. The tile is 128 x cfg.BLOCK_N, walked in cfg.GROUP_M bands,
    cfg.num_stages deep. `ping_pong`: the consumers issue their MMAs in turns (_await_turn), what the forward takes:
    DeepSeek-V3's forwards ran 1.02-1.06x in turns (GateUP 1278 -> 1350 TFLOPS, 3 stages), their dgrads 0.97-0.98x,
    the token reduction (which never takes turns) 0.90-0.99x (benchmarks/blockwise_ab.py, H100, 2026-11-27). Check
    `supported` first."""
    (M, K), (G, N, _) = a.shape, b.shape
    if M == 0 or N == 0:
        return out
    # Each group adds at most one partial row tile: an upper bound that needs no group sizes.
    tiles = (cdiv(M, BLOCK_M.value) + G) * cdiv(N, cfg.BLOCK_N)
    view, group_rows, group_cols = _weight_view(b)
    return _launch(a, view, out, scales, cfg, offs, M, N, K, G, tiles, False, False, ping_pong, group_rows, group_cols)


def blockwise_token_mm(
    x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, scales: Scales, cfg: TileConfig,
    offs: torch.Tensor | None = None, accumulate: bool = False,
) -> torch.Tensor:
    """out[g] = x[:, tokens_g] @ y[:, tokens_g]^T (`accumulate`: out[g] += it) promoted per 128-token
    block: x [P, tokens] and y [Q, tokens] fp8, tokens contiguous, scaled per row and 128-token block
    (`scales.a` indexed [p, block], `scales.b` [0, q, block]), or per row of each group, scaled once
    (`scales.a` indexed [p, g], `scales.b` [g, q, 0]). `offs` (int64 [G + 1], on the device):
    the groups' token ranges, each starting on a 128-token block (quantize_both's padded layout), out
    [G, P, Q]; None: one group of all tokens, out [P, Q]. Check `supported(..., token_reduction=True)`."""
    (P, K), Q = x.shape, y.shape[0]
    G = 1 if offs is None else offs.numel() - 1
    if P == 0 or Q == 0 or G == 0:
        return out
    tiles = G * cdiv(P, BLOCK_M.value) * cdiv(Q, cfg.BLOCK_N)
    return _launch(x, y, out, scales, cfg, offs, P, Q, K, G, tiles, True, accumulate, False)
