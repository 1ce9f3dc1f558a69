"""Rowwise and tensorwise FP8 GEMM on Hopper, M-grouped, with warp specialization in ping-pong (Gluon).

The Triton kernels and the warp-specialized blockwise kernel (blockwise_ws.py) run a tile's epilogue
(scale, round, store) on the warps that run its MMAs: while they store, the tensor cores wait. On a short
reduction that is a large share of a tile's time: DeepSeek-V3's Down GEMM (K 2048, 16 K blocks a tile) ran
~1000 TFLOPS where its GateUP (K 7168) ran ~1210 on the same 128x256 tiles, a fixed ~4 us a tile
(H100, 2026-11-26).

Here each of two consumer warpgroups owns whole 128 x BLOCK_N tiles, every other tile of the CTA's walk,
and one producer warp streams their K blocks through one ring of shared-memory stages with TMA, in the
walk's order: the first consumer's tile, then the second's, and so on. While one consumer stores a tile
the other's MMAs run (CUTLASS's "ping-pong" schedule). A consumer starts waiting on the ring for its tile
only once the other has waited on its tile's last stage (a `turn` barrier each): a ring slot's barrier then
never runs more than one phase ahead of the consumer waiting on it, which parity waits require. (Two
rings, one a consumer, need no turns but hold half the stages each: 0.75-0.87x the Triton kernel's
128x256 tiles at 3 stages a ring, H100 2026-11-26.)

Scales apply once, in the epilogue: A's per row (or one for the tensor), the weight's per output column
and group (or one per group). A tile may read past its group's last row (or B's last column into the next
group's rows): those products only feed outputs the masked store drops. Gluon kernels do not run in the
CPU interpreter; `supported` says when this kernel can take a launch.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from kernels.common.blockwise_ws import _GL_FP8, _as_rows, _descriptor, _tile_at, _tma_load
from kernels.common.device import SHARED_MEMORY_BYTES, cdiv, interpreter_mode, persistent_programs
from kernels.common.launch import fast_launch
from kernels.common.scales import Scales
from kernels.common.tiles import TileConfig
from kernels.common.tma import bind_context, tma_layout

BLOCK_M = gl.constexpr(128)  # a consumer warpgroup's tile: two m64 wgmmas a K step
BLOCK_K = gl.constexpr(128)
CONSUMERS = gl.constexpr(2)


@gluon.jit
def _load_partition(a_desc, b_desc, a_bufs, b_bufs, ready, free, offs_ptr, M, N, K, G,
                    BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, GROUPED: gl.constexpr,
                    NUM_PROGRAMS: gl.constexpr):
    stage_bytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    tile = gl.program_id(0)
    it = 0
    g, tiles_before, row0, _col0, b_row0, _k0, k_tiles, _row_end = _tile_at(
        tile, gl.to_tensor(0), gl.to_tensor(0), offs_ptr, M, N, K, G, BLOCK_N, GROUP_M, GROUPED, False)
    while g < G:
        for kb in range(k_tiles):
            s = it % STAGES
            # A fresh barrier counts as having completed the phase before its first: the first lap passes.
            mbarrier.wait(free.index(s), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), stage_bytes)
            _tma_load(a_desc, [row0, kb * BLOCK_K], ready.index(s), a_bufs.index(s))
            _tma_load(b_desc, [b_row0, kb * BLOCK_K], ready.index(s), b_bufs.index(s))
            it += 1
        tile += NUM_PROGRAMS
        g, tiles_before, row0, _col0, b_row0, _k0, k_tiles, _row_end = _tile_at(
            tile, g, tiles_before, offs_ptr, M, N, K, G, BLOCK_N, GROUP_M, GROUPED, False)


@gluon.jit
def _mma_partition(a_bufs, b_bufs, ready, free, turn, c_ptr, sa_ptr, sb_ptr, offs_ptr, M, N, K, G,
                   stride_cm, stride_sam, stride_sbg, stride_sbn, CONSUMER: gl.constexpr, BLOCK_N: gl.constexpr,
                   GROUP_M: gl.constexpr, STAGES: gl.constexpr, GROUPED: gl.constexpr, NUM_PROGRAMS: gl.constexpr):
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_N, 32])
    row_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, mma_layout)
    tile = gl.program_id(0) + CONSUMER * NUM_PROGRAMS
    done = 0  # this consumer's tiles so far
    g, tiles_before, row0, col0, _b_row0, _k0, k_tiles, row_end = _tile_at(
        tile, gl.to_tensor(0), gl.to_tensor(0), offs_ptr, M, N, K, G, BLOCK_N, GROUP_M, GROUPED, False)
    while g < G:
        # This tile's first stage in the ring's order (every tile of an M-grouped walk has the same K
        # blocks), once the other consumer has waited on its tile before this one: the first consumer's
        # j-th tile follows the second's (j-1)-th, the second's j-th the first's j-th.
        local = CONSUMERS * done + CONSUMER
        it = local * k_tiles
        if local > 0:
            mbarrier.wait(turn.index(CONSUMER), (done - 1 + CONSUMER) & 1)
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma_layout)
        for kb in range(k_tiles):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            mbarrier.arrive(turn.index(1 - CONSUMER), count=1, pred=kb == k_tiles - 1)
            acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True)
            # One MMA in flight: the one before it is done, and its stage goes back to the producer.
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            mbarrier.arrive(free.index((it + STAGES - 1) % STAGES), count=1, pred=kb > 0)
            it += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(free.index((it + STAGES - 1) % STAGES), count=1, pred=k_tiles > 0)
        # The epilogue, under the other consumer's MMAs. Rows and columns past the edges read the last
        # one's scale (clamped, not masked: a predicate per element would take registers beside the
        # accumulator); the store drops them.
        rows = row0 + gl.arange(0, BLOCK_M, layout=row_layout)
        cols = col0 + gl.arange(0, BLOCK_N, layout=col_layout)
        sa = gl.load(sa_ptr + gl.minimum(rows, row_end - 1).to(gl.int64) * stride_sam)
        sb = gl.load(sb_ptr + g.to(gl.int64) * stride_sbg + gl.minimum(cols, N - 1) * stride_sbn)
        out = (acc * gl.expand_dims(sa, 1) * gl.expand_dims(sb, 0)).to(c_ptr.dtype.element_ty)
        # Stored from the accumulator's own layout (4-byte stores): a layout change would take a 32 KB
        # scratch tile a consumer, which two more stages of the ring need.
        ptrs = c_ptr + gl.expand_dims(rows.to(gl.int64) * stride_cm, 1) + gl.expand_dims(cols, 0)
        gl.store(ptrs, out, mask=gl.expand_dims(rows < row_end, 1) & gl.expand_dims(cols < N, 0))
        # The walk moves forward only: the other consumer's tile in between is stepped over with it.
        tile += CONSUMERS * NUM_PROGRAMS
        done += 1
        g, tiles_before, row0, col0, _b_row0, _k0, k_tiles, row_end = _tile_at(
            tile, g, tiles_before, offs_ptr, M, N, K, G, BLOCK_N, GROUP_M, GROUPED, False)


@fast_launch
@gluon.jit
def _pingpong_kernel(a_desc, b_desc, c_ptr, sa_ptr, sb_ptr, offs_ptr, M, N, K, G,
                     stride_cm, stride_sam, stride_sbg, stride_sbn,
                     BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, GROUPED: gl.constexpr,
                     NUM_PROGRAMS: gl.constexpr):
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(free.index(s), count=1)  # a stage serves one consumer
    for c in gl.static_range(CONSUMERS):
        mbarrier.init(turn.index(c), count=1)
    gl.warp_specialize([
        (_mma_partition, (a_bufs, b_bufs, ready, free, turn, c_ptr, sa_ptr, sb_ptr, offs_ptr, M, N, K, G, stride_cm,
                          stride_sam, stride_sbg, stride_sbn, 0, BLOCK_N, GROUP_M, STAGES, GROUPED, NUM_PROGRAMS)),
        (_mma_partition, (a_bufs, b_bufs, ready, free, turn, c_ptr, sa_ptr, sb_ptr, offs_ptr, M, N, K, G, stride_cm,
                          stride_sam, stride_sbg, stride_sbn, 1, BLOCK_N, GROUP_M, STAGES, GROUPED, NUM_PROGRAMS)),
        (_load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, free, offs_ptr, M, N, K, G, BLOCK_N, GROUP_M,
                           STAGES, GROUPED, NUM_PROGRAMS)),
    ], [4, 1], [232, 40])


def shared_bytes(block_n: int, stages: int) -> int:
    """An upper bound of a launch's shared memory: the ring's stages (a 128-row A tile and a block_n-row B
    tile of 128 fp8 each), and 1 KB for the barriers."""
    return stages * (BLOCK_M.value + block_n) * BLOCK_K.value + 1024


def supported(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, scales: Scales, cfg: TileConfig) -> bool:
    """Whether this kernel runs `out[rows_g] = a[rows_g] @ b[g]^T` scaled once per row and column (rowwise or
    tensorwise: not per K block) under `cfg` on this GPU: Hopper (not the interpreter), fp8 operands TMA reads
    K-major, a row-major output, and a config that means a 128-row tile per consumer warpgroup (BLOCK_M 128,
    4 warps, BLOCK_K 128) with BLOCK_N 64 or 128 and a ring of num_stages that fits in shared memory."""
    return (
        not scales.per_k_block and scales.b_out_div == 1
        and BLOCK_M.value == cfg.BLOCK_M and BLOCK_K.value == cfg.BLOCK_K and cfg.num_warps == 4
        and cfg.BLOCK_N in (64, 128) and shared_bytes(cfg.BLOCK_N, cfg.num_stages) <= SHARED_MEMORY_BYTES
        and not interpreter_mode() and a.is_cuda and torch.cuda.get_device_capability(a.device) == (9, 0)
        and a.dtype in _GL_FP8 and b.dtype in _GL_FP8 and b.ndim == 3 and a.shape[-1] > 0
        and tma_layout(a) is True and _as_rows(b) is not None and out.stride(-1) == 1
    )


def pingpong_mm(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, scales: Scales, cfg: TileConfig,
    offs: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[rows_g] = (a[rows_g] @ b[g]^T) * scale_a[row] * scale_b[g, col]: a [M, K], b [G, N, K], both fp8
    K-major, out [M, N]; scales as the M-grouped kernels read them (kernels/common/scales.py). `offs` (int64
    [G + 1], on the device) bounds the groups; None: one group, all of a's rows. Check `supported` first."""
    (M, K), (G, N, _) = a.shape, b.shape
    if M == 0 or N == 0:
        return out
    # Each group adds at most one partial row tile: an upper bound that needs no group sizes.
    tiles = (cdiv(M, BLOCK_M.value) + G) * cdiv(N, cfg.BLOCK_N)
    programs = persistent_programs(a.device, cdiv(tiles, CONSUMERS.value))
    bind_context(a.device)
    _pingpong_kernel[(programs,)](
        _descriptor(a, [BLOCK_M.value, BLOCK_K.value]), _descriptor(_as_rows(b), [cfg.BLOCK_N, BLOCK_K.value]),
        out, scales.a, scales.b, a if offs is None else offs, M, N, K, G,
        out.stride(0), scales.a_strides[0], scales.b_strides[0], scales.b_strides[1],
        BLOCK_N=cfg.BLOCK_N, GROUP_M=cfg.GROUP_M, STAGES=cfg.num_stages, GROUPED=offs is not None,
        NUM_PROGRAMS=programs, num_warps=4,
    )
    return out
