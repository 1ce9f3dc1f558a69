"""The rowwise FP8 wgrad that casts its upstream gradient itself (Gluon, warp-specialized, Hopper).

The variable-K wgrad out[g] = grad_g^T @ y_g reduces over each group's tokens, so both fp8 operands must be
K-major: token-contiguous. The gradient arrives token-major [tokens, P], and the Triton kernels read a
transposed fp8 copy of it, written by a cast pass (quantize_both's cols_t): one more read of the gradient
and a write, 40% of the Down's wgrad pass on DeepSeek-V3. Cast in a Triton kernel's own loads the tile
reaches wgmma's register operand through shared memory and shuffles on the MMA warps: half speed
(docs/performance.md, "Amaxes of a gathered tensor ...").

Here the cast has warps of its own. A producer warp streams bf16 gradient tiles [128 tokens, 64 columns] and
the other operand's fp8 tiles with TMA; two cast warpgroups (a 64-column half each) scale each gradient
tile by its column's 1 / scale (from quantize_both's column amax: exactly the values the transposed copy
would hold), zero the tokens past the group's end, cast to fp8 and store it transposed, K-major, into the
ring the MMA warps read; two consumer warpgroups (64 rows of P each) run the MMAs and the epilogue (the rowwise
scales, the store or the main_grad's add). The gradient's transposed copy is never written.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from kernels.common.blockwise_ws import _tile_origin, _tma_load
from kernels.common.device import SHARED_MEMORY_BYTES, cdiv, interpreter_mode, is_hopper, persistent_programs
from kernels.common.fp8 import AMAX_EPS, FP8_MAX
from kernels.common.gluon_tma import descriptor
from kernels.common.launch import fast_launch
from kernels.common.tiles import TileConfig
from kernels.common.tma import bind_context, tma_layout

BLOCK_P = gl.constexpr(128)  # two consumer warpgroups of 64 rows
HALF_P = gl.constexpr(64)
BLOCK_K = gl.constexpr(128)  # tokens a step, the padded layout's block
# bf16 gradient tiles in flight between the producer and the cast warps (TMA's latency from HBM is what they
# cover: at 2 the kernel ran 0.2x the Triton kernel on the copy, H100)
RAW_STAGES = 4
# Tokens of the gradient tile a cast thread holds (8 or 16; 64 values a thread)
TOKENS_PER_THREAD = 16


@gluon.jit
def _tile_of(tile, P, Q, BLOCK_Q: gl.constexpr, GROUP_P: gl.constexpr):
    """Group, first row (p) and first column (q) of a tile: every group owns a whole [P, Q] output."""
    num_q = gl.cdiv(Q, BLOCK_Q)
    tiles_g = gl.cdiv(P, BLOCK_P) * num_q
    g = tile // tiles_g
    p0, q0 = _tile_origin(tile, g * tiles_g, gl.to_tensor(0), P, num_q, BLOCK_Q, GROUP_P)
    return g, p0, q0


@gluon.jit
def _group_steps(offs_ptr, padded_ptr, g):
    """Group g's first gradient row, its token count, its first column of the padded layout and its steps."""
    x_start = gl.load(offs_ptr + g).to(gl.int32)
    y_start = gl.load(padded_ptr + g).to(gl.int32)
    tokens = gl.load(offs_ptr + g + 1).to(gl.int32) - x_start
    return x_start, tokens, y_start, gl.cdiv(tokens, BLOCK_K)


