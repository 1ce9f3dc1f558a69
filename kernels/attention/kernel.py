"""attention: FlashAttention-2 style forward and backward in Triton, their launchers and the autograd Function.

Layouts are flash-attn's: q [B, Sq, Hq, Dqk], k [B, Sk, Hkv, Dqk], v [B, Sk, Hkv, Dv], out [B, Sq, Hq, Dv];
packed (varlen) problems drop B: q [total_q, Hq, Dqk] with `cu_seqlens_q` [batch + 1] (int32, on the
device) marking where each sequence starts. One kernel serves both: VARLEN reads a sequence's start
and length from cu_seqlens inside the kernel (never on the host, so a step can be captured in a CUDA
graph), and the grid is sized by the caller's max_seqlen: programs past their sequence's end return.

Semantics (as flash-attn):
- GQA/MQA: q head h reads kv head h // (Hq // Hkv); dK/dV of a kv head sum over its q heads.
- causal is aligned bottom-right: query i of a sequence (Sq queries, Sk keys) sees key j iff
  j <= i + Sk - Sq. With Sq > Sk the first Sq - Sk queries see nothing: their output is 0 and their
  log-sum-exp +inf (so that the backward gives them zero gradients).
- window W (causal only): query i also needs j >= i + Sk - Sq - W, i.e. it sees the W keys left of
  its diagonal and the diagonal key: flash-attn's window_size=(W, 0).
- softmax_scale defaults to 1/sqrt(Dqk); the LSE returned is natural-log, fp32, [B, Hq, Sq]
  ([Hq, total_q] when packed).

Kernels:
- `_fwd_kernel`: one program per (query block, batch x q head): online softmax in base 2 (log2(e)
  folded into the scale, so each score costs one exp2), fp32 accumulators, p cast to the input dtype
  for the P @ V product.
- `_bwd_preprocess_kernel`: delta = rowsum(dO * O), fp32, laid out as the LSE.
- `_bwd_dkdv_kernel`: one program per (key block, batch x kv head); dK and dV stay in registers
  while it walks the query blocks of every q head of its group, so GQA needs no reduction pass.
- `_bwd_dq_kernel`: one program per (query block, batch x q head) walks the key blocks. By default dQ
  gets this separate pass instead of atomic adds from the dK/dV pass: it recomputes P and dP (7 block
  matmuls per step instead of 5), but needs no fp32 dQ scratch to zero and convert, and the result is
  deterministic, bit for bit, run to run. The dK/dV buckets' DQ_ATOMIC knob takes the other road: the
  dK/dV pass adds each key block's dS K into a zeroed fp32 dQ (relaxed atomic adds, or with TMA whole
  tiles by TMA reductions, as FlashAttention-3 does), and this pass does not run. The order of those
  adds varies run to run, and so do dQ's last bits: `deterministic=True` keeps the separate pass.
  On Hopper the dK/dV buckets' WS knob replaces both passes with hopper_ws's fused backward (FlashAttention-3's
  schedule, dQ by TMA reductions: not deterministic either), and the forward's and dQ's WS theirs.
Every loop over blocks is split in three: masked blocks left of the fully visible ones (window
edge), the fully visible ones without any mask arithmetic, and masked blocks right of them (causal
diagonal, sequence end). Head dims that are no power of two (MLA's 192) run padded to the next one
with masked loads.

Each pass streams tiles of one side (the forward and dQ key blocks of k and v, dK/dV query blocks of q
and dO) by pointers or, with the tuned table's TMA knob, through tensor descriptors of the tensors'
[rows, heads x head dim] views (`_tma_view`: a tile is rows x one head's columns). TMA needs no
address registers: compiled for sm_90a by Triton 3.6 as the launches specialize (tests/hopper_compile.py)
the d128 forward takes 218 registers by pointers and 150 with TMA, neither spilling, and the H100 timed
it a wash there; at d256, where the pointer passes spill 296-532 bytes, TMA cuts that to 0-112 and the
searches chose it for the forward and dQ (docs/performance.md, "The attention table tuned on the H100").
A descriptor knows only the tensor's bounds: rows past a sequence's end are the next sequence's, which
the masks zero (forward, dQ: scores of keys past the end; dK/dV: probabilities of queries past it).
Tensors without such a view (MLA's padded head dim, heads outside the rows) stay on pointers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.attention import hopper_ws
from kernels.attention.tuning import AttentionConfig, config_for
from kernels.common.device import cdiv, interpreter_mode, next_power_of_2
from kernels.common.fp8 import AMAX_EPS, FORMAT_ARGS, FP8_MAX, to_fp8_range
from kernels.common.launch import fast_launch
from kernels.common.tma import bind_context

LOG2E = math.log2(math.e)
# FP8 forward: P (in [0, 1]) times 2^P_SCALE_LOG2 before its cast to E4M3 (max 448), so that values down to
# 2^-14 stay normal numbers of the format instead of flushing to its subnormals below 2^-6. The factor
# goes into the exponent (no multiply) and, common to P @ V and the row sums, cancels in the output; only
# the log-sum-exp takes it out again.
P_SCALE_LOG2 = tl.constexpr(8.0)
# The FP8 forward's v (quantize_per_head, dense and sequence-major) holds each 32-key block's keys in the order of
# wgmma's E4M3 register operand (hopper_ws.operand_key_order): P then goes from the scores' accumulator into that
# operand without crossing threads (64 shuffles a thread and key block in the warp-specialized forward otherwise).
KEY_ORDER_BLOCK = tl.constexpr(32)
# Rows per program of the delta preprocess (a memory-bound row reduction).
PREPROCESS_BLOCK_M = 64
# Rows per program of the FP8 forward's quantization of q, k and v (memory-bound, one head per program).
QUANTIZE_ROWS = 64


@triton.jit
def _seq_bounds(cu_seqlens, b, seqlen, VARLEN: tl.constexpr):
    """(first row, length) of sequence b: from cu_seqlens when packed, else (0, the padded length)."""
    if VARLEN:
        start = tl.load(cu_seqlens + b)
        length = tl.load(cu_seqlens + b + 1) - start
    else:
        start = 0
        length = seqlen
    return start, length


@triton.jit
def _view_row0(start, b, seqlen, VARLEN: tl.constexpr):
    """Where sequence b starts among the rows of a [rows, heads x head dim] view (`_tma_view`): at its
    cu_seqlens start when packed, else b whole sequences in."""
    return start if VARLEN else b * seqlen


@triton.jit
def _query_block(CAUSAL: tl.constexpr):
    """This program's query block. Causal query blocks get more work the later they are, so they run last
    first: the grid's tail is then the lightest blocks, not the heaviest (programs of one head still run
    side by side, sharing its K/V in L2)."""
    pid = tl.program_id(0)
    if CAUSAL:
        pid = tl.num_programs(0) - 1 - pid
    return pid


@triton.jit
def _visible_range(first, last, len_other, diag, window, BLOCK: tl.constexpr, CAUSAL: tl.constexpr,
                   WINDOW: tl.constexpr, ROWS_ARE_QUERIES: tl.constexpr):
    """Blocks of the other side (keys for a query block, queries for a key block) that rows first..last
    can see, as [lo, full_lo) masked, [full_lo, full_hi) fully visible (no mask), [full_hi, hi) masked.

    With queries i and keys j, i sees j iff j <= i + diag (causal) and j >= i + diag - window (window; the
    API allows a window only with causal, so WINDOW implies CAUSAL here).
    lo and the full bounds are multiples of BLOCK; hi is exclusive and may cut a block (masks handle it).
    Numerators are clamped at 0 before dividing: Triton divides negatives toward zero, Python (the
    interpreter) toward minus infinity.
    """
    lo = 0
    hi = len_other
    full_lo = 0
    full_hi = (len_other // BLOCK) * BLOCK
    if ROWS_ARE_QUERIES:  # the others are keys j
        if CAUSAL:
            hi = tl.minimum(len_other, last + 1 + diag)
            full_hi = tl.minimum(full_hi, (tl.maximum(first + 1 + diag, 0) // BLOCK) * BLOCK)
        if WINDOW:
            lo = (tl.maximum(first + diag - window, 0) // BLOCK) * BLOCK
            full_lo = tl.cdiv(tl.maximum(last + diag - window, 0), BLOCK) * BLOCK
    else:  # the others are queries i
        if CAUSAL:
            lo = (tl.maximum(first - diag, 0) // BLOCK) * BLOCK
            full_lo = tl.cdiv(tl.maximum(last - diag, 0), BLOCK) * BLOCK
        if WINDOW:
            hi = tl.minimum(len_other, last - diag + window + 1)
            full_hi = tl.minimum(full_hi, (tl.maximum(first - diag + window + 1, 0) // BLOCK) * BLOCK)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def _visible(i, j, seqlen_q, seqlen_k, diag, window, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """Mask of the (query i, key j) pairs that exist and that the causal/window rules let through; i and j
    are index tensors that broadcast to the tile ([M, 1] and [1, N], or transposed for the dK/dV pass)."""
    ok = (i < seqlen_q) & (j < seqlen_k)
    if CAUSAL:
        ok = ok & (j <= i + diag)
    if WINDOW:
        ok = ok & (j >= i + diag - window)
    return ok


@triton.jit
def _load_tile(ptrs, rows_ok, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASK_ROWS: tl.constexpr):
    """A [rows, BLOCK_D] tile; rows past the end (MASK_ROWS: where rows_ok is false) and the padding columns
    of a head dim that is no power of two read 0. Power-of-two head dims get no column mask: a mask that
    varies along the contiguous dim stops the loads from being vectorized, and so from being pipelined as
    asynchronous copies."""
    if BLOCK_D != HEAD_DIM:
        if MASK_ROWS:
            tile = tl.load(ptrs, mask=rows_ok[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)
        else:
            tile = tl.load(ptrs, mask=(offs_d < HEAD_DIM)[None, :], other=0.0)
    elif MASK_ROWS:
        tile = tl.load(ptrs, mask=rows_ok[:, None], other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@triton.jit
def _store_tile(ptrs, tile, rows_ok, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Store a [rows, BLOCK_D] tile's existing rows and real columns (see _load_tile)."""
    if BLOCK_D != HEAD_DIM:
        tl.store(ptrs, tile.to(ptrs.dtype.element_ty), mask=rows_ok[:, None] & (offs_d < HEAD_DIM)[None, :])
    else:
        tl.store(ptrs, tile.to(ptrs.dtype.element_ty), mask=rows_ok[:, None])


