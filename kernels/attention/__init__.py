"""attention: flash attention for training (forward and backward), dense or packed, with GQA, causal and a
sliding window; bf16/fp16, fp32 accumulation.

    from kernels.attention import attention, attention_varlen
    out = attention(q, k, v, causal=True)            # q [B, S, Hq, D], k/v [B, S, Hkv, D]
    out = attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)   # q [total_q, Hq, D]
    out.backward(grad_out)
    out = attention(q, k, v, causal=True, fp8_forward=True)   # the forward in FP8 (E4M3), the backward bf16
    out = attention(q, k, v, causal=True, deterministic=True)  # the same bits run to run

    q8, q_scale = quantize_heads(q)                  # E4M3 with one scale per sequence and head
    k8, k_scale = quantize_heads(k)
    v8, v_scale = quantize_heads(v, sequence_major=True)
    out, lse = attention_forward(q8, k8, v8, dense_shape(q8, k8, v8), causal=True,
                                 scales=HeadScales(q_scale, k_scale, v_scale))   # bf16 out

Semantics are flash-attn's (kernels/attention/kernel.py says them in full): causal aligned bottom-right
when Sq != Sk, `window` = keys left of the diagonal a query sees (window_size=(window, 0); causal only),
softmax_scale 1/sqrt(D) by default. Head dims 64, 128, 192 and 256; q/k and v head dims may differ (MLA:
192/128). The FP8 forward computes both products in E4M3 with fp32 accumulation (P scaled into the
format's normal range); a v laid out sequence-major (`quantize_heads(..., sequence_major=True)`, its keys
in the E4M3 operand's order) is the operand Hopper's FP8 tensor cores read without a transpose, and P goes
into the product without moving between threads. Inputs are checked here (a one-line
ValueError); cu_seqlens' values are not: reading them would need the host, and the kernels never do,
so a step can be captured in a CUDA graph.
"""

from __future__ import annotations

import math

import torch

from kernels.attention.hopper_ws import FP8_DTYPE
from kernels.attention.kernel import (
    AttentionFunction,
    AttentionShape,
    HeadScales,
    backward_into,
    forward_into,
    quantize_per_head,
)
from kernels.common.device import check_same_device

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
SUPPORTED_HEAD_DIMS = (64, 128, 192, 256)


def _fail(problem: str) -> ValueError:
    return ValueError(f"attention: {problem}")


def _check_options(causal: bool, softmax_scale: float | None, window: int | None, head_dim: int) -> float:
    """The softmax scale to use, after checking the options."""
    if window is not None and (not isinstance(window, int) or window < 0):
        raise _fail(f"window must be None or a non-negative int, got {window!r}")
    if window is not None and not causal:
        raise _fail("a sliding window needs causal=True (it is flash-attn's window_size=(window, 0))")
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if not softmax_scale > 0:
        raise _fail(f"softmax_scale must be positive, got {softmax_scale!r}")
    return float(softmax_scale)


def _check_tensors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank: int) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.ndim != rank:
            layout = "[B, S, H, D]" if rank == 4 else "[total, H, D]"
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise _fail(f"{name} must be {rank}-D {layout}, got {got}")
    if q.dtype not in (*SUPPORTED_DTYPES, FP8_DTYPE) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise _fail(f"q, k and v must all be bf16 or fp16 (float8_e4m3fn for the FP8 forward), got {q.dtype}, "
                    f"{k.dtype} and {v.dtype}")
    check_same_device(q=q, k=k, v=v)
    (hq, dqk), (hk, dk), (hv, dv) = q.shape[-2:], k.shape[-2:], v.shape[-2:]
    if dk != dqk:
        raise _fail(f"head dims of q and k differ: {dqk} and {dk}")
    for name, d in (("q/k", dqk), ("v", dv)):
        if d not in SUPPORTED_HEAD_DIMS:
            raise _fail(f"unsupported {name} head dim {d} (supported: {', '.join(map(str, SUPPORTED_HEAD_DIMS))})")
    if hv != hk:
        raise _fail(f"k and v must have the same number of heads, got {hk} and {hv}")
    if hk == 0 or hq % hk:
        raise _fail(f"q heads ({hq}) must be a multiple of k/v heads ({hk})")
    if k.shape[:-2] != v.shape[:-2]:
        raise _fail(f"k and v disagree on batch/sequence sizes: {tuple(k.shape)} and {tuple(v.shape)}")


def dense_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> AttentionShape:
    """The checked shape of a dense problem: q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv]."""
    _check_tensors(q, k, v, rank=4)
    if q.shape[0] != k.shape[0]:
        raise _fail(f"batch sizes of q and k differ: {q.shape[0]} and {k.shape[0]}")
    (b, sq, hq, dqk), (_, sk, hkv, _), dv = q.shape, k.shape, v.shape[-1]
    return AttentionShape(b, sq, sk, hq, hkv, dqk, dv)