@gluon.jit
def _load_partition(grad_desc, y_desc, raw_bufs, y_bufs, raw_ready, raw_free, y_ready, slot_free, offs_ptr,
                    padded_ptr, P, Q, G, BLOCK_Q: gl.constexpr, GROUP_P: gl.constexpr, STAGES: gl.constexpr,
                    RAW: gl.constexpr, NUM_PROGRAMS: gl.constexpr):
    tile = gl.program_id(0)
    total = G * gl.cdiv(P, BLOCK_P) * gl.cdiv(Q, BLOCK_Q)
    it = 0
    while tile < total:
        g, p0, q0 = _tile_of(tile, P, Q, BLOCK_Q, GROUP_P)
        x_start, _tokens, y_start, steps = _group_steps(offs_ptr, padded_ptr, g)
        for kb in range(steps):
            r = it % RAW
            # A fresh barrier counts as having completed the phase before its first: the first lap passes. Each
            # cast warpgroup frees its own half (one warpgroup may run up to STAGES steps ahead of the other).
            mbarrier.wait(raw_free.index(2 * r), ((it // RAW) & 1) ^ 1)
            mbarrier.wait(raw_free.index(2 * r + 1), ((it // RAW) & 1) ^ 1)
            mbarrier.expect(raw_ready.index(r), 2 * grad_desc.block_type.nbytes)
            row = x_start + kb * BLOCK_K  # past the tensor's end TMA reads zeros; past the group's, the cast does
            _tma_load(grad_desc, [row, p0], raw_ready.index(r), raw_bufs.index(2 * r))
            _tma_load(grad_desc, [row, p0 + HALF_P], raw_ready.index(r), raw_bufs.index(2 * r + 1))
            s = it % STAGES
            mbarrier.wait(slot_free.index(s), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(y_ready.index(s), y_desc.block_type.nbytes)
            _tma_load(y_desc, [q0, y_start + kb * BLOCK_K], y_ready.index(s), y_bufs.index(s))
            it += 1
        tile += NUM_PROGRAMS


@gluon.jit
def _cast_partition(raw_bufs, xq_bufs, raw_ready, raw_free, xq_ready, slot_free, amax_ptr, offs_ptr, padded_ptr,
                    P, Q, G, FIRST: gl.constexpr, HALVES: gl.constexpr, BLOCK_Q: gl.constexpr, GROUP_P: gl.constexpr,
                    STAGES: gl.constexpr, RAW: gl.constexpr, NUM_PROGRAMS: gl.constexpr, FP8_MAX: gl.constexpr,
                    EPS: gl.constexpr, TOKENS_PER_THREAD: gl.constexpr):
    """Casts the gradient's 64-column halves FIRST .. FIRST + HALVES - 1 of each tile."""
    # A [128 tokens, 64 columns] bf16 tile, TOKENS_PER_THREAD x (64 / TOKENS_PER_THREAD) a thread: at 16, 8-byte
    # reads along the columns, and transposed, a 16-byte store of 16 tokens a column (one 16-byte chunk of
    # the swizzled row).
    raw_layout: gl.constexpr = gl.BlockedLayout([TOKENS_PER_THREAD, 64 // TOKENS_PER_THREAD],
                                                [32 // TOKENS_PER_THREAD, TOKENS_PER_THREAD], [4, 1], [1, 0])
    col_layout: gl.constexpr = gl.SliceLayout(0, raw_layout)
    tok_layout: gl.constexpr = gl.SliceLayout(1, raw_layout)
    fp8: gl.constexpr = xq_bufs.dtype
    tile = gl.program_id(0)
    total = G * gl.cdiv(P, BLOCK_P) * gl.cdiv(Q, BLOCK_Q)
    it = 0
    while tile < total:
        g, p0, _q0 = _tile_of(tile, P, Q, BLOCK_Q, GROUP_P)
        _x_start, tokens, _y_start, steps = _group_steps(offs_ptr, padded_ptr, g)
        for kb in range(steps):
            r = it % RAW
            s = it % STAGES
            mbarrier.wait(raw_ready.index(r), (it // RAW) & 1)
            for h in gl.static_range(HALVES):
                # The half's 1 / scale, as quantize_both computes it: the values its transposed copy would hold.
                cols = p0 + (FIRST + h) * HALF_P + gl.arange(0, HALF_P, layout=col_layout)
                amax = gl.load(amax_ptr + g.to(gl.int64) * P + cols, mask=cols < P, other=0.0)
                inv_scale = gl.expand_dims(1.0 / (gl.maximum(amax, EPS) / FP8_MAX), 0)
                x = raw_bufs.index(2 * r + FIRST + h).load(raw_layout).to(gl.float32) * inv_scale
                mbarrier.arrive(raw_free.index(2 * r + FIRST + h), count=1)
                if (kb + 1) * BLOCK_K > tokens:  # the group's last step reaches into the next group's rows: zeroed
                    in_group = gl.expand_dims(kb * BLOCK_K + gl.arange(0, BLOCK_K, layout=tok_layout) < tokens, 1)
                    x = gl.where(in_group, x, 0.0)
                # The cast saturates (cvt.satfinite) as quantize_both's clamp does, for every value but NaN.
                q = x.to(fp8)
                if h == 0:
                    mbarrier.wait(slot_free.index(s), ((it // STAGES) & 1) ^ 1)
                xq_bufs.index(2 * s + FIRST + h).store(gl.permute(q, (1, 0)))
            fence_async_shared()  # the stores reach the async proxy (wgmma) before the arrivals publish them
            for h in gl.static_range(HALVES):
                mbarrier.arrive(xq_ready.index(2 * s + FIRST + h), count=1)
            it += 1
        tile += NUM_PROGRAMS


@gluon.jit
def _mma_partition(xq_bufs, y_bufs, xq_ready, y_ready, slot_free, c_ptr, amax_ptr, sy_ptr, offs_ptr, padded_ptr,
                   P, Q, G, stride_cg, stride_cp, stride_syg, HALF: gl.constexpr, BLOCK_Q: gl.constexpr,
                   GROUP_P: gl.constexpr, STAGES: gl.constexpr, ACCUMULATE: gl.constexpr,
                   NUM_PROGRAMS: gl.constexpr, FP8_MAX: gl.constexpr, EPS: gl.constexpr):
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_Q, 32])
    row_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, mma_layout)
    tile = gl.program_id(0)
    total = G * gl.cdiv(P, BLOCK_P) * gl.cdiv(Q, BLOCK_Q)
    it = 0
    while tile < total:
        g, p0, q0 = _tile_of(tile, P, Q, BLOCK_Q, GROUP_P)
        _x_start, _tokens, _y_start, steps = _group_steps(offs_ptr, padded_ptr, g)
        acc = gl.zeros([HALF_P, BLOCK_Q], gl.float32, mma_layout)
        for _kb in range(steps):
            s = it % STAGES
            phase = (it // STAGES) & 1
            mbarrier.wait(y_ready.index(s), phase)
            mbarrier.wait(xq_ready.index(2 * s + HALF), phase)
            acc = warpgroup_mma(xq_bufs.index(2 * s + HALF), y_bufs.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(slot_free.index(s), count=1)
            it += 1
        rows = p0 + HALF * HALF_P + gl.arange(0, HALF_P, layout=row_layout)
        cols = q0 + gl.arange(0, BLOCK_Q, layout=col_layout)
        row_ok = rows < P
        col_ok = cols < Q
        sx = gl.maximum(gl.load(amax_ptr + g.to(gl.int64) * P + rows, mask=row_ok, other=0.0), EPS) / FP8_MAX
        sy = gl.load(sy_ptr + g.to(gl.int64) * stride_syg + cols, mask=col_ok, other=0.0)
        acc = acc * gl.expand_dims(sx, 1) * gl.expand_dims(sy, 0)
        c_ptrs = (c_ptr + g.to(gl.int64) * stride_cg + gl.expand_dims(rows.to(gl.int64) * stride_cp, 1)
                  + gl.expand_dims(cols, 0))
        mask = gl.expand_dims(row_ok, 1) & gl.expand_dims(col_ok, 0)
        if ACCUMULATE:  # summed in fp32, rounded once
            acc += gl.load(c_ptrs, mask=mask, other=0.0).to(gl.float32)
        gl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
        tile += NUM_PROGRAMS


@fast_launch
@gluon.jit
def _wgrad_cast_ws_kernel(grad_desc, y_desc, c_ptr, amax_ptr, sy_ptr, offs_ptr, padded_ptr, P, Q, G,
                          stride_cg, stride_cp, stride_syg, BLOCK_Q: gl.constexpr, GROUP_P: gl.constexpr,
                          STAGES: gl.constexpr, RAW: gl.constexpr, ACCUMULATE: gl.constexpr,
                          NUM_PROGRAMS: gl.constexpr, FP8_MAX: gl.constexpr, EPS: gl.constexpr,
                          XQ_DTYPE: gl.constexpr, TOKENS_PER_THREAD: gl.constexpr, CAST_GROUPS: gl.constexpr,
                          CAST_REGS: gl.constexpr):
    raw_bufs = gl.allocate_shared_memory(grad_desc.dtype, [2 * RAW, BLOCK_K, HALF_P], grad_desc.layout)
    xq_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HALF_P, BLOCK_K], XQ_DTYPE)
    xq_bufs = gl.allocate_shared_memory(XQ_DTYPE, [2 * STAGES, HALF_P, BLOCK_K], xq_layout)
    y_bufs = gl.allocate_shared_memory(y_desc.dtype, [STAGES, BLOCK_Q, BLOCK_K], y_desc.layout)
    raw_ready = gl.allocate_shared_memory(gl.int64, [RAW, 1], mbarrier.MBarrierLayout())
    raw_free = gl.allocate_shared_memory(gl.int64, [2 * RAW, 1], mbarrier.MBarrierLayout())
    xq_ready = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
    y_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    slot_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for r in gl.static_range(RAW):
        mbarrier.init(raw_ready.index(r), count=1)
        mbarrier.init(raw_free.index(2 * r), count=1)
        mbarrier.init(raw_free.index(2 * r + 1), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(xq_ready.index(2 * s), count=1)
        mbarrier.init(xq_ready.index(2 * s + 1), count=1)
        mbarrier.init(y_ready.index(s), count=1)
        mbarrier.init(slot_free.index(s), count=2)  # one arrival per consumer warpgroup
    if CAST_GROUPS == 2:  # a cast warpgroup a half
        gl.warp_specialize([
            (_mma_partition, (xq_bufs, y_bufs, xq_ready, y_ready, slot_free, c_ptr, amax_ptr, sy_ptr, offs_ptr,
                              padded_ptr, P, Q, G, stride_cg, stride_cp, stride_syg, 0, BLOCK_Q, GROUP_P, STAGES,
                              ACCUMULATE, NUM_PROGRAMS, FP8_MAX, EPS)),
            (_mma_partition, (xq_bufs, y_bufs, xq_ready, y_ready, slot_free, c_ptr, amax_ptr, sy_ptr, offs_ptr,
                              padded_ptr, P, Q, G, stride_cg, stride_cp, stride_syg, 1, BLOCK_Q, GROUP_P, STAGES,
                              ACCUMULATE, NUM_PROGRAMS, FP8_MAX, EPS)),
            (_cast_partition, (raw_bufs, xq_bufs, raw_ready, raw_free, xq_ready, slot_free, amax_ptr, offs_ptr,
                               padded_ptr, P, Q, G, 0, 1, BLOCK_Q, GROUP_P, STAGES, RAW, NUM_PROGRAMS, FP8_MAX, EPS,
                               TOKENS_PER_THREAD)),
            (_cast_partition, (raw_bufs, xq_bufs, raw_ready, raw_free, xq_ready, slot_free, amax_ptr, offs_ptr,
                               padded_ptr, P, Q, G, 1, 1, BLOCK_Q, GROUP_P, STAGES, RAW, NUM_PROGRAMS, FP8_MAX, EPS,
                               TOKENS_PER_THREAD)),
            (_load_partition, (grad_desc, y_desc, raw_bufs, y_bufs, raw_ready, raw_free, y_ready, slot_free, offs_ptr,
                               padded_ptr, P, Q, G, BLOCK_Q, GROUP_P, STAGES, RAW, NUM_PROGRAMS)),
        ], [4, 4, 4, 1], [CAST_REGS, CAST_REGS, CAST_REGS, 32])
    else:  # one cast warpgroup for both halves: 16 warps, 128 registers a thread
        gl.warp_specialize([
            (_mma_partition, (xq_bufs, y_bufs, xq_ready, y_ready, slot_free, c_ptr, amax_ptr, sy_ptr, offs_ptr,
                              padded_ptr, P, Q, G, stride_cg, stride_cp, stride_syg, 0, BLOCK_Q, GROUP_P, STAGES,
                              ACCUMULATE, NUM_PROGRAMS, FP8_MAX, EPS)),
            (_mma_partition, (xq_bufs, y_bufs, xq_ready, y_ready, slot_free, c_ptr, amax_ptr, sy_ptr, offs_ptr,
                              padded_ptr, P, Q, G, stride_cg, stride_cp, stride_syg, 1, BLOCK_Q, GROUP_P, STAGES,
                              ACCUMULATE, NUM_PROGRAMS, FP8_MAX, EPS)),
            (_cast_partition, (raw_bufs, xq_bufs, raw_ready, raw_free, xq_ready, slot_free, amax_ptr, offs_ptr,
                               padded_ptr, P, Q, G, 0, 2, BLOCK_Q, GROUP_P, STAGES, RAW, NUM_PROGRAMS, FP8_MAX, EPS,
                               TOKENS_PER_THREAD)),
            (_load_partition, (grad_desc, y_desc, raw_bufs, y_bufs, raw_ready, raw_free, y_ready, slot_free, offs_ptr,
                               padded_ptr, P, Q, G, BLOCK_Q, GROUP_P, STAGES, RAW, NUM_PROGRAMS)),
        ], [4, 4, 1], [CAST_REGS, CAST_REGS, 32])


_GL_FP8 = {torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5}
# The launch's tile: 128 x BLOCK_N outputs, GROUP_M bands, num_stages deep (BLOCK_M, BLOCK_K and the warps
# are the kernel's own).
TILE = TileConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=3)


def shared_bytes(block_q: int, stages: int, raw_stages: int = RAW_STAGES) -> int:
    """An upper bound of a launch's shared memory: the bf16 gradient tiles in flight, the stage ring (the cast
    128-row tile and a block_q-row tile of 128 fp8 each) and 1 KB for the barriers."""
    return (raw_stages * BLOCK_K.value * BLOCK_P.value * 2 + stages * (BLOCK_P.value + block_q) * BLOCK_K.value
            + 1024)


def supported(grad: torch.Tensor, y: torch.Tensor, out: torch.Tensor, cfg: TileConfig = TILE,
              raw_stages: int = RAW_STAGES) -> bool:
    """Whether this kernel runs the rowwise wgrad out[g] = grad_g^T @ y_g: a Hopper GPU (not the interpreter),
    a bf16/fp16 gradient [tokens, P] and fp8 y [Q, capacity] that TMA reads, a row-major output, and the
    tile (128 x 128 or 128 x 64: the epilogue keeps one 64 x BLOCK_Q fp32 sum a consumer thread beside the
    cast warps' registers) within shared memory."""
    return (cfg.BLOCK_N in (64, 128) and cfg.num_stages >= 2
            and shared_bytes(cfg.BLOCK_N, cfg.num_stages, raw_stages) <= SHARED_MEMORY_BYTES
            and not interpreter_mode() and is_hopper(grad.device)
            and grad.dtype in (torch.bfloat16, torch.float16) and y.dtype in _GL_FP8
            and tma_layout(grad) is True and tma_layout(y) is True and out.stride(-1) == 1)


def wgrad_cast_mm(grad: torch.Tensor, amax: torch.Tensor, y: torch.Tensor, sy: torch.Tensor, offs: torch.Tensor,
                  padded_offs: torch.Tensor, out: torch.Tensor, fp8_dtype: torch.dtype, accumulate: bool = False,
                  cfg: TileConfig = TILE, raw_stages: int = RAW_STAGES,
                  tokens_per_thread: int = TOKENS_PER_THREAD, cast_groups: int = 2,
                  cast_regs: int = 120) -> torch.Tensor:
    """out[g] = grad[offs[g]:offs[g+1]]^T @ y[:, padded group g]^T-scaled (`accumulate`: out[g] += it): grad
    [tokens, P] bf16/fp16 cast to `fp8_dtype` per (group, column) by its amax [G, P] (quantize_both's
    col_amax_only), y [Q, capacity] fp8 in quantize_both's padded transposed layout with its scales sy
    [G, Q], out [G, P, Q]; under TILE and RAW_STAGES unless given (a sweep). Check `supported` first."""
    P, Q, G = grad.shape[1], y.shape[0], offs.numel() - 1
    if P == 0 or Q == 0 or G == 0:
        return out
    tiles = G * cdiv(P, BLOCK_P.value) * cdiv(Q, cfg.BLOCK_N)
    programs = persistent_programs(grad.device, tiles)
    bind_context(grad.device)
    _wgrad_cast_ws_kernel[(programs,)](
        descriptor(grad, (BLOCK_K.value, HALF_P.value)), descriptor(y, (cfg.BLOCK_N, BLOCK_K.value)), out, amax, sy,
        offs, padded_offs, P, Q, G, out.stride(0), out.stride(1), sy.stride(0),
        BLOCK_Q=cfg.BLOCK_N, GROUP_P=cfg.GROUP_M, STAGES=cfg.num_stages, RAW=raw_stages, ACCUMULATE=accumulate,
        NUM_PROGRAMS=programs, FP8_MAX=FP8_MAX[fp8_dtype], EPS=AMAX_EPS, XQ_DTYPE=_GL_FP8[fp8_dtype],
        TOKENS_PER_THREAD=tokens_per_thread, CAST_GROUPS=cast_groups, CAST_REGS=cast_regs, num_warps=4,
    )
    return out