@triton.jit
def _rows(src, row0, col, stride_rows, rows_ok, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
          MASK_ROWS: tl.constexpr, TMA: tl.constexpr):
    """The [rows, BLOCK_D] tile that starts row0 rows into `src`: through a tensor descriptor (TMA: `src` a
    [rows, heads x head dim] descriptor, the head's columns from `col`; rows past the tensor's end read 0,
    rows past a sequence's end read the next sequence's, which every caller masks or never stores), or by
    pointers (`src` the tile's pointers at row 0, `_load_tile`)."""
    if TMA:
        tile = src.load([row0, col])
    else:
        tile = _load_tile(src + row0 * stride_rows, rows_ok, offs_d, HEAD_DIM, BLOCK_D, MASK_ROWS)
    return tile


def key_position(key: int) -> int:
    """Where key `key` (of a 32-key block) lies in the FP8 forward's v: its position in wgmma's E4M3 register
    operand, whose thread holds four adjacent keys of every 16 where the scores' accumulator held two of every 8
    (a bit permutation of the key: bits 3, 2, 1 to 1, 3, 2)."""
    return (key & 0b10001) | ((key & 0b1000) >> 2) | ((key & 0b0110) << 1)


@triton.jit
def _key_position(key):
    """key_position, in a kernel."""
    return (key & 0b10001) | ((key & 0b1000) >> 2) | ((key & 0b0110) << 1)