def packed_shape(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int, max_seqlen_k: int,
) -> AttentionShape:
    """The checked shape of a packed problem: q [total_q, Hq, D], k/v [total_k, Hkv, D], cu_seqlens [batch + 1]."""
    _check_tensors(q, k, v, rank=3)
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor) or cu.ndim != 1 or cu.dtype != torch.int32 or cu.numel() < 1:
            got = f"{cu.dtype} {tuple(cu.shape)}" if isinstance(cu, torch.Tensor) else type(cu).__name__
            raise _fail(f"{name} must be a 1-D int32 tensor [batch + 1], got {got}")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise _fail(f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got "
                    f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
    check_same_device(q=q, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    for name, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(n, int) or n < 0:
            raise _fail(f"{name} must be a non-negative int (a host value), got {n!r}")
    (_, hq, dqk), (_, hkv, _), dv = q.shape, k.shape, v.shape[-1]
    return AttentionShape(cu_seqlens_q.numel() - 1, max_seqlen_q, max_seqlen_k, hq, hkv, dqk, dv,
                          cu_seqlens_q, cu_seqlens_k)


def _check_buffer(
    name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
    also: torch.dtype | None = None,
) -> None:
    """`t` must have this shape and device, and this dtype (or `also`)."""
    if tuple(t.shape) != shape or t.dtype not in (dtype, also) or t.device != device:
        want = f"{dtype} or {also}" if also else str(dtype)
        raise _fail(f"{name} must be {list(shape)} {want} on {device}, got {list(t.shape)} {t.dtype} on {t.device}")


def _check_high_precision(q: torch.Tensor, what: str) -> None:
    if q.dtype not in SUPPORTED_DTYPES:
        raise _fail(f"{what} takes bf16 or fp16 q, k and v, got {q.dtype} (FP8 inputs: attention_forward with "
                    "scales=)")


def _check_scales(scales: HeadScales, shape: AttentionShape, q: torch.Tensor) -> None:
    if not isinstance(scales, HeadScales):
        raise _fail(f"scales must be a HeadScales, got {type(scales).__name__}")
    if q.dtype != FP8_DTYPE:
        raise _fail(f"scales go with float8_e4m3fn q, k and v, got {q.dtype}")
    for name, t, heads in (("q", scales.q, shape.heads_q), ("k", scales.k, shape.heads_kv),
                           ("v", scales.v, shape.heads_kv)):
        _check_buffer(f"scales.{name}", t, (shape.batch, heads), torch.float32, q.device)
        if not t.is_contiguous():
            raise _fail(f"scales.{name} must be contiguous")


def _check_lse(lse: torch.Tensor, shape: AttentionShape, q: torch.Tensor) -> None:
    _check_buffer("lse", lse, shape.lse_shape(q.shape[0]), torch.float32, q.device)
    if lse.stride(-1) != 1:
        raise _fail("lse must have contiguous rows")


def attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: AttentionShape, causal: bool = False,
    softmax_scale: float | None = None, window: int | None = None,
    out: torch.Tensor | None = None, lse: torch.Tensor | None = None, scales: HeadScales | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward without autograd, into `out` (q's dtype or fp32; bf16 by default for FP8 inputs) and
    `lse` when given: returns (out, LSE), the LSE natural-log fp32 [B, Hq, Sq] ([Hq, total_q] packed).
    `shape` from dense_shape / packed_shape. `scales`: q, k and v are E4M3 (quantize_heads) and the
    forward runs in FP8."""
    scale = _check_options(causal, softmax_scale, window, shape.head_dim_qk)
    if scales is None:
        _check_high_precision(q, "attention_forward without scales")
    else:
        _check_scales(scales, shape, q)
    rows = q.shape[0]
    out_dtype = torch.bfloat16 if scales is not None else q.dtype
    if out is None:
        out = torch.empty(shape.out_shape(rows), device=q.device, dtype=out_dtype)
    if scales is not None and out.dtype in SUPPORTED_DTYPES:
        out_dtype = out.dtype
    _check_buffer("out", out, shape.out_shape(rows), out_dtype, q.device, also=torch.float32)
    if lse is None:
        lse = torch.empty(shape.lse_shape(rows), device=q.device, dtype=torch.float32)
    _check_lse(lse, shape, q)
    forward_into(q, k, v, out, lse, shape, causal, scale, window, scales)
    return out, lse


def attention_backward(
    grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    shape: AttentionShape, causal: bool = False, softmax_scale: float | None = None, window: int | None = None,
    dq: torch.Tensor | None = None, dk: torch.Tensor | None = None, dv: torch.Tensor | None = None,
    deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward without autograd, from the forward's out and LSE, into dq, dk, dv when given.
    `deterministic` as in `attention`."""
    scale = _check_options(causal, softmax_scale, window, shape.head_dim_qk)
    _check_high_precision(q, "attention_backward")
    _check_buffer("out", out, shape.out_shape(q.shape[0]), q.dtype, q.device, also=torch.float32)
    _check_buffer("grad_out", grad_out, tuple(out.shape), q.dtype, q.device)
    _check_lse(lse, shape, q)
    grads = []
    for name, buf, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        if buf is None:
            buf = torch.empty_like(like)
        _check_buffer(name, buf, tuple(like.shape), like.dtype, like.device)
        grads.append(buf)
    backward_into(grad_out, q, k, v, out, lse, *grads, shape, causal, scale, window, deterministic)
    return grads[0], grads[1], grads[2]


def quantize_heads(
    x: torch.Tensor, cu_seqlens: torch.Tensor | None = None, sequence_major: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k or v for the FP8 forward: (E4M3 data, fp32 scales [B, H]), one scale per sequence and head. x is
    bf16/fp16 [B, S, H, D], or packed [total, H, D] with its cu_seqlens ([batch + 1] int32 on x's device).
    `sequence_major` (for v): the FP8 forward's v, the sequence dim contiguous. Dense, the keys of each
    32-key block are in the order of wgmma's E4M3 register operand, and rows are padded with zeros to whole
    blocks (kernel.quantize_per_head). Use it only as the forward's v; `kernel.natural_key_order` puts the keys
    back in order. Packed, the data is indexed as x."""
    rank = 4 if cu_seqlens is None else 3
    if not isinstance(x, torch.Tensor) or x.ndim != rank or x.dtype not in SUPPORTED_DTYPES:
        layout = "[B, S, H, D]" if rank == 4 else "[total, H, D] (with cu_seqlens)"
        got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise _fail(f"quantize_heads: x must be a {rank}-D bf16/fp16 tensor {layout}, got {got}")
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.ndim != 1 or cu_seqlens.dtype != torch.int32 \
                or cu_seqlens.numel() < 1:
            raise _fail("quantize_heads: cu_seqlens must be a 1-D int32 tensor [batch + 1]")
        check_same_device(x=x, cu_seqlens=cu_seqlens)
    return quantize_per_head(x, cu_seqlens, sequence_major)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, softmax_scale: float | None = None,
    window: int | None = None, fp8_forward: bool = False, deterministic: bool = False,
) -> torch.Tensor:
    """softmax(q k^T * softmax_scale) v with autograd. q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv]
    (Hkv divides Hq); returns [B, Sq, Hq, Dv]. `fp8_forward`: the forward quantizes q, k and v to E4M3 (one
    scale per sequence and head) and runs in FP8; the backward runs in q's dtype from the saved inputs.
    `deterministic`: the backward gives the same bits run to run (flash-attn's flag): where the tuned table
    sums dQ across key blocks in fp32 (the fused warp-specialized backward on Hopper, WS; DQ_ATOMIC), dQ gets
    its own pass instead (0.8x the fused backward's speed at d128 on the H100)."""
    shape = dense_shape(q, k, v)
    _check_high_precision(q, "attention")
    scale = _check_options(causal, softmax_scale, window, shape.head_dim_qk)
    return AttentionFunction.apply(q, k, v, shape, causal, scale, window, fp8_forward, deterministic)


def attention_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int, max_seqlen_k: int, causal: bool = False, softmax_scale: float | None = None,
    window: int | None = None, fp8_forward: bool = False, deterministic: bool = False,
) -> torch.Tensor:
    """attention over packed sequences with autograd: q [total_q, Hq, D], k/v [total_k, Hkv, D];
    sequence b is rows cu_seqlens[b]:cu_seqlens[b + 1] (int32 on q's device, empty sequences allowed);
    max_seqlen_* are host ints, at least the longest sequence (they size the grid). Returns [total_q, Hq, Dv].
    `fp8_forward` and `deterministic` as in `attention`."""
    shape = packed_shape(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    _check_high_precision(q, "attention_varlen")
    scale = _check_options(causal, softmax_scale, window, shape.head_dim_qk)
    return AttentionFunction.apply(q, k, v, shape, causal, scale, window, fp8_forward, deterministic)


__all__ = [
    "AttentionShape", "HeadScales", "attention", "attention_backward", "attention_forward", "attention_varlen",
    "dense_shape", "packed_shape", "quantize_heads",
]
