"""The attention forward and backward on Hopper with warp specialization (Gluon), FlashAttention-3's division of
labour.

The Triton forward (kernel.py) runs every warp through the same loop: load a key block, QK^T, softmax,
PV. Its tensor cores wait while the warps exponentiate, and its loads are issued by the same warps
that wait on them. Here the roles are split, as in FlashAttention-3 and kernels/common/blockwise_ws.py:

- one producer warp streams K and V blocks through a ring of shared-memory stages with TMA (K and V
  on barriers of their own, so a block's QK^T starts before its V has landed), after loading the
  CTA's 128 query rows once;
- two consumer warpgroups, each owning 64 of those rows, run QK^T (both operands from shared memory),
  the online softmax in registers (base 2, the scale and the running max in one FMA; the max moved lazily,
  as FlashAttention-4 does: _online_softmax), and PV with P straight from registers (wgmma's register A
  operand: P is never written to shared memory), then release the stage. They meet only at the stage
  barriers, so one warpgroup's softmax runs under the other's matmuls;
- non-causal launches are persistent (one CTA an SM walking the tiles, the ring running on from tile to
  tile: the producer loads the next tile's q once both consumers have computed the last one's scores, while
  they finish its products and store it); causal tiles shorten along a head, and run one a CTA.

What it serves (`supported`): dense (not packed) bf16/fp16 problems, or the FP8 forward's (E4M3 q, k and v
with per-head scales, v sequence-major: `forward_ws`), with head dim 64, 128 or 256 for q, k and v, no sliding
window, causal only with Sq <= Sk (every query then sees key 0, so no row's first block is empty), tensors
TMA can read as [batch x sequence, heads x head dim]. Semantics, outputs and
the LSE are the Triton forward's (kernel.py's docstring): the backward reads either. A K/V block past
the sequence's end reads the next sequence's rows (or zeros past the tensor): those keys are masked.
The dQ pass (below the forward) follows the same pattern with dO beside q; the fused backward (below it: dK,
dV and dQ in one pass, the tuned table's dK/dV buckets) turns it around, a CTA owning keys and streaming
queries, with the same conditions (at d256 its warpgroups split the head dim). Gluon kernels do not run in the
CPU interpreter: tests/test_attention.py checks these against float64 on the GPU, tests/hopper_compile.py
compiles them for sm_90a anywhere.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import _unwrap_if_constexpr, builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kernels.common.device import SHARED_MEMORY_BYTES, cdiv, interpreter_mode, is_hopper, persistent_programs
from kernels.common.gluon_tma import descriptor
from kernels.common.launch import fast_launch
from kernels.common.tma import bind_context

# The TMA load's name since Triton 3.7 (async_copy_global_to_shared before).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

BLOCK_M = gl.constexpr(128)  # two consumer warpgroups of 64 query rows
HALF_M = gl.constexpr(64)
LN2 = gl.constexpr(math.log(2.0))
LOG2E = gl.constexpr(math.log2(math.e))
HEAD_DIMS = (64, 128, 256)
BLOCK_NS = (64, 128)
_SERVED_DTYPES = (torch.bfloat16, torch.float16)
FP8_DTYPE = torch.float8_e4m3fn


# The forward's lazy rescale (_online_softmax): a row's running max moves only when a block's rises past it by
# more than 2**8, FlashAttention-4's threshold. The tuned table's LAZY knob turns it on per head dim.
RESCALE_ABOVE = 8.0
# The FP8 forward's P goes to E4M3 for the PV product (_online_softmax's P_SHIFT): it stays under 2**8 = 256, inside
# the format's 448. With the lazy rescale (the table's LAZY, on at d128 and d256) its threshold is lowered to 2**4,
# to leave the shift 2**4 of that room; without it, the shift is 2**8.
FP8_P_BOUND_LOG2 = 8.0
FP8_RESCALE_ABOVE = 4.0


@gluon.constexpr_function
def fp8_softmax_shift(rescale_above):
    """The FP8 forward's P_SHIFT under a lazy-rescale threshold (negative: none, the max follows every block)."""
    return FP8_P_BOUND_LOG2 - max(rescale_above, 0.0)


@gluon.constexpr_function
def _warpgroup_acc(width, operand_bits=16):
    """The register layout of one warpgroup's [64, width] wgmma accumulator (bf16/fp16 operands, or fp8 with
    operand_bits 8: an instruction then reduces 32 elements, not 16)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, width, 256 // operand_bits])


@gluon.constexpr_function
def _register_k_width(dtype):
    """Elements a thread holds together along K of wgmma's register A operand: 32 bits of them."""
    return 32 // dtype.primitive_bitwidth