@triton.jit
def _fwd_blocks(acc, l_i, m_i, q, k_src, v_src, k_row0, v_row0, k_col, v_col, stride_kn, stride_vn, offs_m, offs_n,
                offs_dqk, offs_dv, lo, hi, seqlen_q, seqlen_k, diag, window, qk_scale,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, BLOCK_N: tl.constexpr,
                HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
                FP8: tl.constexpr, FP8_MAX: tl.constexpr, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr,
                EMULATE: tl.constexpr, TMA: tl.constexpr, KEY_ORDER: tl.constexpr):
    """The online softmax over key blocks lo..hi: running max m_i (base 2), running sum l_i, acc += P @ V.
    k and v come through `_rows` (TMA: descriptors, the block's rows from k_row0 + n0 and v_row0 + n0, the
    kv head's columns from k_col and v_col; else pointers, both row0 = 0); FP8's v with TMA is
    sequence-major: its [head dim, keys] tile at row v_col, column v_row0 + n0, transposed. FP8: P and its
    row sums carry the factor 2^P_SCALE_LOG2 (P up to 256, fp8 for the P @ V product). KEY_ORDER (FP8, dense):
    v holds each 32-key block's keys at key_position (n0 is a multiple of 32): P is relabelled to match
    (hopper_ws.operand_key_order), and v's rows are read to the end of the last 32-key block, zeros past the keys."""
    p_shift: tl.constexpr = P_SCALE_LOG2 if FP8 else 0.0
    v_end = tl.cdiv(seqlen_k, KEY_ORDER_BLOCK) * KEY_ORDER_BLOCK if KEY_ORDER else seqlen_k
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + offs_n
        key_ok = cols < seqlen_k
        k = _rows(k_src, k_row0 + n0, k_col, stride_kn, key_ok, offs_dqk, HEAD_DIM_QK, BLOCK_DQK, MASKED, TMA)
        if TMA and FP8:
            v = tl.trans(v_src.load([v_col, v_row0 + n0]))
        else:
            v = _rows(v_src, v_row0 + n0, v_col, stride_vn, cols < v_end, offs_dv, HEAD_DIM_V, BLOCK_DV, MASKED, TMA)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if MASKED:
            visible = _visible(offs_m[:, None], cols[None, :], seqlen_q, seqlen_k, diag, window, CAUSAL, WINDOW)
            s = tl.where(visible, s, float("-inf"))
        # m_i starts finite (-1e30, not -inf), so a row that sees none of this block's keys gets
        # alpha = 1 and p = 0 instead of exp2(-inf - -inf) = NaN.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - (m_new - p_shift)[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        p_operand = p
        if FP8:  # noqa: SIM102 (compile-time flags)
            if EMULATE:  # the interpreter's fp8 cast needs values on the grid; P <= 256 < 448: no clamp on a GPU
                p_operand = to_fp8_range(p, FP8_MAX, MANTISSA, MIN_EXP, EMULATE)
        if KEY_ORDER:
            p_operand = hopper_ws.operand_key_order(p_operand)
        acc = tl.dot(p_operand.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@fast_launch
@triton.jit
def _fwd_kernel(
    Q, K, V, O, LSE, cu_seqlens_q, cu_seqlens_k, Q_SCALE, K_SCALE, V_SCALE, Q_DESC, K_DESC, V_DESC,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ob, stride_os, stride_oh, stride_od,
    stride_lb, stride_lh,
    heads_q, group, seqlen_q_dense, seqlen_k_dense, window, qk_scale,
    HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    FP8: tl.constexpr, FP8_MAX: tl.constexpr, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr, EMULATE: tl.constexpr,
    TMA: tl.constexpr,
):
    """FP8: q, k, v hold fp8 values whose scales (fp32, one per sequence and head: [B, Hq] for q, [B, Hkv]
    for k and v) Q_SCALE, K_SCALE and V_SCALE point at; the scores' scale folds q's and k's in.
    TMA: q, k and v are read through Q_DESC, K_DESC and V_DESC, descriptors of their [rows, heads x head
    dim] views (`_tma_view`; rows = batch x sequence, or the packed rows); else those are unused."""
    pid_m = _query_block(CAUSAL)
    pid_bh = tl.program_id(1)
    b = pid_bh // heads_q
    h = pid_bh % heads_q
    q_start, seqlen_q = _seq_bounds(cu_seqlens_q, b, seqlen_q_dense, VARLEN)
    k_start, seqlen_k = _seq_bounds(cu_seqlens_k, b, seqlen_k_dense, VARLEN)
    m0 = pid_m * BLOCK_M
    if m0 >= seqlen_q:  # past this sequence's end (packed sequences shorter than max_seqlen_q)
        return
    diag = seqlen_k - seqlen_q
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_dqk = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < seqlen_q
    # Row offsets in int64: row * stride passes 2**31 elements on long packed batches.
    q_rows = (q_start + offs_m).to(tl.int64)
    k_rows = (k_start + offs_n).to(tl.int64)
    bq = b.to(tl.int64)
    kvh = h // group

    k_col = kvh * HEAD_DIM_QK
    v_col = kvh * HEAD_DIM_V
    if TMA:
        q = Q_DESC.load([_view_row0(q_start, b, seqlen_q_dense, VARLEN) + m0, h * HEAD_DIM_QK])
        k_row0 = _view_row0(k_start, b, seqlen_k_dense, VARLEN)
        v_row0 = k_row0
        if FP8:  # v sequence-major: a band of head dim rows per (batch and) kv head, keys along the columns
            v_row0 = k_start
            v_col = (_view_row0(0, b, heads_q // group, VARLEN) + kvh) * HEAD_DIM_V
        k_src = K_DESC
        v_src = V_DESC
    else:
        q_ptrs = Q + bq * stride_qb + h * stride_qh + q_rows[:, None] * stride_qs + offs_dqk[None, :] * stride_qd
        q = _load_tile(q_ptrs, row_ok, offs_dqk, HEAD_DIM_QK, BLOCK_DQK, True)
        k_src = K + bq * stride_kb + kvh * stride_kh + k_rows[:, None] * stride_ks + offs_dqk[None, :] * stride_kd
        v_src = V + bq * stride_vb + kvh * stride_vh + k_rows[:, None] * stride_vs + offs_dv[None, :] * stride_vd
        k_row0 = 0
        v_row0 = 0

    key_order: tl.constexpr = FP8 and not VARLEN  # v's keys in the E4M3 operand's order (quantize_per_head)
    out_scale = 1.0
    if FP8:
        kv_index = b * (heads_q // group) + kvh
        qk_scale = qk_scale * tl.load(Q_SCALE + b * heads_q + h) * tl.load(K_SCALE + kv_index)
        out_scale = tl.load(V_SCALE + kv_index)

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    lo, full_lo, full_hi, hi = _visible_range(m0, m0 + BLOCK_M - 1, seqlen_k, diag, window, BLOCK_N, CAUSAL, WINDOW,
                                              True)
    acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, k_src, v_src, k_row0, v_row0, k_col, v_col, stride_ks, stride_vs,
                                offs_m, offs_n, offs_dqk, offs_dv, lo, full_lo, seqlen_q, seqlen_k, diag, window,
                                qk_scale,
                                True, CAUSAL, WINDOW, BLOCK_N,
                                HEAD_DIM_QK, HEAD_DIM_V, BLOCK_DQK, BLOCK_DV, FP8, FP8_MAX, MANTISSA, MIN_EXP, EMULATE,
                                TMA, key_order)
    acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, k_src, v_src, k_row0, v_row0, k_col, v_col, stride_ks, stride_vs,
                                offs_m, offs_n, offs_dqk, offs_dv, full_lo, full_hi, seqlen_q, seqlen_k, diag, window,
                                qk_scale,
                                False, CAUSAL, WINDOW, BLOCK_N,
                                HEAD_DIM_QK, HEAD_DIM_V, BLOCK_DQK, BLOCK_DV, FP8, FP8_MAX, MANTISSA, MIN_EXP, EMULATE,
                                TMA, key_order)
    acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, k_src, v_src, k_row0, v_row0, k_col, v_col, stride_ks, stride_vs,
                                offs_m, offs_n, offs_dqk, offs_dv, full_hi, hi, seqlen_q, seqlen_k, diag, window,
                                qk_scale,
                                True, CAUSAL, WINDOW, BLOCK_N,
                                HEAD_DIM_QK, HEAD_DIM_V, BLOCK_DQK, BLOCK_DV, FP8, FP8_MAX, MANTISSA, MIN_EXP, EMULATE,
                                TMA, key_order)

    # A row that saw no key (causal with Sq > Sk) has l_i = 0: output 0, LSE +inf.
    seen = l_i > 0.0
    out = acc * (out_scale / tl.where(seen, l_i, 1.0))[:, None]
    p_shift: tl.constexpr = P_SCALE_LOG2 if FP8 else 0.0
    log2_sum = tl.math.log2(tl.where(seen, l_i, 1.0)) - p_shift
    lse = tl.where(seen, (m_i + log2_sum) / 1.4426950408889634, float("inf"))
    o_ptrs = O + bq * stride_ob + h * stride_oh + q_rows[:, None] * stride_os + offs_dv[None, :] * stride_od
    _store_tile(o_ptrs, out, row_ok, offs_dv, HEAD_DIM_V, BLOCK_DV)
    tl.store(LSE + bq * stride_lb + h * stride_lh + q_rows, lse, mask=row_ok)


@fast_launch
@triton.jit
def _bwd_preprocess_kernel(
    O, DO, DELTA, cu_seqlens_q,
    stride_ob, stride_os, stride_oh, stride_od,
    stride_gb, stride_gs, stride_gh, stride_gd,
    stride_lb, stride_lh,
    heads_q, seqlen_q_dense,
    HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, VARLEN: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // heads_q
    h = pid_bh % heads_q
    q_start, seqlen_q = _seq_bounds(cu_seqlens_q, b, seqlen_q_dense, VARLEN)
    m0 = pid_m * BLOCK_M
    if m0 >= seqlen_q:
        return
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_DV)
    rows = (q_start + offs_m).to(tl.int64)
    bq = b.to(tl.int64)
    row_ok = offs_m < seqlen_q
    o = _load_tile(O + bq * stride_ob + h * stride_oh + rows[:, None] * stride_os + offs_d[None, :] * stride_od,
                   row_ok, offs_d, HEAD_DIM_V, BLOCK_DV, True)
    do = _load_tile(DO + bq * stride_gb + h * stride_gh + rows[:, None] * stride_gs + offs_d[None, :] * stride_gd,
                    row_ok, offs_d, HEAD_DIM_V, BLOCK_DV, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + bq * stride_lb + h * stride_lh + rows, delta, mask=row_ok)


@triton.jit
def _bwd_kv_blocks(dk, dv, k, v, q_src, do_src, q_row0, q_col, do_col, lse_ptrs, delta_ptrs, stride_qm, stride_dom,
                   dq_dst, stride_dqm, sm_scale,
                   offs_m, offs_n, offs_dqk, offs_dv, lo, hi, seqlen_q, seqlen_k, diag, window, qk_scale,
                   MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, BLOCK_M: tl.constexpr,
                   HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DQK: tl.constexpr,
                   BLOCK_DV: tl.constexpr, TMA: tl.constexpr, DQ_ATOMIC: tl.constexpr, DQ_REDUCE: tl.constexpr):
    """dV += P^T dO and dK += dS^T Q over query blocks lo..hi, computed transposed ([keys, queries]) so
    that the key block's rows stay the accumulators' rows. q and dO come through `_rows` (as k and v in
    `_fwd_blocks`: rows from q_row0 + m0, the q head's columns from q_col and do_col).
    DQ_ATOMIC: also dQ += dS K * sm_scale, the key block's share, added atomically into fp32 (the key
    rows past the sequence's end are 0 and add nothing): by TMA reductions of whole tiles through the
    descriptor dq_dst at (q_row0 + m0, q_col) (DQ_REDUCE; the rows past a sequence's end add exact
    zeros to the next one's), else by atomic adds at the pointers dq_dst."""
    for m0 in range(lo, hi, BLOCK_M):
        rows = m0 + offs_m
        row_ok = rows < seqlen_q
        q = _rows(q_src, q_row0 + m0, q_col, stride_qm, row_ok, offs_dqk, HEAD_DIM_QK, BLOCK_DQK, MASKED, TMA)
        do = _rows(do_src, q_row0 + m0, do_col, stride_dom, row_ok, offs_dv, HEAD_DIM_V, BLOCK_DV, MASKED, TMA)
        if MASKED:
            lse = tl.load(lse_ptrs + m0, mask=row_ok, other=0.0)
            delta = tl.load(delta_ptrs + m0, mask=row_ok, other=0.0)
        else:
            lse = tl.load(lse_ptrs + m0)
            delta = tl.load(delta_ptrs + m0)
        # P^T = exp2(K Q^T * scale * log2(e) - LSE * log2(e)): the forward's probabilities, recomputed.
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - (lse * 1.4426950408889634)[None, :])
        if MASKED:
            p_t = tl.where(_visible(rows[None, :], offs_n[:, None], seqlen_q, seqlen_k, diag, window, CAUSAL, WINDOW),
                           p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
        dk = tl.dot(ds_t, q, dk)
        if DQ_ATOMIC:
            dq = tl.dot(tl.trans(ds_t), k) * sm_scale
            if DQ_REDUCE:
                dq_dst.atomic_add([q_row0 + m0, q_col], dq)
            elif MASKED or BLOCK_DQK != HEAD_DIM_QK:
                dq_mask = row_ok[:, None] & (offs_dqk < HEAD_DIM_QK)[None, :]
                tl.atomic_add(dq_dst + m0 * stride_dqm, dq, mask=dq_mask, sem="relaxed")
            else:
                tl.atomic_add(dq_dst + m0 * stride_dqm, dq, sem="relaxed")
    return dk, dv


@fast_launch
@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ_ACC, cu_seqlens_q, cu_seqlens_k, Q_DESC, DO_DESC, DQ_DESC,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_gb, stride_gs, stride_gh, stride_gd,
    stride_dkb, stride_dks, stride_dkh, stride_dkd,
    stride_dvb, stride_dvs, stride_dvh, stride_dvd,
    stride_aqb, stride_aqs, stride_aqh, stride_aqd,
    stride_lb, stride_lh,
    heads_kv, group, seqlen_q_dense, seqlen_k_dense, window, qk_scale, sm_scale,
    HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, TMA: tl.constexpr, DQ_ATOMIC: tl.constexpr,
    DQ_REDUCE: tl.constexpr,
):
    """TMA: the query blocks' q and dO tiles are read through Q_DESC and DO_DESC (see `_fwd_kernel`).
    DQ_ATOMIC: dQ too, added into DQ_ACC (fp32, zeroed, laid out as q; strides stride_aq*), so that no
    dQ pass has to recompute P and dP; DQ_REDUCE (with TMA, on a GPU: the interpreter has no TMA
    reductions): through DQ_DESC, its [rows, heads x head dim] descriptor, instead of pointers."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // heads_kv
    kvh = pid_bh % heads_kv
    q_start, seqlen_q = _seq_bounds(cu_seqlens_q, b, seqlen_q_dense, VARLEN)
    k_start, seqlen_k = _seq_bounds(cu_seqlens_k, b, seqlen_k_dense, VARLEN)
    n0 = pid_n * BLOCK_N
    if n0 >= seqlen_k:
        return
    diag = seqlen_k - seqlen_q
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_dqk = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    key_ok = offs_n < seqlen_k
    k_rows = (k_start + offs_n).to(tl.int64)
    q_rows = (q_start + offs_m).to(tl.int64)
    bq = b.to(tl.int64)

    k = _load_tile(K + bq * stride_kb + kvh * stride_kh + k_rows[:, None] * stride_ks + offs_dqk[None, :] * stride_kd,
                   key_ok, offs_dqk, HEAD_DIM_QK, BLOCK_DQK, True)
    v = _load_tile(V + bq * stride_vb + kvh * stride_vh + k_rows[:, None] * stride_vs + offs_dv[None, :] * stride_vd,
                   key_ok, offs_dv, HEAD_DIM_V, BLOCK_DV, True)
    dk = tl.zeros([BLOCK_N, BLOCK_DQK], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    lo, full_lo, full_hi, hi = _visible_range(n0, n0 + BLOCK_N - 1, seqlen_q, diag, window, BLOCK_M, CAUSAL, WINDOW,
                                              False)
    # A key block cut by the sequence's end runs its padding keys (k = v = 0) unmasked through the fully
    # visible query blocks: their dK/dV rows are garbage, but rows are independent and those are never stored.
    q_row0 = 0
    if TMA:
        q_row0 = _view_row0(q_start, b, seqlen_q_dense, VARLEN)
    for h in range(kvh * group, kvh * group + group):  # the q heads that read this kv head
        if TMA:
            q_src = Q_DESC
            do_src = DO_DESC
        else:
            q_src = Q + bq * stride_qb + h * stride_qh + q_rows[:, None] * stride_qs + offs_dqk[None, :] * stride_qd
            do_src = DO + bq * stride_gb + h * stride_gh + q_rows[:, None] * stride_gs + offs_dv[None, :] * stride_gd
        lse_ptrs = LSE + bq * stride_lb + h * stride_lh + q_rows
        delta_ptrs = DELTA + bq * stride_lb + h * stride_lh + q_rows
        if DQ_REDUCE:
            dq_dst = DQ_DESC
        else:
            dq_dst = (DQ_ACC + bq * stride_aqb + h * stride_aqh + q_rows[:, None] * stride_aqs
                      + offs_dqk[None, :] * stride_aqd)
        dk, dv = _bwd_kv_blocks(dk, dv, k, v, q_src, do_src, q_row0, h * HEAD_DIM_QK, h * HEAD_DIM_V, lse_ptrs,
                                delta_ptrs, stride_qs, stride_gs, dq_dst, stride_aqs, sm_scale,
                                offs_m, offs_n, offs_dqk, offs_dv, lo, full_lo, seqlen_q, seqlen_k, diag, window,
                                qk_scale, True, CAUSAL, WINDOW, BLOCK_M, HEAD_DIM_QK, HEAD_DIM_V, BLOCK_DQK, BLOCK_DV,
                                TMA, DQ_ATOMIC, DQ_REDUCE)
        dk, dv = _bwd_kv_blocks(dk, dv, k, v, q_src, do_src, q_row0, h * HEAD_DIM_QK, h * HEAD_DIM_V, lse_ptrs,
                                delta_ptrs, stride_qs, stride_gs, dq_dst, stride_aqs, sm_scale,
                                offs_m, offs_n, offs_dqk, offs_dv, full_lo, full_hi, seqlen_q, seqlen_k, diag, window,
                                qk_scale, False, CAUSAL, WINDOW, BLOCK_M, HEAD_DIM_QK, HEAD_DIM_V, BLOCK_DQK, BLOCK_DV,
                                TMA, DQ_ATOMIC, DQ_REDUCE)
        dk, dv = _bwd_kv_blocks(dk, dv, k, v, q_src, do_src, q_row0, h * HEAD_DIM_QK, h * HEAD_DIM_V, lse_ptrs,
                                delta_ptrs, stride_qs, stride_gs, dq_dst, stride_aqs, sm_scale,
                                offs_m, offs_n, offs_dqk, offs_dv, full_hi, hi, seqlen_q, seqlen_k, diag, window,
                                qk_scale, True, CAUSAL, WINDOW, BLOCK_M, HEAD_DIM_QK, HEAD_DIM_V, BLOCK_DQK, BLOCK_DV,
                                TMA, DQ_ATOMIC, DQ_REDUCE)

    _store_tile(DK + bq * stride_dkb + kvh * stride_dkh + k_rows[:, None] * stride_dks + offs_dqk[None, :] * stride_dkd,
                dk * sm_scale, key_ok, offs_dqk, HEAD_DIM_QK, BLOCK_DQK)
    _store_tile(DV + bq * stride_dvb + kvh * stride_dvh + k_rows[:, None] * stride_dvs + offs_dv[None, :] * stride_dvd,
                dv, key_ok, offs_dv, HEAD_DIM_V, BLOCK_DV)


@triton.jit
def _bwd_q_blocks(dq, q, do, lse, delta, k_src, v_src, k_row0, k_col, v_col, stride_kn, stride_vn, offs_m, offs_n,
                  offs_dqk, offs_dv, lo, hi, seqlen_q, seqlen_k, diag, window, qk_scale,
                  MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, BLOCK_N: tl.constexpr,
                  HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DQK: tl.constexpr,
                  BLOCK_DV: tl.constexpr, TMA: tl.constexpr):
    """dQ += dS K over key blocks lo..hi (k and v through `_rows`, as in `_fwd_blocks`)."""
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + offs_n
        key_ok = cols < seqlen_k
        k = _rows(k_src, k_row0 + n0, k_col, stride_kn, key_ok, offs_dqk, HEAD_DIM_QK, BLOCK_DQK, MASKED, TMA)
        v = _rows(v_src, k_row0 + n0, v_col, stride_vn, key_ok, offs_dv, HEAD_DIM_V, BLOCK_DV, MASKED, TMA)
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse[:, None])
        if MASKED:
            p = tl.where(_visible(offs_m[:, None], cols[None, :], seqlen_q, seqlen_k, diag, window, CAUSAL, WINDOW),
                         p, 0.0)
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@fast_launch
@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, cu_seqlens_q, cu_seqlens_k, K_DESC, V_DESC,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_gb, stride_gs, stride_gh, stride_gd,
    stride_dqb, stride_dqs, stride_dqh, stride_dqd,
    stride_lb, stride_lh,
    heads_q, group, seqlen_q_dense, seqlen_k_dense, window, qk_scale, sm_scale,
    HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, TMA: tl.constexpr,
):
    """TMA: the key blocks' k and v tiles are read through K_DESC and V_DESC (see `_fwd_kernel`)."""
    pid_m = _query_block(CAUSAL)
    pid_bh = tl.program_id(1)
    b = pid_bh // heads_q
    h = pid_bh % heads_q
    q_start, seqlen_q = _seq_bounds(cu_seqlens_q, b, seqlen_q_dense, VARLEN)
    k_start, seqlen_k = _seq_bounds(cu_seqlens_k, b, seqlen_k_dense, VARLEN)
    m0 = pid_m * BLOCK_M
    if m0 >= seqlen_q:
        return
    diag = seqlen_k - seqlen_q
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_dqk = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < seqlen_q
    q_rows = (q_start + offs_m).to(tl.int64)
    k_rows = (k_start + offs_n).to(tl.int64)
    bq = b.to(tl.int64)
    kvh = h // group

    q = _load_tile(Q + bq * stride_qb + h * stride_qh + q_rows[:, None] * stride_qs + offs_dqk[None, :] * stride_qd,
                   row_ok, offs_dqk, HEAD_DIM_QK, BLOCK_DQK, True)
    do = _load_tile(DO + bq * stride_gb + h * stride_gh + q_rows[:, None] * stride_gs + offs_dv[None, :] * stride_gd,
                    row_ok, offs_dv, HEAD_DIM_V, BLOCK_DV, True)
    # Rows past the end load LSE 0 and delta 0: finite, and their dQ is never stored.
    lse = tl.load(LSE + bq * stride_lb + h * stride_lh + q_rows, mask=row_ok, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + bq * stride_lb + h * stride_lh + q_rows, mask=row_ok, other=0.0)
    if TMA:
        k_src = K_DESC
        v_src = V_DESC
        k_row0 = _view_row0(k_start, b, seqlen_k_dense, VARLEN)
    else:
        k_src = K + bq * stride_kb + kvh * stride_kh + k_rows[:, None] * stride_ks + offs_dqk[None, :] * stride_kd
        v_src = V + bq * stride_vb + kvh * stride_vh + k_rows[:, None] * stride_vs + offs_dv[None, :] * stride_vd
        k_row0 = 0
    k_col = kvh * HEAD_DIM_QK
    v_col = kvh * HEAD_DIM_V

    dq = tl.zeros([BLOCK_M, BLOCK_DQK], dtype=tl.float32)
    # Padding rows of a query block cut by the sequence's end need no mask either: with q = dO = 0 and
    # LSE = delta = 0 their dS is 0, and their dQ rows are never stored.
    lo, full_lo, full_hi, hi = _visible_range(m0, m0 + BLOCK_M - 1, seqlen_k, diag, window, BLOCK_N, CAUSAL, WINDOW,
                                              True)
    dq = _bwd_q_blocks(dq, q, do, lse, delta, k_src, v_src, k_row0, k_col, v_col, stride_ks, stride_vs, offs_m,
                       offs_n, offs_dqk, offs_dv, lo, full_lo, seqlen_q, seqlen_k, diag, window, qk_scale,
                       True, CAUSAL, WINDOW, BLOCK_N, HEAD_DIM_QK, HEAD_DIM_V, BLOCK_DQK, BLOCK_DV, TMA)
    dq = _bwd_q_blocks(dq, q, do, lse, delta, k_src, v_src, k_row0, k_col, v_col, stride_ks, stride_vs, offs_m,
                       offs_n, offs_dqk, offs_dv, full_lo, full_hi, seqlen_q, seqlen_k, diag, window, qk_scale,
                       False, CAUSAL, WINDOW, BLOCK_N, HEAD_DIM_QK, HEAD_DIM_V, BLOCK_DQK, BLOCK_DV, TMA)
    dq = _bwd_q_blocks(dq, q, do, lse, delta, k_src, v_src, k_row0, k_col, v_col, stride_ks, stride_vs, offs_m,
                       offs_n, offs_dqk, offs_dv, full_hi, hi, seqlen_q, seqlen_k, diag, window, qk_scale,
                       True, CAUSAL, WINDOW, BLOCK_N, HEAD_DIM_QK, HEAD_DIM_V, BLOCK_DQK, BLOCK_DV, TMA)
    _store_tile(DQ + bq * stride_dqb + h * stride_dqh + q_rows[:, None] * stride_dqs + offs_dqk[None, :] * stride_dqd,
                dq * sm_scale, row_ok, offs_dqk, HEAD_DIM_QK, BLOCK_DQK)


# --- quantization of q, k and v for the FP8 forward ------------------------------------------------------


@triton.jit
def _row_positions(rows, SEQ, seqlen, VARLEN: tl.constexpr):
    """(sequence, position) of rows: packed, from SEQ (each row's sequence) and the row itself (its offset
    in the packed tensor, whose batch stride is 0); dense, by division of the flattened batch x sequence."""
    if VARLEN:
        return tl.load(SEQ + rows), rows
    return rows // seqlen, rows % seqlen


@triton.jit
def _head_tile(X, SEQ, rows, seqlen, stride_xb, stride_xs, stride_xh, stride_xd, block, h,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, VARLEN: tl.constexpr,
               stride_ob, stride_os, stride_oh, stride_od, KEY_ORDER: tl.constexpr = False):
    """Row block `block`'s [BLOCK_S rows, head dim] tile of head h: x in fp32 (0 past the end), each row's
    sequence b (rows past the end take the last row's), which rows exist, and (offsets, mask) of the same
    tile in an output of the given strides (KEY_ORDER: each row at its key_position within its 32-key block)."""
    r = block * BLOCK_S + tl.arange(0, BLOCK_S)
    ok = r < rows
    b, s = _row_positions(tl.minimum(r, rows - 1), SEQ, seqlen, VARLEN)
    d = tl.arange(0, BLOCK_D)
    mask = ok[:, None] & (d < HEAD_DIM)[None, :]
    b64, s64 = b.to(tl.int64)[:, None], s.to(tl.int64)[:, None]
    x = tl.load(X + b64 * stride_xb + s64 * stride_xs + h * stride_xh + d[None, :] * stride_xd, mask=mask, other=0.0)
    if KEY_ORDER:
        s64 = (s64 // KEY_ORDER_BLOCK) * KEY_ORDER_BLOCK + _key_position(s64 % KEY_ORDER_BLOCK)
    out_offsets = b64 * stride_ob + s64 * stride_os + h * stride_oh + d[None, :] * stride_od
    return x.to(tl.float32), b, ok, (out_offsets, mask)


@fast_launch
@triton.jit
def _head_amax_kernel(
    X, AMAX, SEQ, rows, seqlen, heads, stride_xb, stride_xs, stride_xh, stride_xd,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, VARLEN: tl.constexpr,
):
    """AMAX[b, h] (zeroed) = max |x| over sequence b's rows of head h; grid (row blocks, heads). The max goes
    in as fp32 bits by a relaxed integer atomic (non-negative floats order as their bits; only the next launch
    reads them): one for the block where its rows share a sequence, one per row where they do not."""
    h = tl.program_id(1)
    x, b, ok, _ = _head_tile(X, SEQ, rows, seqlen, stride_xb, stride_xs, stride_xh, stride_xd, tl.program_id(0), h,
                             HEAD_DIM, BLOCK_D, BLOCK_S, VARLEN, 0, 0, 0, 0)  # no output
    row_max = tl.max(tl.abs(x), axis=1).to(tl.int32, bitcast=True)
    amax_bits = AMAX.to(tl.pointer_type(tl.int32))
    first, last = tl.min(b), tl.max(b)  # rows past the end took the last row's sequence
    if first == last:
        tl.atomic_max(amax_bits + first * heads + h, tl.max(row_max), sem="relaxed")
    else:
        tl.atomic_max(amax_bits + b * heads + h, row_max, mask=ok, sem="relaxed")


@fast_launch
@triton.jit
def _head_cast_kernel(
    X, Q, AMAX, SCALE, SEQ, rows, seqlen, batch, heads, stride_xb, stride_xs, stride_xh, stride_xd,
    stride_qb, stride_qs, stride_qh, stride_qd,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, VARLEN: tl.constexpr,
    FP8_MAX: tl.constexpr, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr, EMULATE: tl.constexpr, EPS: tl.constexpr,
    KEY_ORDER: tl.constexpr = False,
):
    """Q = x * FP8_MAX / AMAX[b, h] in fp8, written through Q's strides (sequence-major or not; KEY_ORDER: each
    row at its key_position within its 32-key block); the first row block's programs also write each head's
    scales, SCALE[b, h] = max(AMAX[b, h], EPS) / FP8_MAX (IEEE-rounded), for every sequence b. Tiles go in the
    amax kernel's order reversed, so that the cast's first reads find what the amax pass read last in the L2."""
    block = tl.num_programs(0) - 1 - tl.program_id(0)
    h = tl.num_programs(1) - 1 - tl.program_id(1)
    x, b, _, q_offsets = _head_tile(X, SEQ, rows, seqlen, stride_xb, stride_xs, stride_xh, stride_xd, block, h,
                                    HEAD_DIM, BLOCK_D, BLOCK_S, VARLEN, stride_qb, stride_qs, stride_qh, stride_qd,
                                    KEY_ORDER)
    factor = FP8_MAX / tl.maximum(tl.load(AMAX + b * heads + h), EPS)
    q = to_fp8_range(x * factor[:, None], FP8_MAX, MANTISSA, MIN_EXP, EMULATE)
    offsets, mask = q_offsets
    tl.store(Q + offsets, q.to(Q.dtype.element_ty), mask=mask)
    if block == 0:
        for b0 in range(0, batch, BLOCK_S):
            seqs = b0 + tl.arange(0, BLOCK_S)
            amax = tl.load(AMAX + seqs * heads + h, mask=seqs < batch, other=0.0)
            tl.store(SCALE + seqs * heads + h, tl.div_rn(tl.maximum(amax, EPS), FP8_MAX), mask=seqs < batch)


# --- launchers ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionShape:
    """What the launchers need to know about a validated problem. Packed problems carry their
    cu_seqlens (device tensors, never read here) and the caller's max_seqlen as seqlen_q / seqlen_k."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim_qk: int
    head_dim_v: int
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None

    @property
    def packed(self) -> bool:
        return self.cu_seqlens_q is not None

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    def out_shape(self, rows: int) -> tuple[int, ...]:
        """out's shape: [B, Sq, Hq, Dv], or [total_q, Hq, Dv] packed (rows = total_q)."""
        if self.packed:
            return (rows, self.heads_q, self.head_dim_v)
        return (self.batch, self.seqlen_q, self.heads_q, self.head_dim_v)

    def lse_shape(self, rows: int) -> tuple[int, ...]:
        """The LSE's shape: [B, Hq, Sq], or [Hq, total_q] packed."""
        return (self.heads_q, rows) if self.packed else (self.batch, self.heads_q, self.seqlen_q)


def _strides(t: torch.Tensor, shape: AttentionShape) -> tuple[int, ...]:
    """(batch, sequence, head, dim) strides; a packed tensor has no batch dim: its batch stride is 0,
    each sequence's offset comes from cu_seqlens."""
    return (0, *t.stride()) if shape.packed else tuple(t.stride())


def _lse_strides(lse: torch.Tensor, shape: AttentionShape) -> tuple[int, int]:
    """(batch, head) strides of an LSE-shaped tensor; rows are contiguous."""
    return (0, lse.stride(0)) if shape.packed else (lse.stride(0), lse.stride(1))


def _common(shape: AttentionShape, causal: bool, window: int | None) -> dict[str, object]:
    """Arguments every kernel takes: head dims, their padded widths and the constexpr switches."""
    return {
        "HEAD_DIM_QK": shape.head_dim_qk, "HEAD_DIM_V": shape.head_dim_v,
        "BLOCK_DQK": next_power_of_2(shape.head_dim_qk), "BLOCK_DV": next_power_of_2(shape.head_dim_v),
        "VARLEN": shape.packed, "CAUSAL": causal, "WINDOW": window is not None,
    }


def _cu(shape: AttentionShape, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The cu_seqlens pointers; dense problems pass q (never read: VARLEN is off)."""
    return (shape.cu_seqlens_q, shape.cu_seqlens_k) if shape.packed else (q, q)


def _tma_view(t: torch.Tensor, shape: AttentionShape, head_dim: int, block_rows: int,
              sequence_major: bool = False) -> TensorDescriptor | None:
    """A descriptor of q, k, v, dO or the fp32 dQ as [rows, heads x head dim] (rows: batch x sequence, or the packed
    rows) with a [block_rows, head dim] box, when TMA can read it that way: a power-of-two head dim (no
    padding columns to mask), the head dim contiguous and the heads next to each other, dense batches
    one after the other at the row stride, a 16-byte aligned base and row stride. Else None.

    `sequence_major` (the FP8 forward's dense v as quantize_per_head lays it out): as [batch x heads x
    head dim, sequence], the sequence contiguous, with a [head dim, block_rows] box: one band of head dim
    rows per batch and head. Not packed: a box's innermost start must be 16-byte aligned (Triton's
    interpreter holds descriptors to it), and a packed sequence starts at any key."""
    size = t.element_size()
    if t.numel() == 0 or head_dim & (head_dim - 1) or t.data_ptr() % 16 or (sequence_major and shape.packed):
        return None
    heads, seq_dim = t.shape[-2], 0 if shape.packed else 1
    if sequence_major:  # the whole padded row: quantize_per_head's keys (in their order) and zeros past them
        row_stride = cols = t.stride(-1)
        band = heads * head_dim * row_stride  # one batch's rows
        layout_ok = t.stride(seq_dim) == 1 and t.stride(-2) == head_dim * row_stride
    else:
        row_stride, cols = t.stride(seq_dim), heads * head_dim
        band = t.shape[1] * row_stride
        layout_ok = t.stride(-1) == 1 and t.stride(-2) == head_dim
    stacked = shape.packed or t.shape[0] == 1 or t.stride(0) == band
    box = [head_dim, block_rows] if sequence_major else [block_rows, head_dim]
    if not (layout_ok and stacked and row_stride >= cols and (row_stride * size) % 16 == 0
            and (box[1] * size) % 16 == 0):
        return None
    rows = t.numel() // (t.shape[seq_dim] if sequence_major else cols)
    return TensorDescriptor(t, [rows, cols], [row_stride, 1], box)


def _tma_views(cfg: AttentionConfig, shape: AttentionShape, reads: tuple[tuple[torch.Tensor, bool, int], ...],
               sequence_major_last: bool = False) -> tuple[bool, tuple[object, ...]]:
    """(TMA, the kernel's descriptor arguments) for the tensors a kernel reads by tiles, each given as
    (tensor, whether it has the q/k head dim (else v's), the tile's rows), the last one sequence-major
    if `sequence_major_last`: descriptors when the config asks for TMA and every one of them admits it
    (`_tma_view`), else the tensors themselves (unused). Without TMA no descriptor is built: this runs
    on every launch."""
    tensors = tuple(t for t, _, _ in reads)
    if not cfg.TMA:
        return False, tensors
    views = [_tma_view(t, shape, shape.head_dim_qk if qk else shape.head_dim_v, rows,
                       sequence_major_last and i == len(reads) - 1) for i, (t, qk, rows) in enumerate(reads)]
    if None in views:
        return False, tensors
    bind_context(reads[0][0].device)
    return True, tuple(views)


def _launch(cfg: AttentionConfig) -> dict[str, int]:
    return {"BLOCK_M": cfg.BLOCK_M, "BLOCK_N": cfg.BLOCK_N, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


@dataclass(frozen=True)
class HeadScales:
    """The scales of FP8 q, k and v (`x ~= data * scale`): fp32, contiguous, one per sequence and head,
    q [B, Hq], k and v [B, Hkv]."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


def forward_into(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    shape: AttentionShape, causal: bool, scale: float, window: int | None, scales: HeadScales | None = None,
    config: AttentionConfig | None = None,
) -> None:
    """Write softmax(q k^T * scale) v into out and its natural-log LSE into lse (fp32). With `scales`,
    q, k and v are E4M3 and both products run in FP8 (the `fwd_fp8` buckets of the tuned table). `config`:
    this launch config instead of the tuned table's (benchmarks pin one)."""
    cfg = config or config_for("fwd" if scales is None else "fwd_fp8", shape.head_dim_qk, shape.head_dim_v)
    if cfg.WS and hopper_ws.supported(q, k, v, causal, window, shape.packed, cfg.WS_BLOCK_N, cfg.WS_STAGES):
        hopper_ws.forward_ws(q, k, v, out, lse, causal, scale * LOG2E, cfg.WS_BLOCK_N, cfg.WS_STAGES,
                             lazy=bool(cfg.LAZY), scales=None if scales is None else (scales.q, scales.k, scales.v))
        return
    grid = (cdiv(shape.seqlen_q, cfg.BLOCK_M), shape.batch * shape.heads_q)
    if grid[0] * grid[1] == 0:
        return
    scale_ptrs = (q, q, q) if scales is None else (scales.q, scales.k, scales.v)  # not read without FP8
    tma, views = _tma_views(cfg, shape, ((q, True, cfg.BLOCK_M), (k, True, cfg.BLOCK_N), (v, False, cfg.BLOCK_N)),
                            sequence_major_last=scales is not None)
    _fwd_kernel[grid](
        q, k, v, out, lse, *_cu(shape, q), *scale_ptrs, *views,
        *_strides(q, shape), *_strides(k, shape), *_strides(v, shape), *_strides(out, shape),
        *_lse_strides(lse, shape),
        shape.heads_q, shape.group, shape.seqlen_q, shape.seqlen_k, window or 0, scale * LOG2E,
        **_common(shape, causal, window), **_launch(cfg), FP8=scales is not None, **FORMAT_ARGS[torch.float8_e4m3fn],
        TMA=tma,
    )


def backward_into(
    grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
    shape: AttentionShape, causal: bool, scale: float, window: int | None, deterministic: bool = False,
    kv_config: AttentionConfig | None = None, dq_config: AttentionConfig | None = None,
) -> None:
    """Write the gradients of q, k and v into dq, dk and dv (shaped like q, k, v). `deterministic`: dQ in
    its own pass even where the dK/dV bucket sums it in fp32 across key blocks (the fused warp-specialized
    backward, WS; DQ_ATOMIC): the same bits run to run. `kv_config`, `dq_config`: the dK/dV (or fused) and dQ
    passes' configs instead of the tuned table's (benchmarks pin them)."""
    common = _common(shape, causal, window)
    cu_q, cu_k = _cu(shape, q)
    scalars = (shape.seqlen_q, shape.seqlen_k, window or 0, scale * LOG2E, scale)
    delta = torch.empty_like(lse)
    pre_grid = (cdiv(shape.seqlen_q, PREPROCESS_BLOCK_M), shape.batch * shape.heads_q)
    if pre_grid[0] * pre_grid[1] > 0:
        _bwd_preprocess_kernel[pre_grid](
            out, grad_out, delta, cu_q, *_strides(out, shape), *_strides(grad_out, shape), *_lse_strides(lse, shape),
            shape.heads_q, shape.seqlen_q,
            HEAD_DIM_V=shape.head_dim_v, BLOCK_DV=common["BLOCK_DV"], BLOCK_M=PREPROCESS_BLOCK_M,
            VARLEN=shape.packed,
        )
    cfg = kv_config or config_for("bwd_kv", shape.head_dim_qk, shape.head_dim_v)
    if deterministic:
        cfg = replace(cfg, DQ_ATOMIC=0, WS=0)
    if cfg.WS and hopper_ws.supports_backward(q, k, v, grad_out, causal, window, shape.packed):
        hopper_ws.backward_ws(q, k, v, grad_out, lse, delta, dq, dk, dv, causal, scale * LOG2E, scale)
        return
    tensors = (q, k, v, grad_out, lse, delta)
    strides = (*_strides(q, shape), *_strides(k, shape), *_strides(v, shape), *_strides(grad_out, shape))
    # DQ_ATOMIC: the dK/dV pass adds dQ into fp32 (zeroed: every key block adds its share), and no dQ pass runs.
    dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32) if cfg.DQ_ATOMIC else dq
    grid = (cdiv(shape.seqlen_k, cfg.BLOCK_N), shape.batch * shape.heads_kv)
    if grid[0] * grid[1] > 0:
        tma, views = _tma_views(cfg, shape, ((q, True, cfg.BLOCK_M), (grad_out, False, cfg.BLOCK_M)))
        # TMA reductions of dQ's tiles: GPU only (the interpreter has none; there the atomic adds run).
        reduce_dq = tma and cfg.DQ_ATOMIC and not interpreter_mode()
        dq_view = _tma_view(dq_acc, shape, shape.head_dim_qk, cfg.BLOCK_M) if reduce_dq else None
        reduce = dq_view is not None
        _bwd_dkdv_kernel[grid](
            *tensors, dk, dv, dq_acc, cu_q, cu_k, *views, dq_view if reduce else dq_acc, *strides,
            *_strides(dk, shape), *_strides(dv, shape), *_strides(dq_acc, shape), *_lse_strides(lse, shape),
            shape.heads_kv, shape.group, *scalars, **common, **_launch(cfg), TMA=tma, DQ_ATOMIC=bool(cfg.DQ_ATOMIC),
            DQ_REDUCE=reduce,
        )
    if cfg.DQ_ATOMIC:
        dq.copy_(dq_acc)
        return
    cfg = dq_config or config_for("bwd_q", shape.head_dim_qk, shape.head_dim_v)
    if cfg.WS and hopper_ws.supports_dq(q, k, v, grad_out, causal, window, shape.packed):
        hopper_ws.backward_dq_ws(q, k, v, grad_out, lse, delta, dq, causal, scale * LOG2E, scale)
        return
    grid = (cdiv(shape.seqlen_q, cfg.BLOCK_M), shape.batch * shape.heads_q)
    if grid[0] * grid[1] > 0:
        tma, views = _tma_views(cfg, shape, ((k, True, cfg.BLOCK_N), (v, False, cfg.BLOCK_N)))
        _bwd_dq_kernel[grid](
            *tensors, dq, cu_q, cu_k, *views, *strides, *_strides(dq, shape),
            *_lse_strides(lse, shape), shape.heads_q, shape.group, *scalars, **common, **_launch(cfg), TMA=tma,
        )


def quantize_per_head(
    x: torch.Tensor, cu_seqlens: torch.Tensor | None = None, sequence_major: bool = False,
    amax: torch.Tensor | None = None, scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k or v (bf16/fp16; [B, S, H, D], or packed [total, H, D] with its cu_seqlens) in E4M3 with one
    fp32 scale per sequence and head, [B, H] contiguous ([batch, H] packed): `x ~= data * scale`.
    `sequence_major`: the data laid out with the sequence dim contiguous, the K-major operand that the FP8
    forward's P @ V product reads on Hopper: pass it for v. Dense, each 32-key block holds its keys in the
    order of wgmma's E4M3 register operand (key s at key_position(s % 32); `natural_key_order` undoes it),
    and a row runs to the end of the last block, zeros past the keys; packed, the keys are in order (indexed
    as x) in rows padded to 16 bytes. Two passes over x (the amax, then the cast), no host sync (a packed
    row's sequence is found by a search of cu_seqlens). `amax` (zeroed) and `scale`: fp32 [batch, H] buffers to
    use (quantize_qkv cuts all three tensors' from one allocation: one memset). Unchecked:
    kernels.attention.quantize_heads checks its input."""
    fp8 = torch.float8_e4m3fn
    packed = cu_seqlens is not None
    (rows, heads, head_dim), seqlen = (x.shape, 1) if packed else ((x.shape[0] * x.shape[1], *x.shape[2:]), x.shape[1])
    batch = cu_seqlens.numel() - 1 if packed else x.shape[0]
    key_order = sequence_major and not packed
    if sequence_major:  # [B, H, D, S] in memory ([H, D, total] packed)
        order = (1, 2, 0) if packed else (0, 2, 3, 1)
        # Rows of whole 32-key blocks (dense: the keys' order permutes within them) or of a 16-byte multiple
        # (packed), so that TMA reads them whatever S is.
        stored = [x.shape[i] for i in order]
        block = KEY_ORDER_BLOCK.value if key_order else 16
        row = cdiv(stored[-1], block) * block
        # The last key block's gaps hold zeros: P @ V reads them (times P = 0, which a NaN would survive).
        allocate = torch.zeros if key_order and row != stored[-1] else torch.empty
        data = allocate([*stored[:-1], row], device=x.device, dtype=fp8)[..., :stored[-1]]
        data = data.permute([order.index(i) for i in range(x.ndim)])
    else:
        data = torch.empty_like(x, dtype=fp8, memory_format=torch.contiguous_format)
    if amax is None:
        amax = torch.zeros((batch, heads), device=x.device, dtype=torch.float32)
    if scale is None:
        scale = torch.empty((batch, heads), device=x.device, dtype=torch.float32)
    if rows and heads and head_dim:
        # Each row's sequence, for the packed form; dense rows find theirs by division (SEQ not read).
        seq = torch.searchsorted(cu_seqlens[1:], torch.arange(rows, device=x.device, dtype=cu_seqlens.dtype),
                                 right=True).to(torch.int32) if packed else amax
        strides = (0, *x.stride()) if packed else x.stride()
        out_strides = (0, *data.stride()) if packed else data.stride()
        grid = (cdiv(rows, QUANTIZE_ROWS), heads)
        common = {"HEAD_DIM": head_dim, "BLOCK_D": next_power_of_2(head_dim), "BLOCK_S": QUANTIZE_ROWS,
                  "VARLEN": packed}
        _head_amax_kernel[grid](x, amax, seq, rows, seqlen, heads, *strides, **common)
        _head_cast_kernel[grid](x, data, amax, scale, seq, rows, seqlen, batch, heads, *strides, *out_strides,
                                **common, **FORMAT_ARGS[fp8], EPS=AMAX_EPS, KEY_ORDER=key_order)
    else:  # nothing to read: the scales of all-zero heads
        scale.fill_(AMAX_EPS / FP8_MAX[fp8])
    return data, scale


def natural_key_order(v8: torch.Tensor) -> torch.Tensor:
    """A dense sequence-major v from quantize_per_head (keys at key_position within each 32-key block) with its
    keys in order, [B, S, H, D] contiguous (a copy: for references and inspection)."""
    B, S, H, D = v8.shape
    row = v8.stride(3)
    stored = v8.as_strided((B, H, D, row), (v8.stride(0), v8.stride(2), row, 1))
    keys = torch.arange(S, device=v8.device)
    positions = keys // KEY_ORDER_BLOCK.value * KEY_ORDER_BLOCK.value + key_position(keys % KEY_ORDER_BLOCK.value)
    return stored[..., positions].permute(0, 3, 1, 2).contiguous()


def quantize_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: AttentionShape,
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], HeadScales]:
    """q, k and v of a checked problem quantized for the FP8 forward (v sequence-major), and their scales. One
    zeroed buffer holds the three tensors' amaxes and their scales: one memset, and each cast kernel writes its
    scales, where each tensor took a memset and two torch ops besides its two kernels."""
    heads = [x.shape[-2] for x in (q, k, v)]
    # Row 0: the amaxes, row 1: the scales; each cut into [batch, H] pieces for q, k and v.
    amax, scale = ([part.view(shape.batch, h) for part, h in zip(row.split([shape.batch * h for h in heads]), heads,
                                                                 strict=True)]
                   for row in torch.zeros(2, shape.batch * sum(heads), device=q.device, dtype=torch.float32))
    q8, q_scale = quantize_per_head(q, shape.cu_seqlens_q, amax=amax[0], scale=scale[0])
    k8, k_scale = quantize_per_head(k, shape.cu_seqlens_k, amax=amax[1], scale=scale[1])
    v8, v_scale = quantize_per_head(v, shape.cu_seqlens_k, sequence_major=True, amax=amax[2], scale=scale[2])
    return (q8, k8, v8), HeadScales(q_scale, k_scale, v_scale)


class AttentionFunction(torch.autograd.Function):
    """attention with autograd: saves q, k, v, out and the LSE; the backward runs the three passes.
    `fp8_forward`: the forward quantizes q, k and v (quantize_qkv) and runs in FP8; the backward is the
    bf16 one, on the saved high-precision inputs and the FP8 forward's out and LSE."""

    @staticmethod
    def forward(ctx, q, k, v, shape, causal, scale, window, fp8_forward=False, deterministic=False):
        out = q.new_empty(shape.out_shape(q.shape[0]))
        lse = torch.empty(shape.lse_shape(q.shape[0]), device=q.device, dtype=torch.float32)
        if fp8_forward:
            (q8, k8, v8), scales = quantize_qkv(q, k, v, shape)
            forward_into(q8, k8, v8, out, lse, shape, causal, scale, window, scales)
        else:
            forward_into(q, k, v, out, lse, shape, causal, scale, window)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (shape, causal, scale, window, deterministic)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        backward_into(grad_out.to(q.dtype), q, k, v, out, lse, dq, dk, dv, *ctx.args)
        return dq, dk, dv, None, None, None, None, None, None