@triton.jit
def operand_key_order(p):
    """P [M, N] (N a multiple of 32) with its keys in v's order (kernel.key_position): column key_position(j) of
    each 32-key block holds P's column j. A reshape and a permute of dims, which moves no data between threads:
    the scores' accumulator layout, so relabelled, is wgmma's E4M3 register operand layout, and P goes into the
    operand without crossing threads. Converted from the accumulator as it is, P took 64 shuffles a thread and
    key block, and this FP8 forward read 0.86-0.89x our bf16 forward at d128 against 1.02x now (H100,
    docs/performance.md). Both FP8 forwards call it (Gluon calls a @triton.jit function as its own)."""
    M: tl.constexpr = p.shape[0]
    N: tl.constexpr = p.shape[1]
    return tl.reshape(tl.permute(tl.reshape(p, [M, N // 32, 2, 2, 2, 2, 2]), [0, 1, 2, 4, 5, 3, 6]), [M, N])


@gluon.jit
def _heads_side_by_side(flat, n_blocks, n_heads, heads_together):
    """(block, head) of tile `flat` of a launch order that counts a head's n_blocks blocks fastest over n_heads
    (batch, head) pairs, when `heads_together` heads run at a time side by side, each head's blocks in order.

    A causal walk shortens along a head's blocks, and the grid runs them longest first; launched head after
    head, the last heads' longest walks start last and leave a tail. All heads side by side instead lose the
    L2's hold on what a head's CTAs share (its K and V in the forward, its q and dO in the backward: 0.88-0.93x;
    heads_together, below, keeps a group of them within the L2)."""
    first = flat // (heads_together * n_blocks) * heads_together
    heads = gl.minimum(n_heads - first, heads_together)
    within = flat - first * n_blocks
    return within // heads, first + within % heads


@gluon.jit
def _tile(t, n_tiles, seqlen_q, seqlen_k, heads_q, group, heads_together, BLOCK_N: gl.constexpr,
          CAUSAL: gl.constexpr):
    """Tile t of n_tiles (a head's query blocks, then the (batch, head) pairs): its query block and (batch, q
    head, kv head), and its key blocks: [0, n_full) with every key visible to every row, [n_full, n_blocks)
    masked (the causal diagonal, the sequence's end). Causal query blocks run longest first (a head's tile 0
    takes its last block), heads_together heads at a time (_heads_side_by_side)."""
    m_blocks = gl.cdiv(seqlen_q, BLOCK_M)
    if CAUSAL:
        block, bh = _heads_side_by_side(t, m_blocks, n_tiles // m_blocks, heads_together)
        pid_m = m_blocks - 1 - block
    else:
        pid_m = t % m_blocks
        bh = t // m_blocks
    b = bh // heads_q
    h = bh % heads_q
    m0 = pid_m * BLOCK_M
    if CAUSAL:  # bottom-right aligned: row i sees keys j <= i + Sk - Sq
        diag = seqlen_k - seqlen_q
        n_blocks = gl.cdiv(gl.minimum(m0 + BLOCK_M + diag, seqlen_k), BLOCK_N)
        n_full = gl.minimum(m0 + diag + 1, seqlen_k) // BLOCK_N
    else:
        n_blocks = gl.cdiv(seqlen_k, BLOCK_N)
        n_full = seqlen_k // BLOCK_N
    return b, h, h // group, m0, n_full, n_blocks


@gluon.jit
def _lap(t):
    """How many tiles this CTA ran before tile t (it runs tiles program_id, program_id + programs, ...)."""
    return (t - gl.program_id(0)) // gl.num_programs(0)


@gluon.jit
def _load_tile(t, lap, position, q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_bufs, v_bufs, q_ready, q_free,
               k_ready, v_ready, k_free, v_free, n_tiles, seqlen_q, seqlen_k, heads_q, group, heads_together,
               HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
               WITH_DO: gl.constexpr, V_T: gl.constexpr):
    """Tile t's loads, the CTA's lap-th tile, its K and V from ring position `position` on: its q rows (and with
    WITH_DO, dO's: the dQ pass) once the consumers are done with the previous tile's, then its K and V blocks
    through the ring. V_T: v is sequence-major, [batch x kv heads x head dim, keys], and a block is its [head dim,
    keys] box (the FP8 forward's). Returns its key blocks."""
    b, h, kvh, m0, _n_full, n_blocks = _tile(t, n_tiles, seqlen_q, seqlen_k, heads_q, group, heads_together,
                                             BLOCK_N, CAUSAL)
    # A fresh barrier counts as having completed the phase before its first: the first waits pass.
    mbarrier.wait(q_free, (lap & 1) ^ 1)
    q_row = b * seqlen_q + m0
    if WITH_DO:
        mbarrier.expect(q_ready, 2 * q_desc.block_type.nbytes + 2 * do_desc.block_type.nbytes)
    else:
        mbarrier.expect(q_ready, 2 * q_desc.block_type.nbytes)
    for half in gl.static_range(2):
        _tma_load(q_desc, [q_row + half * HALF_M, h * HEAD_DIM], q_ready, q_smem.index(half))
        if WITH_DO:
            _tma_load(do_desc, [q_row + half * HALF_M, h * HEAD_DIM], q_ready, do_smem.index(half))
    k_row = b * seqlen_k
    v_row = (b * (heads_q // group) + kvh) * HEAD_DIM  # V_T: the kv head's band of head-dim rows
    for j in range(n_blocks):
        s = (position + j) % STAGES
        free_phase = (((position + j) // STAGES) & 1) ^ 1
        # K is released once its scores are computed, V after its product: the next K lands early.
        mbarrier.wait(k_free.index(s), free_phase)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        _tma_load(k_desc, [k_row + j * BLOCK_N, kvh * HEAD_DIM], k_ready.index(s), k_bufs.index(s))
        mbarrier.wait(v_free.index(s), free_phase)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        if V_T:
            _tma_load(v_desc, [v_row, j * BLOCK_N], v_ready.index(s), v_bufs.index(s))
        else:
            _tma_load(v_desc, [k_row + j * BLOCK_N, kvh * HEAD_DIM], v_ready.index(s), v_bufs.index(s))
    return n_blocks


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_bufs, v_bufs, q_ready, q_free, k_ready,
                    v_ready, k_free, v_free, n_tiles, seqlen_q, seqlen_k, heads_q, group, heads_together,
                    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                    WITH_DO: gl.constexpr, PERSISTENT: gl.constexpr, V_T: gl.constexpr = False):
    """The producer of both kernels: its CTA's tile (PERSISTENT: tiles program_id, program_id + programs, ..., the
    ring's position running on from tile to tile)."""
    if PERSISTENT:
        position = 0
        for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            position += _load_tile(t, _lap(t), position, q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_bufs,
                                   v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, n_tiles, seqlen_q,
                                   seqlen_k, heads_q, group, heads_together, HEAD_DIM, BLOCK_N, STAGES, CAUSAL,
                                   WITH_DO, V_T)
    else:
        _load_tile(gl.program_id(0), 0, 0, q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_bufs, v_bufs, q_ready,
                   q_free, k_ready, v_ready, k_free, v_free, n_tiles, seqlen_q, seqlen_k, heads_q, group,
                   heads_together, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, WITH_DO, V_T)


@gluon.jit
def _issue_scores(j, q, k_bufs, k_ready, s_layout: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """QK^T of key block j, issued (asynchronous) once its K has landed."""
    s = j % STAGES
    mbarrier.wait(k_ready.index(s), (j // STAGES) & 1)
    return warpgroup_mma(q, k_bufs.index(s).permute((1, 0)), gl.zeros([HALF_M, BLOCK_N], gl.float32, s_layout),
                         use_acc=False, is_async=True)


@gluon.jit
def _issue_pv(j, p_op, v_bufs, v_ready, acc, STAGES: gl.constexpr, V_T: gl.constexpr):
    """acc += P V of key block j, issued (asynchronous) once its V has landed. V_T: the stage holds V^T [head dim,
    keys], the keys contiguous: the K-major operand that an FP8 wgmma needs; P comes in fp32 then and is cast to
    E4M3 here (see _online_softmax)."""
    s = j % STAGES
    mbarrier.wait(v_ready.index(s), (j // STAGES) & 1)
    v = v_bufs.index(s)
    if V_T:
        v = v.permute((1, 0))
        p_op = p_op.to(v.dtype)
    return warpgroup_mma(p_op, v, acc, is_async=True)


@gluon.jit
def _mask_scores(j, scores, n_full, rows, diag, seqlen_k, s_layout: gl.constexpr, BLOCK_N: gl.constexpr,
                 CAUSAL: gl.constexpr):
    """Block j's scores, -inf where a key lies past the sequence's end or right of the causal diagonal
    (blocks from n_full on; the others are returned as they are)."""
    if j >= n_full:
        cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        visible = gl.expand_dims(cols < seqlen_k, 0)
        if CAUSAL:
            visible = visible & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows + diag, 1))
        scores = gl.where(visible, scores, -float("inf"))
    return scores


@gluon.jit
def _online_softmax(j, scores, m_i, l_i, n_full, rows, diag, seqlen_k, qk_scale, v_bufs, s_layout: gl.constexpr,
                    o_layout: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                    RESCALE_ABOVE: gl.constexpr, P_SHIFT: gl.constexpr):
    """Block j's scores into the running max and sum: (P in the PV product's operand layout, the factor
    that rescales the output so far, m_i, l_i, whether any row's max moved). Blocks from n_full on are
    masked: keys past the sequence's end, and right of the causal diagonal, get no weight.

    RESCALE_ABOVE >= 0 (log2 units): a row's max moves only when the block's rises above it by more than
    that, FlashAttention-4's lazy rescale. The sums and the output stay exact (both are taken against the
    same max, which the LSE then carries); P is at most 2**RESCALE_ABOVE, far inside bf16 and fp16. Past
    the first blocks no row's max moves, and the caller skips rescaling its output tile (64 multiplies a
    thread a block on the softmax's path). RESCALE_ABOVE < 0: the max follows every block, and the output
    is rescaled after each.

    P_SHIFT (log2 units): P and its row sums carry a factor 2**P_SHIFT, which cancels in the output and which the
    caller takes out of the LSE. The FP8 forward's P goes to E4M3 for the PV product: shifted up, its small values
    stay normal numbers of the format (down to 2**-6) instead of flushing through its subnormals, while P stays
    under 2**(P_SHIFT + max(RESCALE_ABOVE, 0)) <= 256, inside E4M3's 448 (fp8_softmax_shift)."""
    scores = _mask_scores(j, scores, n_full, rows, diag, seqlen_k, s_layout, BLOCK_N, CAUSAL)
    # The running max in scaled units: each score costs one FMA (scale, subtract the max) and one exp2.
    m_new = gl.maximum(m_i, gl.max(scores, axis=1) * qk_scale)
    if RESCALE_ABOVE >= 0:
        m_new = gl.where(m_new > m_i + RESCALE_ABOVE, m_new, m_i)
        moved = gl.max(m_new - m_i, axis=0) > 0
    else:
        moved = True
    p = gl.exp2(scores * qk_scale - gl.expand_dims(m_new - P_SHIFT, 1))
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    k_width: gl.constexpr = _register_k_width(v_bufs.dtype)
    if k_width == 4:  # FP8: v's keys lie in the E4M3 operand's order (kernel.quantize_per_head)
        p = operand_key_order(p)
    p_op = gl.convert_layout(p, gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=k_width))
    if k_width != 4:
        p_op = p_op.to(v_bufs.dtype)
    # FP8: P stays fp32 until the next block's PV product casts it (_issue_pv). Carried to that block as E4M3, its
    # bytes crossed the loop in registers of their own, each unpacked after the cast and packed again before the
    # wgmma: 190 instructions a block on the softmax's path, a quarter of the loop (192 prmt in the PTX; the compile
    # test holds it at none).
    return p_op, gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1), m_new, l_i, moved


@gluon.jit
def _store_rows(ptr, tile, b, h, first_row, seqlen, stride_b, stride_s, stride_h, HEAD_DIM: gl.constexpr):
    """A consumer's [64, HEAD_DIM] fp32 tile into rows first_row.. of head h of batch b of a [B, S, H, D]
    tensor (D contiguous), in its dtype; rows at or past `seqlen` are dropped. Stored from the tile's own
    (accumulator) layout, 4-byte stores: a change to a 16-byte-store layout took a shared-memory scratch tile
    (16-32 KB) that a third K/V stage at d128 needs."""
    store_layout: gl.constexpr = tile.type.layout
    rows = first_row + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, store_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, store_layout))
    ptrs = (ptr + b.to(gl.int64) * stride_b + h * stride_h + gl.expand_dims(rows.to(gl.int64) * stride_s, 1)
            + gl.expand_dims(cols, 0))
    gl.store(ptrs, tile.to(ptr.dtype.element_ty), mask=gl.expand_dims(rows < seqlen, 1))


@gluon.jit
def _softmax_tile(t, lap, position, q, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, o_ptr,
                  lse_ptr, q_scale_ptr, k_scale_ptr, v_scale_ptr, n_tiles, seqlen_q, seqlen_k, heads_q, group,
                  heads_together, qk_scale, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                  HALF: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr, RESCALE_ABOVE: gl.constexpr, FP8: gl.constexpr):
    """A consumer warpgroup's rows of tile t, the CTA's lap-th tile, its K and V from ring position `position`
    on. Returns its key blocks. FP8: q, k and v hold E4M3 values whose scales (fp32, one per sequence and head:
    [B, Hq] for q, [B, Hkv] for k and v) go into the scores' scale and the output's normalization; v's
    stages hold V^T (_issue_pv)."""
    bits: gl.constexpr = 8 if FP8 else 16
    s_layout: gl.constexpr = _warpgroup_acc(BLOCK_N, bits)
    o_layout: gl.constexpr = _warpgroup_acc(HEAD_DIM, bits)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    p_shift: gl.constexpr = fp8_softmax_shift(RESCALE_ABOVE) if FP8 else 0.0
    b, h, kvh, m0, n_full, n_blocks = _tile(t, n_tiles, seqlen_q, seqlen_k, heads_q, group, heads_together,
                                            BLOCK_N, CAUSAL)
    if FP8:
        kv_head = b * (heads_q // group) + kvh
        qk_scale = qk_scale * gl.load(q_scale_ptr + b * heads_q + h) * gl.load(k_scale_ptr + kv_head)
    rows = m0 + HALF * HALF_M + gl.arange(0, HALF_M, layout=row_layout)
    diag = seqlen_k - seqlen_q
    # A finite floor: a block that masks a whole row then leaves its sums as they were (alpha = 1, p = 0).
    m_i = gl.full([HALF_M], -1.0e30, gl.float32, row_layout)
    l_i = gl.zeros([HALF_M], gl.float32, row_layout)
    acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, o_layout)
    mbarrier.wait(q_ready, lap & 1)
    # FlashAttention-3's schedule: block j's QK^T and block j-1's PV are in flight while block j's softmax
    # waits on the first only; the output is rescaled once the second has landed. (The two warpgroups
    # taking turns to issue their matmuls, FA3's ping-pong, measured 0.95-1.02x of this: not kept.)
    scores = _issue_scores(position, q, k_bufs, k_ready, s_layout, BLOCK_N, STAGES)
    scores = warpgroup_mma_wait(num_outstanding=0, deps=(scores,))
    mbarrier.arrive(k_free.index(position % STAGES), count=1)
    p_op, alpha, m_i, l_i, moved = _online_softmax(0, scores, m_i, l_i, n_full, rows, diag, seqlen_k, qk_scale,
                                                   v_bufs, s_layout, o_layout, BLOCK_N, CAUSAL, RESCALE_ABOVE, p_shift)
    for j in range(1, n_blocks):
        scores = _issue_scores(position + j, q, k_bufs, k_ready, s_layout, BLOCK_N, STAGES)
        acc = _issue_pv(position + j - 1, p_op, v_bufs, v_ready, acc, STAGES, FP8)
        scores = warpgroup_mma_wait(num_outstanding=1, deps=(scores,))
        mbarrier.arrive(k_free.index((position + j) % STAGES), count=1)
        p_op, alpha, m_i, l_i, moved = _online_softmax(j, scores, m_i, l_i, n_full, rows, diag, seqlen_k, qk_scale,
                                                       v_bufs, s_layout, o_layout, BLOCK_N, CAUSAL, RESCALE_ABOVE,
                                                       p_shift)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(v_free.index((position + j - 1) % STAGES), count=1)
        if moved:
            acc = acc * alpha
    # Every score of the tile is computed: q's buffer may take the next tile's rows while this one finishes.
    mbarrier.arrive(q_free, count=1)
    last = position + n_blocks - 1
    acc = _issue_pv(last, p_op, v_bufs, v_ready, acc, STAGES, FP8)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(v_free.index(last % STAGES), count=1)
    norm = l_i
    if FP8:
        norm = l_i / gl.load(v_scale_ptr + kv_head)
    out = acc / gl.expand_dims(gl.convert_layout(norm, gl.SliceLayout(1, o_layout)), 1)
    _store_rows(o_ptr, out, b, h, m0 + HALF * HALF_M, seqlen_q, stride_ob, stride_os, stride_oh, HEAD_DIM)
    lse = (m_i - p_shift + gl.log2(l_i)) * LN2
    gl.store(lse_ptr + b.to(gl.int64) * stride_lb + h * stride_lh + rows, lse, mask=rows < seqlen_q)
    return n_blocks


@gluon.jit
def _softmax_partition(q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, o_ptr, lse_ptr,
                       q_scale_ptr, k_scale_ptr, v_scale_ptr, n_tiles, seqlen_q, seqlen_k, heads_q, group,
                       heads_together, qk_scale, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                       HALF: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                       CAUSAL: gl.constexpr, RESCALE_ABOVE: gl.constexpr, PERSISTENT: gl.constexpr,
                       FP8: gl.constexpr):
    """A consumer warpgroup of the forward: its rows of the CTA's tile (PERSISTENT: of tiles program_id,
    program_id + programs, ..., the ring's position running on from tile to tile)."""
    q = q_smem.index(HALF)
    # A tile a CTA runs outside any loop: one loop for both cost the causal forward a spilled register a tile
    # (16 B, ptxas of Triton 3.9), which the compile test refuses. The producer is split the same way.
    if PERSISTENT:
        position = 0
        for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            position += _softmax_tile(t, _lap(t), position, q, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready,
                                      k_free, v_free, o_ptr, lse_ptr, q_scale_ptr, k_scale_ptr, v_scale_ptr, n_tiles,
                                      seqlen_q, seqlen_k, heads_q, group, heads_together, qk_scale, stride_ob,
                                      stride_os, stride_oh, stride_lb, stride_lh, HALF, HEAD_DIM, BLOCK_N, STAGES,
                                      CAUSAL, RESCALE_ABOVE, FP8)
    else:
        _softmax_tile(gl.program_id(0), 0, 0, q, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free,
                      o_ptr, lse_ptr, q_scale_ptr, k_scale_ptr, v_scale_ptr, n_tiles, seqlen_q, seqlen_k, heads_q,
                      group, heads_together, qk_scale, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, HALF,
                      HEAD_DIM, BLOCK_N, STAGES, CAUSAL, RESCALE_ABOVE, FP8)


@gluon.jit
def _kv_ring(k_desc, v_desc, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
             V_T: gl.constexpr = False):
    """Both kernels' shared state: the K and V ring (V_T: V's stages hold [head dim, keys] boxes, _load_tile), the
    q tile's ready and free barriers, and each stage's ready and free barriers (K and V apart; a free barrier
    takes one arrival per consumer warpgroup)."""
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    if V_T:
        v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, HEAD_DIM, BLOCK_N], v_desc.layout)
    else:
        v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    mbarrier.init(q_free, count=2)
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(k_free.index(s), count=2)
        mbarrier.init(v_free.index(s), count=2)
    return k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free


@fast_launch
@gluon.jit
def _attention_fwd_ws_kernel(q_desc, k_desc, v_desc, o_ptr, lse_ptr, q_scale_ptr, k_scale_ptr, v_scale_ptr, n_tiles,
                             seqlen_q, seqlen_k, heads_q, group, heads_together, qk_scale,
                             stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                             HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                             CAUSAL: gl.constexpr, RESCALE_ABOVE: gl.constexpr, PERSISTENT: gl.constexpr,
                             FP8: gl.constexpr = False):
    """FP8: q, k and v in E4M3 with their scales (_softmax_tile), v through a sequence-major descriptor
    (_load_tile's V_T); else the scale pointers are not read."""
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, HALF_M, HEAD_DIM], q_desc.layout)
    k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free = _kv_ring(k_desc, v_desc, HEAD_DIM, BLOCK_N,
                                                                                 STAGES, FP8)
    gl.warp_specialize([
        (_softmax_partition, (q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, o_ptr,
                              lse_ptr, q_scale_ptr, k_scale_ptr, v_scale_ptr, n_tiles, seqlen_q, seqlen_k, heads_q,
                              group, heads_together, qk_scale, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                              0, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, RESCALE_ABOVE, PERSISTENT, FP8)),
        (_softmax_partition, (q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, o_ptr,
                              lse_ptr, q_scale_ptr, k_scale_ptr, v_scale_ptr, n_tiles, seqlen_q, seqlen_k, heads_q,
                              group, heads_together, qk_scale, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                              1, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, RESCALE_ABOVE, PERSISTENT, FP8)),
        (_load_partition, (q_desc, k_desc, v_desc, q_desc, q_smem, q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready,
                           v_ready, k_free, v_free, n_tiles, seqlen_q, seqlen_k, heads_q, group, heads_together,
                           HEAD_DIM, BLOCK_N, STAGES, CAUSAL, False, PERSISTENT, FP8)),
    ], [4, 1], [240, 24] if FP8 else [232, 40])  # FP8: the consumers' P in fp32 (_online_softmax) takes registers


def shared_bytes(head_dim: int, block_n: int, stages: int, element_size: int = 2) -> int:
    """An upper bound of a launch's shared memory: q's 128 rows, a K and a V block a stage, and 1 KB for the
    barriers (the output is stored from the accumulator's own layout: no layout-change scratch, which took
    16-32 KB more). tests/test_attention_fp8.py checks it against the compiled kernels."""
    return (BLOCK_M.value + 2 * stages * block_n) * head_dim * element_size + 1024


def _rows_viewable(t: torch.Tensor) -> bool:
    """Whether t [B, S, H, D] reads as [B x S, H x D] (one head's D columns a box) for TMA."""
    B, S, _, D = t.shape
    return (t.stride(3) == 1 and t.stride(2) == D and (B == 1 or t.stride(0) == S * t.stride(1))
            and t.data_ptr() % 16 == 0 and (t.stride(1) * t.element_size()) % 16 == 0)


def _rows_view(t: torch.Tensor) -> torch.Tensor:
    """t [B, S, H, D] as [B x S, H x D]; `_rows_viewable(t)` first."""
    B, S, H, D = t.shape
    return t.as_strided((B * S, H * D), (t.stride(1), 1))


def _sequence_major_viewable(v: torch.Tensor) -> bool:
    """Whether v [B, S, H, D] is laid out [B, H, D, S'] in rows of whole 32-key blocks (kernel.quantize_per_head's
    dense sequence-major v: its keys in the E4M3 operand's order within each block, zeros past them), which TMA
    reads as [B x H x D, S']: a head's [D, keys] box at row (b x H + h) x D."""
    B, S, H, D = v.shape
    row = v.stride(3)
    return (v.stride(1) == 1 and row >= S and row % 32 == 0 and v.stride(2) == D * row
            and (B == 1 or v.stride(0) == H * D * row) and v.data_ptr() % 16 == 0)


def _sequence_major_view(v: torch.Tensor) -> torch.Tensor:
    """v [B, S, H, D] as [B x H x D, S'], its whole rows; `_sequence_major_viewable(v)` first."""
    B, _, H, D = v.shape
    return v.as_strided((B * H * D, v.stride(3)), (v.stride(3), 1))


def _serves(tensors: tuple[torch.Tensor, ...], causal: bool, window: int | None, packed: bool,
            dtypes: tuple[torch.dtype, ...] = _SERVED_DTYPES) -> bool:
    """What every kernel here needs of a problem (q and k first among `tensors`, of one of `dtypes`): see the
    module's docstring."""
    q, k = tensors[0], tensors[1]
    if packed or window is not None or interpreter_mode() or q.dtype not in dtypes or not is_hopper(q.device):
        return False
    if q.shape[-1] not in HEAD_DIMS or any(t.shape[-1] != q.shape[-1] for t in tensors):
        return False
    if k.shape[1] == 0 or (causal and q.shape[1] > k.shape[1]):
        return False
    return all(_rows_viewable(t) for t in tensors)


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, window: int | None, packed: bool,
              block_n: int, stages: int) -> bool:
    """Whether this forward runs the problem with block_n keys a stage, `stages` deep (the tuned table's
    WS_BLOCK_N and WS_STAGES): bf16 or fp16 q, k and v, or E4M3 ones (the FP8 forward) with v sequence-major, as
    kernel.quantize_per_head writes it."""
    D = q.shape[-1]
    if not (block_n in BLOCK_NS and shared_bytes(D, block_n, stages, q.element_size()) <= SHARED_MEMORY_BYTES):
        return False
    if q.dtype == FP8_DTYPE:
        return (_serves((q, k), causal, window, packed, (FP8_DTYPE,)) and k.dtype == v.dtype == FP8_DTYPE
                and v.shape[-1] == D and _sequence_major_viewable(v))
    return _serves((q, k, v), causal, window, packed)


def _descriptor(t: torch.Tensor, rows: int, columns: int) -> TensorDescriptor:
    """A descriptor of t [B, S, H, D] as [B x S, H x D] reading [rows, columns] boxes."""
    return descriptor(_rows_view(t), (rows, columns))


# Causal launches run heads side by side (_heads_side_by_side) while what their CTAs share fits a budget of L2
# (the H100 has 50 MB): K and V per q head for the forward and the dQ pass, q and dO per kv head for the fused
# backward, whose dQ is summed in fp32 by reductions that land in L2 too. Measured against a head at a time
# (H100, 2 x 8k tokens, four calls of 5-7 interleaved rounds; identical configurations read 0.97-1.04x of each
# other): the forward at 48 MB 1.01-1.06x at d128, d64 and d256; the fused backward at 16 MB 1.05x at d128
# (4 heads), d64 (8) and d256 (2), 1.04x on llama3-8b's GQA groups of 4 at 4k tokens (2), where 48 MB (6 of
# those 8 MB heads) lost up to 7%. The fused backward's budget again (2026-11-27, the harness's timing, 11 and 21
# shuffled rounds, two calls): 32 MB over 16 MB 1.044 / 1.048x on llama3-8b at 4 x 4k (4 kv heads against 2),
# 1.090x at 2 x 8k (2 against 1), 1.015x on llama3-70b at 2 x 4k; 0.994 / 0.999x on d128's 16 heads (8
# against 4), 1.001x at d64 and d256; 24 and 40 MB lost up to 5% on d128.
CAUSAL_SHARED_BYTES = 48 * 2**20
FUSED_BWD_SHARED_BYTES = 32 * 2**20


def heads_together(causal: bool, shared_bytes_per_head: int, budget: int) -> int:
    """How many heads a causal launch runs side by side: as many as share `budget` bytes, one at least;
    non-causal walks are all alike, and run a head at a time."""
    return max(1, budget // max(shared_bytes_per_head, 1)) if causal else 1


def forward_ws(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
               causal: bool, qk_scale_log2: float, block_n: int, stages: int, lazy: bool = True,
               persistent: bool = True, scales: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> None:
    """out = softmax(q k^T) v and its natural-log LSE, the scores scaled by qk_scale_log2 / log2(e); q [B, Sq,
    Hq, D], k and v [B, Sk, Hkv, D], out like q, lse [B, Hq, Sq] fp32; block_n keys a stage, `stages` deep
    (the tuned table's WS_BLOCK_N and WS_STAGES); `lazy`: the lazy rescale (_online_softmax, RESCALE_ABOVE), else the
    output is rescaled after every key block (the tuned table's LAZY knob). `persistent` (non-causal only):
    one CTA an SM walks the tiles, loading a tile's q and first K and V blocks while it finishes the previous
    one; causal tiles shorten along a head, and run a CTA each, longest first, as the hardware hands them
    out. `scales` (the FP8 forward: E4M3 q, k and v, v sequence-major): q's, k's and v's fp32 scales, one
    per sequence and head ([B, Hq], [B, Hkv], [B, Hkv], contiguous; `x ~= data * scale`); its lazy
    rescale's threshold is FP8_RESCALE_ABOVE. Check `supported` first."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    n_tiles = cdiv(Sq, BLOCK_M.value) * B * Hq
    if n_tiles == 0:
        return
    persistent = persistent and not causal
    programs = persistent_programs(q.device, n_tiles) if persistent else n_tiles
    fp8 = scales is not None
    v_desc = descriptor(_sequence_major_view(v), (D, block_n)) if fp8 else _descriptor(v, block_n, D)
    rescale_above = (FP8_RESCALE_ABOVE if fp8 else RESCALE_ABOVE) if lazy else -1.0
    bind_context(q.device)
    _attention_fwd_ws_kernel[(programs,)](
        _descriptor(q, HALF_M.value, D), _descriptor(k, block_n, D), v_desc, out, lse,
        *(scales if fp8 else (lse, lse, lse)), n_tiles, Sq, Sk, Hq, Hq // Hkv,
        heads_together(causal, 2 * Sk * D * q.element_size() * Hkv // Hq, CAUSAL_SHARED_BYTES), qk_scale_log2,
        out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1),
        HEAD_DIM=D, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal, RESCALE_ABOVE=rescale_above,
        PERSISTENT=persistent, FP8=fp8, num_warps=4,
    )


# --- the backward's dQ pass ------------------------------------------------------------------------------------
# The forward's pattern with dO beside q: a CTA owns 128 query rows (64 a consumer warpgroup, q and dO loaded
# once), the producer streams K and V blocks, and each warpgroup keeps dQ in registers: per key block
# S = Q K^T and dP = dO V^T from shared memory, P = exp2(S scale - LSE) and dS = P (dP - delta) in registers,
# dQ += dS K with dS straight from registers. As in the forward, block j's S and dP are in flight with
# block j-1's dQ product; K is released after its dQ product, V after its dP.

DQ_KEY_BLOCK = 64  # 128-key blocks spill ~600 B a thread at d128 (S, dP and dQ live at once)
DQ_STAGES = 3  # 176 KB at d128 with q, dO and the scratch
DQ_HEAD_DIMS = (64, 128)  # d256: q and dO alone would take 128 KB


@gluon.jit
def _issue_s_dp(j, q, do, k_bufs, v_bufs, k_ready, v_ready, s_layout: gl.constexpr, BLOCK_N: gl.constexpr,
                STAGES: gl.constexpr):
    """S = Q K^T and dP = dO V^T of key block j, issued (asynchronous) as their K and V land."""
    scores = _issue_scores(j, q, k_bufs, k_ready, s_layout, BLOCK_N, STAGES)
    s = j % STAGES
    mbarrier.wait(v_ready.index(s), (j // STAGES) & 1)
    dp = warpgroup_mma(do, v_bufs.index(s).permute((1, 0)), gl.zeros([HALF_M, BLOCK_N], gl.float32, s_layout),
                       use_acc=False, is_async=True)
    return scores, dp


@gluon.jit
def _ds(j, scores, dp, lse, delta, n_full, rows, diag, seqlen_k, qk_scale, k_bufs, s_layout: gl.constexpr,
        dq_layout: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """dS = P (dP - delta) of key block j, in the dQ product's operand layout; P recomputed from the LSE
    (in log2 units), masked keys at 0."""
    scores = _mask_scores(j, scores, n_full, rows, diag, seqlen_k, s_layout, BLOCK_N, CAUSAL)
    p = gl.exp2(scores * qk_scale - gl.expand_dims(lse, 1))
    ds = p * (dp - gl.expand_dims(delta, 1))
    return gl.convert_layout(ds.to(k_bufs.dtype), gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2))


@gluon.jit
def _dq_partition(q_smem, do_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_free, v_free, lse_ptr, delta_ptr,
                  dq_ptr, n_tiles, seqlen_q, seqlen_k, heads_q, group, heads_together, qk_scale, sm_scale, stride_lb,
                  stride_lh, stride_dqb, stride_dqs, stride_dqh,
                  HALF: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr):
    s_layout: gl.constexpr = _warpgroup_acc(BLOCK_N)
    dq_layout: gl.constexpr = _warpgroup_acc(HEAD_DIM)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    b, h, _kvh, m0, n_full, n_blocks = _tile(gl.program_id(0), n_tiles, seqlen_q, seqlen_k, heads_q, group,
                                             heads_together, BLOCK_N, CAUSAL)
    rows = m0 + HALF * HALF_M + gl.arange(0, HALF_M, layout=row_layout)
    diag = seqlen_k - seqlen_q
    stats = b.to(gl.int64) * stride_lb + h * stride_lh + rows
    # Rows past Sq read 0: their dQ rows are never stored.
    lse = gl.load(lse_ptr + stats, mask=rows < seqlen_q, other=0.0) * LOG2E
    delta = gl.load(delta_ptr + stats, mask=rows < seqlen_q, other=0.0)
    dq = gl.zeros([HALF_M, HEAD_DIM], gl.float32, dq_layout)
    mbarrier.wait(q_ready, 0)
    q = q_smem.index(HALF)
    do = do_smem.index(HALF)
    scores, dp = _issue_s_dp(0, q, do, k_bufs, v_bufs, k_ready, v_ready, s_layout, BLOCK_N, STAGES)
    scores, dp = warpgroup_mma_wait(num_outstanding=0, deps=(scores, dp))
    mbarrier.arrive(v_free.index(0), count=1)
    ds_op = _ds(0, scores, dp, lse, delta, n_full, rows, diag, seqlen_k, qk_scale, k_bufs, s_layout, dq_layout,
                BLOCK_N, CAUSAL)
    for j in range(1, n_blocks):
        scores, dp = _issue_s_dp(j, q, do, k_bufs, v_bufs, k_ready, v_ready, s_layout, BLOCK_N, STAGES)
        dq = warpgroup_mma(ds_op, k_bufs.index((j - 1) % STAGES), dq, is_async=True)
        scores, dp = warpgroup_mma_wait(num_outstanding=1, deps=(scores, dp))
        mbarrier.arrive(v_free.index(j % STAGES), count=1)
        ds_next = _ds(j, scores, dp, lse, delta, n_full, rows, diag, seqlen_k, qk_scale, k_bufs, s_layout, dq_layout,
                      BLOCK_N, CAUSAL)
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
        mbarrier.arrive(k_free.index((j - 1) % STAGES), count=1)
        ds_op = ds_next
    dq = warpgroup_mma(ds_op, k_bufs.index((n_blocks - 1) % STAGES), dq, is_async=True)
    dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
    mbarrier.arrive(k_free.index((n_blocks - 1) % STAGES), count=1)
    _store_rows(dq_ptr, dq * sm_scale, b, h, m0 + HALF * HALF_M, seqlen_q, stride_dqb, stride_dqs, stride_dqh,
                HEAD_DIM)


@fast_launch
@gluon.jit
def _attention_bwd_dq_ws_kernel(q_desc, k_desc, v_desc, do_desc, lse_ptr, delta_ptr, dq_ptr, n_tiles, seqlen_q,
                                seqlen_k, heads_q, group, heads_together, qk_scale, sm_scale, stride_lb, stride_lh,
                                stride_dqb, stride_dqs, stride_dqh,
                                HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                                CAUSAL: gl.constexpr):
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, HALF_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [2, HALF_M, HEAD_DIM], do_desc.layout)
    k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free = _kv_ring(k_desc, v_desc, HEAD_DIM, BLOCK_N,
                                                                                 STAGES)
    gl.warp_specialize([
        (_dq_partition, (q_smem, do_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_free, v_free, lse_ptr,
                         delta_ptr, dq_ptr, n_tiles, seqlen_q, seqlen_k, heads_q, group, heads_together, qk_scale,
                         sm_scale, stride_lb, stride_lh, stride_dqb, stride_dqs, stride_dqh, 0, HEAD_DIM, BLOCK_N,
                         STAGES, CAUSAL)),
        (_dq_partition, (q_smem, do_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_free, v_free, lse_ptr,
                         delta_ptr, dq_ptr, n_tiles, seqlen_q, seqlen_k, heads_q, group, heads_together, qk_scale,
                         sm_scale, stride_lb, stride_lh, stride_dqb, stride_dqs, stride_dqh, 1, HEAD_DIM, BLOCK_N,
                         STAGES, CAUSAL)),
        (_load_partition, (q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_bufs, v_bufs, q_ready, q_free, k_ready,
                           v_ready, k_free, v_free, n_tiles, seqlen_q, seqlen_k, heads_q, group, heads_together,
                           HEAD_DIM, BLOCK_N, STAGES, CAUSAL, True, False)),
    ], [4, 1], [232, 40])


def supports_dq(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, causal: bool,
                window: int | None, packed: bool) -> bool:
    """Whether backward_dq_ws runs the problem: the forward's conditions, at head dims 64 and 128."""
    return q.shape[-1] in DQ_HEAD_DIMS and _serves((q, k, v, grad_out), causal, window, packed)


def backward_dq_ws(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, lse: torch.Tensor,
                   delta: torch.Tensor, dq: torch.Tensor, causal: bool, qk_scale_log2: float, sm_scale: float,
                   block_n: int = DQ_KEY_BLOCK, stages: int = DQ_STAGES) -> None:
    """dQ into dq ([B, Sq, Hq, D], laid out as q) from the forward's natural-log LSE and delta = rowsum(dO * O)
    ([B, Hq, Sq] fp32 each); the scores scaled as in forward_ws, sm_scale the softmax scale itself; grad_out
    as q. Check `supports_dq` first."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    n_tiles = cdiv(Sq, BLOCK_M.value) * B * Hq
    if n_tiles == 0:
        return
    bind_context(q.device)
    _attention_bwd_dq_ws_kernel[(n_tiles,)](
        _descriptor(q, HALF_M.value, D), _descriptor(k, block_n, D),
        _descriptor(v, block_n, D), _descriptor(grad_out, HALF_M.value, D),
        lse, delta, dq, n_tiles, Sq, Sk, Hq, Hq // Hkv,
        heads_together(causal, 2 * Sk * D * q.element_size() * Hkv // Hq, CAUSAL_SHARED_BYTES), qk_scale_log2,
        sm_scale, lse.stride(0), lse.stride(1),
        dq.stride(0), dq.stride(1), dq.stride(2),
        HEAD_DIM=D, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal, num_warps=4,
    )


# --- the fused backward -----------------------------------------------------------------------------------------
# FlashAttention-3's backward: a CTA owns 128 keys of one kv head (K and V loaded once, 64 keys a consumer
# warpgroup, dK and dV in its registers) and walks every query block of 64 rows of every q head of its group,
# streamed by the producer with its dO. Per block each warpgroup computes its keys' S^T = K Q^T and dP^T = V dO^T,
# P^T and dS^T in registers, dV += P^T dO and dK += dS^T Q with both straight from registers; dS^T also goes to
# shared memory, where, once both warpgroups' halves have landed, each multiplies all 128 keys' dS by half of K's
# columns: its half of the block's dQ share, staged in shared memory and added into an fp32 dQ by a TMA
# reduction that a warp of its own issues. Five block matmuls where the two-pass backward (the Triton dK/dV pass
# and the dQ pass) computes seven: S and dP once, not twice. dV's product is issued as soon as P is (it runs while
# dS is computed), dK's as soon as dS is (while dS is shared: 1.02-1.05x causal). Each step's LSE and delta come
# through shared memory from the producer, loaded while it waits for the stage (1.05x at d128): loaded by the
# consumers themselves they were live across the step's matmuls beside dK, dV, S^T and dP^T, and ptxas spilled
# 120-448 bytes a thread at d128 (1.08-1.10x slower, H100); now none at d64 or d128 (Triton 3.6, sm_90a) but
# 20 bytes on d128's persistent grid, which K's and V's descriptors built each step remove, but ran 0.985x.
# At d256 (bwd_key_block) a CTA owns 64 keys and each warpgroup half of dK's and dV's columns for all of them
# (by columns): each computes S^T and dP^T for 32 of the block's 64 query rows, P and dS go through shared memory
# to both, and dQ's staging, for which shared memory has no room of its own there, goes into the step's dO and q
# buffers once no product reads them, the reducer handing the stage back to the producer (222 KB, P in two
# buffers so that dV's product need not finish before dS is shared: 1.02-1.05x causal): 1.12x cuDNN non-causal,
# 1.00x causal (H100, K's and V's descriptors built each step; 1.07x / 0.89x before, when they spilled). There it
# is bound by the L2's throughput (94% of its peak, ncu): each CTA owns 64 keys, so each step's q and dO
# reads and dQ reductions (64 KB each) serve half the products they serve at d128, and cuDNN moves half those
# bytes. Staged in a [64, 32] tile a warpgroup, handed to the reducer and
# back four times a step, dQ held it to 0.74x / 0.66x (1.05x without the reductions, 1.7x without staging);
# both warpgroups computing all of S^T and dP^T, to 0.69x / 0.63x (docs/performance.md, 2026-11-25).
# Persistent (backward_ws's `persistent`), a CTA an SM walks tiles: the consumers release K and V once their
# last dQ products have read K, and the producer loads the next tile's while they store dK and dV. Non-causal
# tiles go in turn, causal ones from a counter (_next_tile); the producer passes each to the other partitions
# through a two-slot ring in shared memory (_publish_tile, _received_tile).

# Causal tiles on the persistent grid (the tile counter) at these head dims: 1.019x a CTA a tile at d64, 1.004 /
# 1.015 / 1.035 / 1.008x at d256 (2 x 8k, 4 x 4k, 8 x 2k, 16 x 1k); at d128 0.992-1.017x (llama3-8b's GQA
# 0.992 / 0.995x), where that build spills 36-60 bytes a thread (H100, 11 shuffled rounds).
CAUSAL_PERSISTENT_HEAD_DIMS = (64, 256)
BWD_STAGES = 2  # q and dO blocks in flight: 198 KB at d128 with K, V, dS and dQ's staging (3: 140 B spilled)
BWD_HEAD_DIMS = (64, 128, 256)


def bwd_key_block(head_dim: int) -> int:
    """Keys a CTA of the fused backward: 128, 64 a consumer warpgroup; at d256 64, both warpgroups on all of
    them, each on half of the head dim (dK and dV of 64 keys x 256 would take 256 registers a thread)."""
    return 64 if head_dim > 128 else 128


def bwd_dq_chunk(head_dim: int) -> int:
    """Columns of dQ a consumer computes and stages at a time: its half of the head dim, 64 at a time at d256
    (staged in the step's dO and q buffers, _dq_staging)."""
    return min(head_dim // 2, 64)


@builtin
def _tma_reduce_add_v36(tensor_desc, coord, src, _semantic=None):
    """tma.async_atomic_add (Triton 3.7 on) for Triton 3.6, whose Gluon has the builder's op but not its name."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


_tma_reduce_add = getattr(tma, "async_atomic_add", None) or _tma_reduce_add_v36


@builtin
def _reinterpret(smem, dtype, shape, layout, _semantic=None):
    """shared_memory_descriptor.reinterpret (Triton 3.7 on; `_reinterpret` before, the same op)."""
    return _semantic.memdesc_reinterpret(smem, _unwrap_if_constexpr(dtype), [_unwrap_if_constexpr(n) for n in shape],
                                         _unwrap_if_constexpr(layout))


@gluon.jit
def _dq_staging(staging, s, C: gl.constexpr, DQ_CHUNK: gl.constexpr):
    """The two warpgroups' [64, DQ_CHUNK] fp32 tiles that stage chunk C of step s's dQ: by keys, staging is
    (the tiles,), reused every chunk; by columns (d256, where shared memory has no room of their own for
    them), it is (dO's stages, q's stages): chunk 0 goes into the step's dO buffer and chunk 1 into its q
    buffer once both warpgroups' dV and dK products, their last readers, are done, and the stage goes back
    to the producer when the reducer has read them."""
    if len(staging) == 1:
        tiles = staging[0]
    else:  # in the layout of dQ's TMA descriptor (_descriptor)
        layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HALF_M, DQ_CHUNK], gl.float32)
        tiles = _reinterpret(staging[C].index(s), gl.float32, [2, HALF_M, DQ_CHUNK], layout)
    return tiles


@gluon.jit
def _bwd_tile(t, n_tiles, seqlen_q, seqlen_k, heads_kv, group, heads_together, KEYS: gl.constexpr,
              CAUSAL: gl.constexpr):
    """Tile t of n_tiles (a head's key blocks, then the (batch, kv head) pairs): its key block and (batch, kv
    head), and its walk: query blocks [m_first, m_blocks) of each of the group's q heads, last first (_bwd_step;
    causal: down to the first block whose last row sees the block's first key, the longest walks first,
    heads_together heads at a time: _heads_side_by_side). A head's key blocks run side by side, sharing its q
    and dO in L2 (all heads side by side instead: 0.93x non-causal, 0.88x at d64, 0.91x at d256 causal, 1.08x
    on llama3-8b; H100)."""
    n_blocks = gl.cdiv(seqlen_k, KEYS)
    if CAUSAL:
        block, bh = _heads_side_by_side(t, n_blocks, n_tiles // n_blocks, heads_together)
    else:
        block = t % n_blocks
        bh = t // n_blocks
    n0 = block * KEYS
    b = bh // heads_kv
    kvh = bh % heads_kv
    m_blocks = gl.cdiv(seqlen_q, HALF_M)
    # causal: row i sees keys j <= i + Sk - Sq
    m_first = gl.maximum(n0 - (seqlen_k - seqlen_q), 0) // HALF_M if CAUSAL else 0
    return b, kvh, n0, m_first, (m_blocks - m_first) * group


@gluon.jit
def _bwd_step(t, m_first, kvh, group, steps_per_head):
    """Step t of the walk: (q head, first query row). Each head's query blocks go last first, down to m_first
    (the causal diagonal's block last): the CTAs that start side by side read the same q and dO blocks at the
    same time, as non-causal walks do, where from the diagonal up each reads its own (H100, 7 shuffled rounds:
    1.013x at d64 causal, 2 x 8k, every round ahead; 1.000-1.004x at d128, d256 and on llama3-8b's GQA)."""
    return kvh * group + t // steps_per_head, (m_first + steps_per_head - 1 - t % steps_per_head) * HALF_M


@gluon.jit
def _publish_tile(t, lap, schedule):
    """The producer hands tile t, its CTA's lap-th, to the other partitions through a two-slot ring (a tile
    past the last tells them to stop)."""
    tile_ids, tile_ready, tile_taken, _counter = schedule
    slot = lap % 2
    mbarrier.wait(tile_taken.index(slot), ((lap // 2) & 1) ^ 1)
    tile_ids.index(slot).store(gl.full([1], t, gl.int32, gl.BlockedLayout([1], [32], [1], [0])))
    mbarrier.arrive(tile_ready.index(slot), count=1)


@gluon.jit
def _received_tile(lap, schedule, WARPS: gl.constexpr):
    """The tile the producer handed out as its CTA's lap-th (_publish_tile), read by a partition of WARPS warps."""
    tile_ids, tile_ready, tile_taken, _counter = schedule
    slot = lap % 2
    mbarrier.wait(tile_ready.index(slot), (lap // 2) & 1)
    t = gl.max(tile_ids.index(slot).load(gl.BlockedLayout([1], [32], [WARPS], [0])), axis=0)
    mbarrier.arrive(tile_taken.index(slot), count=1)
    return t


@gluon.jit
def _next_tile(t, schedule, CAUSAL: gl.constexpr):
    """The producer's tile after t (every CTA's first is its program id): non-causal tiles are all alike and go
    in turn; causal walks shorten along a head, so the next no CTA has started, from the counter (zeroed before
    the launch) in the order _bwd_tile counts them, longest first."""
    if CAUSAL:
        t = gl.atomic_add(schedule[3], 1, sem="relaxed") + gl.num_programs(0)
    else:
        t += gl.num_programs(0)
    return t


@gluon.jit
def _bwd_load_tile(t, lap, g, q_desc, do_desc, k_desc, v_desc, q_bufs, do_bufs, k_buf, v_buf, lse_bufs,
                   delta_bufs, kv_ready, kv_free, qdo_ready, qdo_free, lse_ptr, delta_ptr, n_tiles, seqlen_q,
                   seqlen_k, heads_kv, group, heads_together, stride_lb, stride_lh, HEAD_DIM: gl.constexpr,
                   KEYS: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """Tile t's loads, the CTA's lap-th tile, its steps from ring position g on: its K and V once the consumers
    are done with the previous tile's, then each step's q and dO blocks through the ring, and beside them the
    block's LSE (in log2 units) and delta, loaded here so that the consumers read them from shared memory when
    they need them (held in their registers across the matmuls, they spilled). Returns its steps."""
    stat_layout: gl.constexpr = gl.BlockedLayout([HALF_M // 32], [32], [1], [0])
    b, kvh, n0, m_first, steps = _bwd_tile(t, n_tiles, seqlen_q, seqlen_k, heads_kv, group, heads_together, KEYS,
                                           CAUSAL)
    # A fresh barrier counts as having completed the phase before its first: the first tile's wait passes.
    mbarrier.wait(kv_free, (lap & 1) ^ 1)
    mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    _tma_load(k_desc, [b * seqlen_k + n0, kvh * HEAD_DIM], kv_ready, k_buf.index(0))
    _tma_load(v_desc, [b * seqlen_k + n0, kvh * HEAD_DIM], kv_ready, v_buf.index(0))
    steps_per_head = steps // group
    for i in range(steps):
        s = (g + i) % STAGES
        h, m0 = _bwd_step(i, m_first, kvh, group, steps_per_head)
        # The statistics are loaded while the stage is still in use (their latency under the wait).
        rows = m0 + gl.arange(0, HALF_M, layout=stat_layout)
        stats = b.to(gl.int64) * stride_lb + h * stride_lh + rows
        # Rows past Sq get an infinite LSE: P = 0 there, so they add nothing to dK, dV or (through dS) to dQ.
        lse = gl.load(lse_ptr + stats, mask=rows < seqlen_q, other=float("inf")) * LOG2E
        delta = gl.load(delta_ptr + stats, mask=rows < seqlen_q, other=0.0)
        mbarrier.wait(qdo_free.index(s), (((g + i) // STAGES) & 1) ^ 1)
        mbarrier.expect(qdo_ready.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        _tma_load(q_desc, [b * seqlen_q + m0, h * HEAD_DIM], qdo_ready.index(s), q_bufs.index(s))
        _tma_load(do_desc, [b * seqlen_q + m0, h * HEAD_DIM], qdo_ready.index(s), do_bufs.index(s))
        lse_bufs.index(s).store(lse)
        delta_bufs.index(s).store(delta)
        mbarrier.arrive(qdo_ready.index(s), count=1)
    return steps


@gluon.jit
def _bwd_load_partition(q_desc, do_desc, k_desc, v_desc, q_bufs, do_bufs, k_buf, v_buf, lse_bufs, delta_bufs,
                        kv_ready, kv_free, qdo_ready, qdo_free, lse_ptr, delta_ptr, schedule, n_tiles, seqlen_q,
                        seqlen_k, heads_kv, group, heads_together, stride_lb, stride_lh, HEAD_DIM: gl.constexpr,
                        KEYS: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, PERSISTENT: gl.constexpr):
    """The producer: its CTA's tile, or (PERSISTENT) its tiles (_next_tile), each handed to the other
    partitions (_publish_tile), the ring's position running on from tile to tile. The other partitions are
    split the same way: a tile a CTA runs outside any loop (one loop for both spilled 32-52 bytes a thread
    causal, ptxas of Triton 3.9)."""
    if PERSISTENT:
        g = 0
        lap = 0
        t = gl.program_id(0)
        while t < n_tiles:
            _publish_tile(t, lap, schedule)
            g += _bwd_load_tile(t, lap, g, q_desc, do_desc, k_desc, v_desc, q_bufs, do_bufs, k_buf, v_buf, lse_bufs,
                                delta_bufs, kv_ready, kv_free, qdo_ready, qdo_free, lse_ptr, delta_ptr, n_tiles,
                                seqlen_q, seqlen_k, heads_kv, group, heads_together, stride_lb, stride_lh, HEAD_DIM,
                                KEYS, STAGES, CAUSAL)
            t = _next_tile(t, schedule, CAUSAL)
            lap += 1
        _publish_tile(t, lap, schedule)
    else:
        _bwd_load_tile(gl.program_id(0), 0, 0, q_desc, do_desc, k_desc, v_desc, q_bufs, do_bufs, k_buf, v_buf,
                       lse_bufs, delta_bufs, kv_ready, kv_free, qdo_ready, qdo_free, lse_ptr, delta_ptr, n_tiles,
                       seqlen_q, seqlen_k, heads_kv, group, heads_together, stride_lb, stride_lh, HEAD_DIM, KEYS,
                       STAGES, CAUSAL)


@gluon.jit
def _bwd_reduce_tile(t, g, dq_desc, staging, dq_full, dq_empty, qdo_free, n_tiles, seqlen_q, seqlen_k, heads_kv, group,
                     heads_together, HEAD_DIM: gl.constexpr, KEYS: gl.constexpr, DQ_CHUNK: gl.constexpr,
                     STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """Tile t's dQ reductions, its steps from ring position g on: each step's chunks of dQ's share, staged by the
    consumers (each a half of the columns, DQ_CHUNK at a time), added into the fp32 dQ by TMA reductions; a
    staging tile is released once the reduction has read it (at d256, staged in the step's q and dO buffers, the
    whole stage). Returns its steps."""
    CHUNKS: gl.constexpr = HEAD_DIM // 2 // DQ_CHUNK
    BY_COLUMNS: gl.constexpr = KEYS == HALF_M
    b, kvh, _n0, m_first, steps = _bwd_tile(t, n_tiles, seqlen_q, seqlen_k, heads_kv, group, heads_together, KEYS,
                                            CAUSAL)
    steps_per_head = steps // group
    for i in range(steps):
        s = (g + i) % STAGES
        h, m0 = _bwd_step(i, m_first, kvh, group, steps_per_head)
        for c in gl.static_range(CHUNKS):
            tiles = _dq_staging(staging, s, c, DQ_CHUNK)
            for half in gl.static_range(2):
                mbarrier.wait(dq_full.index((s * CHUNKS + c) * 2 + half), ((g + i) // STAGES) & 1)
                _tma_reduce_add(dq_desc, [b * seqlen_q + m0, h * HEAD_DIM + half * (HEAD_DIM // 2) + c * DQ_CHUNK],
                                tiles.index(half))
            if not BY_COLUMNS:
                tma.store_wait(0)
                for half in gl.static_range(2):
                    mbarrier.arrive(dq_empty.index(half), count=1)
        if BY_COLUMNS:
            tma.store_wait(0)
            mbarrier.arrive(qdo_free.index(s), count=1)
    return steps


@gluon.jit
def _bwd_reduce_partition(dq_desc, staging, dq_full, dq_empty, qdo_free, schedule, n_tiles, seqlen_q, seqlen_k,
                          heads_kv, group, heads_together, HEAD_DIM: gl.constexpr, KEYS: gl.constexpr,
                          DQ_CHUNK: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                          PERSISTENT: gl.constexpr):
    """dQ's reducer: the producer's tiles and steps."""
    if PERSISTENT:
        g = 0
        lap = 0
        t = _received_tile(lap, schedule, 1)
        while t < n_tiles:
            g += _bwd_reduce_tile(t, g, dq_desc, staging, dq_full, dq_empty, qdo_free, n_tiles, seqlen_q, seqlen_k,
                                  heads_kv, group, heads_together, HEAD_DIM, KEYS, DQ_CHUNK, STAGES, CAUSAL)
            lap += 1
            t = _received_tile(lap, schedule, 1)
    else:
        _bwd_reduce_tile(gl.program_id(0), 0, dq_desc, staging, dq_full, dq_empty, qdo_free, n_tiles, seqlen_q,
                         seqlen_k, heads_kv, group, heads_together, HEAD_DIM, KEYS, DQ_CHUNK, STAGES, CAUSAL)


@gluon.jit
def _masked_scores(st, keys, key0, m0, seqlen_k, diag, rows_layout: gl.constexpr, ROWS: gl.constexpr,
                   CAUSAL: gl.constexpr):
    """S^T of keys [key0, key0 + 64) by query rows [m0, m0 + ROWS), -inf where a key is past the sequence or
    (causal) after the row. One branch for both masks (a branch each, or the causal mask on every step:
    0.75-0.95x causal)."""
    if key0 + HALF_M > seqlen_k or (CAUSAL and m0 + diag < key0 + HALF_M - 1):
        visible = gl.expand_dims(keys < seqlen_k, 1)
        if CAUSAL:
            rows = m0 + gl.arange(0, ROWS, layout=rows_layout)
            visible = visible & (gl.expand_dims(keys, 1) <= gl.expand_dims(rows + diag, 0))
        st = gl.where(visible, st, -float("inf"))
    return st


@gluon.jit
def _bwd_products_by_keys(t, s, q, do, k_smem, v_smem, lse_bufs, delta_bufs, ds_bufs, ds_ready, dk, dv, key0, m0,
                          seqlen_k, diag, qk_scale, sm_scale, HALF: gl.constexpr, CAUSAL: gl.constexpr):
    """A step of a warpgroup owning 64 keys and all of dK's and dV's columns (head dims 64 and 128): S^T and dP^T
    of its keys, dV and dK from registers, its dS^T into the step's exchange buffer. Returns dK, dV (their
    products in flight) and dS of the CTA's keys in shared memory once both halves are there."""
    st_layout: gl.constexpr = _warpgroup_acc(HALF_M)  # S^T, dP^T: [64 keys, 64 query rows]
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dk.type.layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(0, st_layout)
    k_rows = k_smem.slice(HALF * HALF_M, HALF_M)
    v_rows = v_smem.slice(HALF * HALF_M, HALF_M)
    zeros = gl.zeros([HALF_M, HALF_M], gl.float32, st_layout)
    st = warpgroup_mma(k_rows, q.permute((1, 0)), zeros, use_acc=False, is_async=True)
    dpt = warpgroup_mma(v_rows, do.permute((1, 0)), zeros, use_acc=False, is_async=True)
    st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
    keys = key0 + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, st_layout))
    st = _masked_scores(st, keys, key0, m0, seqlen_k, diag, row_layout, HALF_M, CAUSAL)
    pt = gl.exp2(st * qk_scale - gl.expand_dims(lse_bufs.index(s).load(row_layout), 0))
    # dV's product runs while dS is computed.
    dv = warpgroup_mma(gl.convert_layout(pt.to(k_smem.dtype), op_layout), do, dv, is_async=True)
    dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt,))
    # dS carries the softmax scale: dK = dS^T Q and dQ = dS K come out scaled.
    dst = (pt * (dpt - gl.expand_dims(delta_bufs.index(s).load(row_layout), 0)) * sm_scale).to(k_smem.dtype)
    # dK's product runs while dS is shared with the other warpgroup.
    dk = warpgroup_mma(gl.convert_layout(dst, op_layout), q, dk, is_async=True)
    ds = ds_bufs.index(t % 2)
    ds.slice(HALF * HALF_M, HALF_M).store(dst)
    fence_async_shared()
    mbarrier.arrive(ds_ready, count=1)
    mbarrier.wait(ds_ready, t & 1)
    return dk, dv, ds.permute((1, 0))


@gluon.jit
def _bwd_products_by_columns(t, s, q, do, k_smem, v_smem, lse_bufs, delta_bufs, ds_bufs, p_ready, ds_ready, dk, dv,
                             n0, m0, seqlen_k, diag, qk_scale, sm_scale, HALF: gl.constexpr, COLS: gl.constexpr,
                             CAUSAL: gl.constexpr):
    """A step of a warpgroup holding half of dK's and dV's columns for all 64 keys of the CTA (head dim 256):
    S^T and dP^T of its 32 of the block's query rows, P and dS of those rows into the exchange buffers (rows
    queries), then dV and dK from there, all 64 rows. Each block product computed once (at d256, dK and dV
    of 64 keys x 256 in one warpgroup would take 256 registers a thread). P has two buffers, one a step, so
    that a warpgroup writes the next step's while the other's dV product may still read this one's; dS one:
    a warpgroup overwrites it only after the other has arrived on the next step's P barrier, its dK and dQ
    products done."""
    ROWS: gl.constexpr = HALF_M // 2
    st_layout: gl.constexpr = _warpgroup_acc(ROWS)  # S^T, dP^T: [64 keys, 32 query rows]
    row_layout: gl.constexpr = gl.SliceLayout(0, st_layout)
    r0: gl.constexpr = HALF * ROWS
    col0: gl.constexpr = HALF * COLS
    p_smem = ds_bufs.index(t % 2)
    ds_smem = ds_bufs.index(2)
    zeros = gl.zeros([HALF_M, ROWS], gl.float32, st_layout)
    st = warpgroup_mma(k_smem, q.slice(r0, ROWS).permute((1, 0)), zeros, use_acc=False, is_async=True)
    dpt = warpgroup_mma(v_smem, do.slice(r0, ROWS).permute((1, 0)), zeros, use_acc=False, is_async=True)
    st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
    keys = n0 + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, st_layout))
    st = _masked_scores(st, keys, n0, m0 + r0, seqlen_k, diag, row_layout, ROWS, CAUSAL)
    pt = gl.exp2(st * qk_scale - gl.expand_dims(lse_bufs.index(s).slice(r0, ROWS).load(row_layout), 0))
    p_smem.slice(r0, ROWS).store(gl.permute(pt.to(k_smem.dtype), (1, 0)))
    fence_async_shared()
    mbarrier.arrive(p_ready, count=1)
    dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt,))
    delta = delta_bufs.index(s).slice(r0, ROWS).load(row_layout)
    dst = (pt * (dpt - gl.expand_dims(delta, 0)) * sm_scale).to(k_smem.dtype)  # scaled as by_keys' dS
    mbarrier.wait(p_ready, t & 1)
    # dV's product runs while dS is stored and shared.
    dv = warpgroup_mma(p_smem.permute((1, 0)), do.slice(col0, COLS, dim=1), dv, is_async=True)
    ds_smem.slice(r0, ROWS).store(gl.permute(dst, (1, 0)))
    fence_async_shared()
    mbarrier.arrive(ds_ready, count=1)
    mbarrier.wait(ds_ready, t & 1)
    dk = warpgroup_mma(ds_smem.permute((1, 0)), q.slice(col0, COLS, dim=1), dk, is_async=True)
    return dk, dv, ds_smem


@gluon.jit
def _bwd_consume_tile(t, lap, g, q_bufs, do_bufs, k_buf, v_buf, lse_bufs, delta_bufs, ds_bufs, staging, kv_ready,
                      kv_free, qdo_ready, qdo_free, p_ready, ds_ready, products_done, dq_full, dq_empty, dk_ptr,
                      dv_ptr, n_tiles, seqlen_q, seqlen_k, heads_kv, group, heads_together, qk_scale, sm_scale,
                      stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh, HALF: gl.constexpr,
                      HEAD_DIM: gl.constexpr, KEYS: gl.constexpr, DQ_CHUNK: gl.constexpr, STAGES: gl.constexpr,
                      CAUSAL: gl.constexpr):
    """A consumer warpgroup's share of tile t, the CTA's lap-th tile, its steps from ring position g on (the
    barriers' phases count steps over the CTA's tiles): dK and dV of its keys (or columns) over the walk, its
    half of each step's dQ share staged for the reducer; K and V released to the next tile's loads before dK
    and dV are stored. Returns its steps."""
    # BY_COLUMNS (d256, bwd_key_block): both warpgroups on the CTA's 64 keys, each on half of dK's and dV's
    # columns; else each on 64 of its 128 keys, all columns.
    BY_COLUMNS: gl.constexpr = KEYS == HALF_M
    COLS: gl.constexpr = HEAD_DIM // 2 if BY_COLUMNS else HEAD_DIM  # dK's and dV's columns a warpgroup holds
    CHUNKS: gl.constexpr = HEAD_DIM // 2 // DQ_CHUNK
    kv_layout: gl.constexpr = _warpgroup_acc(COLS)  # dK, dV: [64 keys, COLS]
    dq_layout: gl.constexpr = _warpgroup_acc(DQ_CHUNK)  # a chunk of dQ's columns: [64 query rows, DQ_CHUNK]
    b, kvh, n0, m_first, steps = _bwd_tile(t, n_tiles, seqlen_q, seqlen_k, heads_kv, group, heads_together, KEYS,
                                           CAUSAL)
    key0 = n0 if BY_COLUMNS else n0 + HALF * HALF_M  # the first of the keys whose dK and dV are held here
    col0: gl.constexpr = HALF * COLS if BY_COLUMNS else 0  # the first of dK's and dV's columns held here
    diag = seqlen_k - seqlen_q
    dk = gl.zeros([HALF_M, COLS], gl.float32, kv_layout)
    dv = gl.zeros([HALF_M, COLS], gl.float32, kv_layout)
    steps_per_head = steps // group
    mbarrier.wait(kv_ready, lap & 1)
    for i in range(steps):
        step = g + i
        s = step % STAGES
        _h, m0 = _bwd_step(i, m_first, kvh, group, steps_per_head)
        mbarrier.wait(qdo_ready.index(s), (step // STAGES) & 1)
        q = q_bufs.index(s)
        do = do_bufs.index(s)
        # At d256 K's and V's wgmma descriptors are built each step, from a slot index that is always 0 but
        # not known to be: hoisted out of the loop (LLVM's way with loop-invariant values) they held 64
        # registers, and ptxas (Triton 3.6) spilled 148-180 bytes a thread, reloaded every step (H100, built
        # each step: 1.05x non-causal, 1.14x causal). At d64 and d128 they stay in uniform registers, and
        # built each step ran 0.97-0.99x.
        slot = step >> 30 if BY_COLUMNS else 0
        k_smem = k_buf.index(slot)
        v_smem = v_buf.index(slot)
        if BY_COLUMNS:
            dk, dv, ds = _bwd_products_by_columns(step, s, q, do, k_smem, v_smem, lse_bufs, delta_bufs, ds_bufs,
                                                  p_ready, ds_ready, dk, dv, n0, m0, seqlen_k, diag, qk_scale,
                                                  sm_scale, HALF, COLS, CAUSAL)
        else:
            dk, dv, ds = _bwd_products_by_keys(step, s, q, do, k_smem, v_smem, lse_bufs, delta_bufs, ds_bufs,
                                               ds_ready, dk, dv, key0, m0, seqlen_k, diag, qk_scale, sm_scale, HALF,
                                               CAUSAL)
        # dS of all the CTA's keys in shared memory: this warpgroup's half of dQ's columns, a chunk at a time.
        for c in gl.static_range(CHUNKS):
            dq = warpgroup_mma(ds, k_smem.slice(HALF * (HEAD_DIM // 2) + c * DQ_CHUNK, DQ_CHUNK, dim=1),
                               gl.zeros([HALF_M, DQ_CHUNK], gl.float32, dq_layout), use_acc=False, is_async=True)
            if c == 0:  # dV's and dK's products are done too: this warpgroup reads q and dO no more
                dv, dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq))
                if BY_COLUMNS:
                    mbarrier.arrive(products_done, count=1)
                else:
                    mbarrier.arrive(qdo_free.index(s), count=1)
            else:
                dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
            if not BY_COLUMNS:  # the reducer has read the last one
                mbarrier.wait(dq_empty.index(HALF), ((step * CHUNKS + c) & 1) ^ 1)
            elif c == 0:  # into the step's dO and q buffers once neither warpgroup's products read them
                mbarrier.wait(products_done, step & 1)
            _dq_staging(staging, s, c, DQ_CHUNK).index(HALF).store(dq)
            fence_async_shared()
            mbarrier.arrive(dq_full.index((s * CHUNKS + c) * 2 + HALF), count=1)
    # The last dQ products read K: the next tile's K and V may land while dK and dV are stored.
    mbarrier.arrive(kv_free, count=1)
    _store_rows(dk_ptr + col0, dk, b, kvh, key0, seqlen_k, stride_dkb, stride_dks, stride_dkh, COLS)
    _store_rows(dv_ptr + col0, dv, b, kvh, key0, seqlen_k, stride_dvb, stride_dvs, stride_dvh, COLS)
    return steps


@gluon.jit
def _bwd_partition(q_bufs, do_bufs, k_buf, v_buf, lse_bufs, delta_bufs, ds_bufs, staging, kv_ready, kv_free,
                   qdo_ready, qdo_free, p_ready, ds_ready, products_done, dq_full, dq_empty, dk_ptr, dv_ptr, schedule,
                   n_tiles, seqlen_q, seqlen_k, heads_kv, group, heads_together, qk_scale, sm_scale, stride_dkb,
                   stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh, HALF: gl.constexpr,
                   HEAD_DIM: gl.constexpr, KEYS: gl.constexpr, DQ_CHUNK: gl.constexpr, STAGES: gl.constexpr,
                   CAUSAL: gl.constexpr, PERSISTENT: gl.constexpr):
    """A consumer warpgroup: the producer's tiles and steps."""
    if PERSISTENT:
        g = 0
        lap = 0
        t = _received_tile(lap, schedule, 4)
        while t < n_tiles:
            g += _bwd_consume_tile(t, lap, g, q_bufs, do_bufs, k_buf, v_buf, lse_bufs, delta_bufs, ds_bufs, staging,
                                   kv_ready, kv_free, qdo_ready, qdo_free, p_ready, ds_ready, products_done, dq_full,
                                   dq_empty, dk_ptr, dv_ptr, n_tiles, seqlen_q, seqlen_k, heads_kv, group,
                                   heads_together, qk_scale, sm_scale, stride_dkb, stride_dks, stride_dkh, stride_dvb,
                                   stride_dvs, stride_dvh, HALF, HEAD_DIM, KEYS, DQ_CHUNK, STAGES, CAUSAL)
            lap += 1
            t = _received_tile(lap, schedule, 4)
    else:
        _bwd_consume_tile(gl.program_id(0), 0, 0, q_bufs, do_bufs, k_buf, v_buf, lse_bufs, delta_bufs, ds_bufs,
                          staging, kv_ready, kv_free, qdo_ready, qdo_free, p_ready, ds_ready, products_done, dq_full,
                          dq_empty, dk_ptr, dv_ptr, n_tiles, seqlen_q, seqlen_k, heads_kv, group, heads_together,
                          qk_scale, sm_scale, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh,
                          HALF, HEAD_DIM, KEYS, DQ_CHUNK, STAGES, CAUSAL)


@fast_launch
@gluon.jit
def _attention_bwd_ws_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                             tile_counter, n_tiles, seqlen_q, seqlen_k, heads_kv, group, heads_together, qk_scale,
                             sm_scale, stride_lb, stride_lh, stride_dkb, stride_dks, stride_dkh, stride_dvb,
                             stride_dvs, stride_dvh,
                             HEAD_DIM: gl.constexpr, KEYS: gl.constexpr, DQ_CHUNK: gl.constexpr,
                             STAGES: gl.constexpr, CAUSAL: gl.constexpr, PERSISTENT: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    BY_COLUMNS: gl.constexpr = KEYS == HALF_M
    q_bufs = gl.allocate_shared_memory(dtype, [STAGES, HALF_M, HEAD_DIM], q_desc.layout)
    do_bufs = gl.allocate_shared_memory(dtype, [STAGES, HALF_M, HEAD_DIM], do_desc.layout)
    # K and V as one-slot buffers: the consumers index them each step (_bwd_consume_tile).
    k_buf = gl.allocate_shared_memory(dtype, [1, KEYS, HEAD_DIM], k_desc.layout)
    v_buf = gl.allocate_shared_memory(dtype, [1, KEYS, HEAD_DIM], v_desc.layout)
    # By keys: dS^T of a step, all the CTA's keys; two, so that a warpgroup writes the next step's while the
    # other may still read this one's. By columns (KEYS 64): two steps' P and a step's dS, rows queries.
    ds_bufs = gl.allocate_shared_memory(dtype, [3 if BY_COLUMNS else 2, KEYS, HALF_M],
                                        gl.NVMMASharedLayout.get_default_for([KEYS, HALF_M], dtype))
    if BY_COLUMNS:  # dQ staged in the step's dO and q buffers (_dq_staging)
        staging = (do_bufs, q_bufs)
    else:
        staging = (gl.allocate_shared_memory(gl.float32, [2, HALF_M, DQ_CHUNK], dq_desc.layout),)
    stats_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    lse_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, HALF_M], stats_layout)
    delta_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, HALF_M], stats_layout)
    # The persistent grid's tiles, passed from the producer to the other partitions (_publish_tile).
    tile_ids = gl.allocate_shared_memory(gl.int32, [2, 1], stats_layout)
    tile_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    tile_taken = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    schedule = (tile_ids, tile_ready, tile_taken, tile_counter)
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    products_done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    qdo_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    qdo_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    # A staged dQ tile's barrier per stage, chunk and warpgroup: at d256 the consumers run up to a step ahead
    # of the reducer (a barrier of their own, its phases would alias).
    CHUNKS: gl.constexpr = HEAD_DIM // 2 // DQ_CHUNK
    dq_full = gl.allocate_shared_memory(gl.int64, [STAGES * CHUNKS * 2, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    mbarrier.init(kv_free, count=2)
    mbarrier.init(p_ready, count=2)
    mbarrier.init(ds_ready, count=2)
    mbarrier.init(products_done, count=2)
    for s in gl.static_range(STAGES):
        mbarrier.init(qdo_ready.index(s), count=2)  # the q and dO tiles' bytes, the LSE and delta stored
        # Freed by both consumers, or at d256 by the reducer once dQ's staging there has been read.
        mbarrier.init(qdo_free.index(s), count=1 if BY_COLUMNS else 2)
    for half in gl.static_range(2):
        mbarrier.init(dq_empty.index(half), count=1)
        mbarrier.init(tile_ready.index(half), count=1)
        mbarrier.init(tile_taken.index(half), count=3)  # both consumers and the reducer
    for i in gl.static_range(STAGES * CHUNKS * 2):
        mbarrier.init(dq_full.index(i), count=1)
    gl.warp_specialize([
        (_bwd_partition, (q_bufs, do_bufs, k_buf, v_buf, lse_bufs, delta_bufs, ds_bufs, staging, kv_ready,
                          kv_free, qdo_ready, qdo_free, p_ready, ds_ready, products_done, dq_full, dq_empty, dk_ptr,
                          dv_ptr, schedule, n_tiles, seqlen_q, seqlen_k, heads_kv, group, heads_together, qk_scale,
                          sm_scale, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh, 0,
                          HEAD_DIM, KEYS, DQ_CHUNK, STAGES, CAUSAL, PERSISTENT)),
        (_bwd_partition, (q_bufs, do_bufs, k_buf, v_buf, lse_bufs, delta_bufs, ds_bufs, staging, kv_ready,
                          kv_free, qdo_ready, qdo_free, p_ready, ds_ready, products_done, dq_full, dq_empty, dk_ptr,
                          dv_ptr, schedule, n_tiles, seqlen_q, seqlen_k, heads_kv, group, heads_together, qk_scale,
                          sm_scale, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh, 1,
                          HEAD_DIM, KEYS, DQ_CHUNK, STAGES, CAUSAL, PERSISTENT)),
        (_bwd_load_partition, (q_desc, do_desc, k_desc, v_desc, q_bufs, do_bufs, k_buf, v_buf, lse_bufs, delta_bufs,
                               kv_ready, kv_free, qdo_ready, qdo_free, lse_ptr, delta_ptr, schedule, n_tiles,
                               seqlen_q, seqlen_k, heads_kv, group, heads_together, stride_lb, stride_lh, HEAD_DIM,
                               KEYS, STAGES, CAUSAL, PERSISTENT)),
        (_bwd_reduce_partition, (dq_desc, staging, dq_full, dq_empty, qdo_free, schedule, n_tiles, seqlen_q,
                                 seqlen_k, heads_kv, group, heads_together, HEAD_DIM, KEYS, DQ_CHUNK, STAGES,
                                 CAUSAL, PERSISTENT)),
    ], [4, 1, 1], [240, 24, 24])


def supports_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, causal: bool,
                      window: int | None, packed: bool) -> bool:
    """Whether backward_ws runs the problem: the forward's conditions (head dims 64, 128 and 256)."""
    return q.shape[-1] in BWD_HEAD_DIMS and _serves((q, k, v, grad_out), causal, window, packed)


def backward_ws(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, lse: torch.Tensor,
                delta: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, causal: bool,
                qk_scale_log2: float, sm_scale: float, persistent: bool = True) -> None:
    """dQ, dK and dV into dq, dk and dv (laid out as q, k and v) in one pass, from the forward's natural-log LSE
    and delta = rowsum(dO * O) ([B, Hq, Sq] fp32 each); the scores scaled as in forward_ws, sm_scale the
    softmax scale itself. dQ is summed over the key blocks in fp32 (TMA reductions into a zeroed buffer, then
    cast): its bits may differ run to run. `persistent`: a CTA an SM walks tiles, loading the next tile's K and
    V while it stores the last one's dK and dV (H100, 2 x 8k, 11 shuffled rounds: 1.029x a CTA a tile at d128,
    1.010x at d64, 0.998x at d256); non-causal tiles are all alike and go in turn, causal walks shorten along a
    head (handed out in turn they left SMs idle: 0.48-0.61x), so each CTA takes the next tile no CTA has
    started, longest first, from a counter (at CAUSAL_PERSISTENT_HEAD_DIMS; a CTA a tile elsewhere). Check
    `supports_backward` first."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    keys, dq_chunk = bwd_key_block(D), bwd_dq_chunk(D)
    n_tiles = cdiv(Sk, keys) * B * Hkv
    if Sq == 0:  # no query: no gradient
        dk.zero_()
        dv.zero_()
        return
    # dQ's fp32 sums and, past them, the causal persistent grid's tile counter: one zeroed buffer, one memset.
    zeroed = torch.zeros(q.numel() + 1, device=q.device, dtype=torch.float32)
    dq_acc, tile_counter = zeroed[:-1].view(q.shape), zeroed[-1:].view(torch.int32)
    if n_tiles > 0:
        bind_context(q.device)
        persistent = persistent and (not causal or D in CAUSAL_PERSISTENT_HEAD_DIMS)
        programs = persistent_programs(q.device, n_tiles) if persistent else n_tiles
        _attention_bwd_ws_kernel[(programs,)](
            _descriptor(q, HALF_M.value, D), _descriptor(k, keys, D),
            _descriptor(v, keys, D), _descriptor(grad_out, HALF_M.value, D),
            _descriptor(dq_acc, HALF_M.value, dq_chunk), lse, delta, dk, dv, tile_counter, n_tiles, Sq, Sk, Hkv,
            Hq // Hkv,
            heads_together(causal, 2 * Sq * D * q.element_size() * Hq // Hkv, FUSED_BWD_SHARED_BYTES),
            qk_scale_log2, sm_scale, lse.stride(0), lse.stride(1), *dk.stride()[:3], *dv.stride()[:3],
            HEAD_DIM=D, KEYS=keys, DQ_CHUNK=dq_chunk, STAGES=BWD_STAGES, CAUSAL=causal, PERSISTENT=persistent,
            num_warps=4,
        )
    dq.copy_(dq_acc)
