"""attention: forward and backward against float64 (dense, GQA/MQA, causal bottom-right, window, every head
dim, odd and unequal lengths, packed sequences with empty and one-token ones), poisoned buffers, bad
input, the tuned table, the OpSpec's bench; on a GPU, bf16 and CUDA-graph replay."""

import math

import pytest
import torch
from pydantic import ValidationError

from harness.quick_test_bench import run_bench
from harness.registry import get_spec
from harness.schema import get_schema
from harness.shapes import Shape, load_shapes, preset_names
from harness.snr import snr_db, snr_threshold
from kernels.attention import (
    attention,
    attention_backward,
    attention_forward,
    attention_varlen,
    dense_shape,
    hopper_ws,
    packed_shape,
)
from kernels.attention import kernel as kernel_module
from kernels.attention.tuning import (
    FP8_VARIANT,
    PASSES,
    TUNABLE_SPACE,
    TUNED_TABLE,
    buckets_for,
    config_for,
    fits,
    shared_memory_bytes,
)
from kernels.common.device import SHARED_MEMORY_BYTES
from kernels.common.dtypes import dtype_name
from tests.graph_replay import replay_and_eager


def reference(q, k, v, grad_out, causal, window=None, scale=None):
    """out, dq, dk, dv in float64 through autograd, with flash-attn's masks built independently of the op:
    query i of Sq sees key j of Sk iff j <= i + Sk - Sq (causal) and j >= i + Sk - Sq - window."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    (_, Sq, Hq, D), (Sk, Hkv) = q.shape, k.shape[1:3]
    kx, vx = (t.repeat_interleave(Hq // Hkv, dim=2) for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q, kx) * (scale or 1.0 / math.sqrt(D))
    i = torch.arange(Sq, device=q.device)[:, None] + Sk - Sq
    j = torch.arange(Sk, device=q.device)[None, :]
    seen = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    if causal:
        seen &= j <= i
    if window is not None:
        seen &= j >= i - window
    p = torch.softmax(s.masked_fill(~seen, -math.inf), dim=-1).nan_to_num(0.0)  # rows that see nothing give 0
    out = torch.einsum("bhqk,bkhd->bqhd", p, vx)
    out.backward(grad_out.double())
    return out.detach(), q.grad, k.grad, v.grad


def make(B, Sq, Sk, Hq, Hkv, D, Dv, dtype, device, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, Sq, Hq, D, generator=gen, device=device, dtype=dtype)
    k = torch.randn(B, Sk, Hkv, D, generator=gen, device=device, dtype=dtype)
    v = torch.randn(B, Sk, Hkv, Dv, generator=gen, device=device, dtype=dtype)
    g = torch.randn(B, Sq, Hq, Dv, generator=gen, device=device, dtype=dtype)
    return q, k, v, g


def autograd_run(q, k, v, g, **options):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = attention(q, k, v, **options)
    out.backward(g)
    return out, q.grad, k.grad, v.grad


def assert_close(got, want, dtype):
    floor = snr_threshold(dtype_name(dtype))
    for name, x, r in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        assert x.shape == r.shape, name
        assert snr_db(x, r) >= floor, (name, snr_db(x, r))


# (B, Sq, Sk, Hq, Hkv, D, Dv, causal, window): lengths none a block multiple; the first rows of a causal
# Sq > Sk problem see no key; windows narrower and wider than a block.
DENSE_CASES = {
    "mha-d64-s77": (1, 77, 77, 2, 2, 64, 64, False, None),
    "gqa-causal-d64-s150": (2, 150, 150, 4, 2, 64, 64, True, None),
    "mqa-causal-d128-q45-k80": (1, 45, 80, 4, 1, 128, 128, True, None),
    "causal-q100-k37-empty-rows": (1, 100, 37, 2, 1, 64, 64, True, None),
    "noncausal-q33-k150-d128": (1, 33, 150, 2, 2, 128, 128, False, None),
    "causal-d256-s50": (1, 50, 50, 2, 1, 256, 256, True, None),
    "mla-causal-d192-v128-s61": (1, 61, 61, 2, 2, 192, 128, True, None),
    "mla-noncausal-d192-v128-s40": (1, 40, 70, 2, 1, 192, 128, False, None),
    "window16-gqa-s150": (1, 150, 150, 4, 2, 64, 64, True, 16),
    "window1-two-keys": (1, 40, 40, 2, 1, 64, 64, True, 1),
    "window100-q60-k130": (1, 60, 130, 2, 2, 64, 64, True, 100),
}


@pytest.mark.parametrize("case", DENSE_CASES.values(), ids=DENSE_CASES.keys())
def test_dense_forward_and_backward_match_float64(case, device, half_dtype):
    B, Sq, Sk, Hq, Hkv, D, Dv, causal, window = case
    q, k, v, g = make(B, Sq, Sk, Hq, Hkv, D, Dv, half_dtype, device)
    got = autograd_run(q, k, v, g, causal=causal, window=window)
    assert got[0].dtype == half_dtype and got[0].shape == (B, Sq, Hq, Dv)
    assert_close(got, reference(q, k, v, g, causal, window), half_dtype)


def test_strided_views_of_a_fused_qkv(device, half_dtype):
    """q, k, v as head slices of one fused QKV projection output (rows strided by all heads), as models
    hand them over: no copies needed."""
    qkv, g = (torch.randn(2, 67, n, 64, device=device, dtype=half_dtype) for n in (4 + 2 * 2, 4))
    q, k, v = qkv[:, :, :4], qkv[:, :, 4:6], qkv[:, :, 6:]
    assert not q.is_contiguous()
    assert_close(autograd_run(q, k, v, g, causal=True), reference(q, k, v, g, True), half_dtype)


@pytest.mark.parametrize("tiles", [(16, 32), (32, 16), (64, 16)], ids=lambda t: f"{t[0]}x{t[1]}")
def test_other_tilings_of_the_search_space(tiles, device, half_dtype, monkeypatch):
    """The masked / fully-visible block split holds for query blocks narrower and wider than key blocks
    (the search moves BLOCK_M and BLOCK_N of every pass): a causal window with Sq != Sk, and packed."""
    for name in TUNED_TABLE:
        monkeypatch.setitem(TUNED_TABLE, name, TUNED_TABLE[name] | {"BLOCK_M": tiles[0], "BLOCK_N": tiles[1]})
    q, k, v, g = make(1, 70, 99, 4, 2, 64, 64, half_dtype, device)
    assert_close(autograd_run(q, k, v, g, causal=True, window=40), reference(q, k, v, g, True, 40), half_dtype)
    assert_packed_causal_step((0, 1, 45, 20), 2, 1, 45, device, half_dtype)


def tma_everywhere(monkeypatch) -> list[bool]:
    """The tuned table's TMA knob on in every bucket; the list returned fills with whether each launch
    from then on read its tile stream through descriptors (a tensor without the view falls back)."""
    for name in TUNED_TABLE:
        monkeypatch.setitem(TUNED_TABLE, name, TUNED_TABLE[name] | {"TMA": 1})
    taken: list[bool] = []
    views = kernel_module._tma_views

    def recorded(*args, **kwargs):
        tma, descriptors = views(*args, **kwargs)
        taken.append(tma)
        return tma, descriptors

    monkeypatch.setattr(kernel_module, "_tma_views", recorded)
    return taken


def test_tile_streams_through_tensor_descriptors(device, half_dtype, monkeypatch):
    """With the tuned table's TMA knob on, every pass reads its tile stream through descriptors of the
    [rows, heads x head dim] views (rows past a sequence's end are the next sequence's, or zeros past
    the tensor's): GQA causal, a window with Sq != Sk, unequal q/k and v head dims, a fused QKV's head
    slices, and packed sequences with empty and one-token ones; MLA's 192 (padding columns) and a
    transposed layout fall back to pointers in the passes that stream them. All against float64."""
    for name in TUNED_TABLE:
        if name.startswith("bwd_kv"):  # every pass runs: dQ in its own (atomic dQ with TMA has its own test)
            monkeypatch.setitem(TUNED_TABLE, name, TUNED_TABLE[name] | {"DQ_ATOMIC": 0})
    taken = tma_everywhere(monkeypatch)
    for B, Sq, Sk, Hq, Hkv, D, Dv, causal, window in [(2, 150, 150, 4, 2, 64, 64, True, None),
                                                       (1, 60, 130, 2, 2, 64, 64, True, 100),
                                                       (1, 33, 70, 2, 2, 128, 64, False, None)]:
        q, k, v, g = make(B, Sq, Sk, Hq, Hkv, D, Dv, half_dtype, device)
        assert_close(autograd_run(q, k, v, g, causal=causal, window=window),
                     reference(q, k, v, g, causal, window), half_dtype)
    qkv = torch.randn(2, 67, 8, 64, device=device, dtype=half_dtype)
    q, k, v, g = qkv[:, :, :4], qkv[:, :, 4:6], qkv[:, :, 6:], torch.randn_like(qkv[:, :, :4])
    assert_close(autograd_run(q, k, v, g, causal=True), reference(q, k, v, g, True), half_dtype)
    assert_packed_causal_step((0, 1, 70, 29, 130), 4, 2, 170, device, half_dtype)
    assert len(taken) == 5 * 3 and all(taken)
    taken.clear()
    q, k, v, g = make(1, 40, 40, 2, 1, 192, 128, half_dtype, device)
    assert_close(autograd_run(q, k, v, g, causal=True), reference(q, k, v, g, True), half_dtype)
    q, k, v, g = make(1, 40, 40, 2, 1, 64, 64, half_dtype, device)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # heads outermost: rows are no [heads x dim] view
    assert_close(autograd_run(q, k, v, g, causal=True), reference(q, k, v, g, True), half_dtype)
    # forward, dK/dV, dQ: MLA's on pointers; the transposed q's dQ pass streams only k and v, by TMA
    assert taken == [False, False, False, False, False, True]


def test_tma_views_of_each_layout_or_none(device, half_dtype):
    """`_tma_view`: [rows, heads x head dim] over dense, packed and fused-QKV layouts; a [batch x heads x
    head dim, keys] view of a sequence-major tensor; None where TMA cannot read the tiles."""
    view = kernel_module._tma_view
    q, k, _, _ = make(2, 40, 48, 4, 2, 64, 64, half_dtype, device)
    shape = dense_shape(q, k, k)
    dense = view(q, shape, 64, 32)
    assert (dense.shape, dense.strides, dense.block_shape) == ([80, 256], [256, 1], [32, 64])
    qkv = torch.empty(2, 40, 8, 64, device=device, dtype=half_dtype)
    assert view(qkv[:, :, :4], shape, 64, 32).strides == [512, 1]  # rows strided by all of QKV's heads
    seq_major = q.transpose(1, 3).contiguous().transpose(1, 3)  # [B, S, H, D] over [B, D, H, S] memory
    assert view(q.transpose(1, 2).contiguous().transpose(1, 2), shape, 64, 32) is None  # heads outermost
    assert view(seq_major, shape, 64, 32) is None
    offset = torch.empty(q.numel() + 1, device=device, dtype=half_dtype)[1:].view(q.shape)  # base 2 bytes off
    assert view(offset, shape, 64, 32) is None
    mla = torch.empty(2, 40, 4, 192, device=device, dtype=half_dtype)
    assert view(mla, dense_shape(mla, mla, mla), 192, 32) is None  # padding columns
    # The FP8 forward's v: rows of whole 32-key blocks (48 keys: 64), read whole (the keys in their block order)
    v8 = kernel_module.quantize_per_head(k, sequence_major=True)[0]
    fp8 = view(v8, dense_shape(v8, v8, v8), 64, 32, sequence_major=True)
    assert (fp8.shape, fp8.strides, fp8.block_shape) == ([2 * 2 * 64, 64], [64, 1], [64, 32])
    odd = kernel_module.quantize_per_head(k[:, :37], sequence_major=True)[0]  # 37 keys
    odd_view = view(odd, dense_shape(odd, odd, odd), 64, 32, sequence_major=True)
    assert (odd_view.shape, odd_view.strides) == ([2 * 2 * 64, 64], [64, 1])
    unpadded = torch.empty(2, 2, 64, 37, device=device, dtype=odd.dtype).permute(0, 3, 1, 2)  # 37-byte rows
    assert view(unpadded, dense_shape(unpadded, unpadded, unpadded), 64, 32, sequence_major=True) is None
    lens = (0, 1, 47)
    pq, pk, _, _, cu, _ = packed(lens, lens, 4, 2, 64, 64, half_dtype, device)
    assert view(pq, packed_shape(pq, pk, pk, cu, cu, 47, 47), 64, 32).shape == [48, 256]
    pv8 = kernel_module.quantize_per_head(pk, cu, sequence_major=True)[0]
    assert view(pv8, packed_shape(pv8, pv8, pv8, cu, cu, 47, 47), 64, 32, sequence_major=True) is None


def test_dq_added_atomically_by_the_dkdv_pass(device, half_dtype, monkeypatch):
    """With DQ_ATOMIC in the dK/dV buckets, that pass adds dQ into fp32 and the dQ pass never runs: GQA
    causal, a window with Sq != Sk, queries that see no key, MLA's padded head dim, packed sequences with
    empty and one-token ones; then with TMA on too. All against float64."""
    for name in TUNED_TABLE:
        if name.startswith("bwd_kv"):
            monkeypatch.setitem(TUNED_TABLE, name, TUNED_TABLE[name] | {"DQ_ATOMIC": 1})
    dq_pass = []
    monkeypatch.setattr(kernel_module, "_bwd_dq_kernel", dq_pass)  # launching it would fail: never launched
    for name in ("gqa-causal-d64-s150", "window100-q60-k130", "causal-q100-k37-empty-rows",
                 "mla-causal-d192-v128-s61"):
        B, Sq, Sk, Hq, Hkv, D, Dv, causal, window = DENSE_CASES[name]
        q, k, v, g = make(B, Sq, Sk, Hq, Hkv, D, Dv, half_dtype, device)
        assert_close(autograd_run(q, k, v, g, causal=causal, window=window),
                     reference(q, k, v, g, causal, window), half_dtype)
    assert_packed_causal_step((0, 1, 70, 29, 130), 4, 2, 130, device, half_dtype)
    taken = tma_everywhere(monkeypatch)
    q, k, v, g = make(2, 150, 150, 4, 2, 64, 64, half_dtype, device)
    assert_close(autograd_run(q, k, v, g, causal=True), reference(q, k, v, g, True), half_dtype)
    assert taken == [True, True] and dq_pass == []


def test_softmax_scale_and_fully_masked_rows(device, half_dtype):
    """A given scale is used; queries that see no key (causal, Sq > Sk) get out 0, LSE +inf, dq 0."""
    q, k, v, g = make(1, 20, 5, 2, 1, 64, 64, half_dtype, device)
    got = autograd_run(q, k, v, g, causal=True, softmax_scale=0.3)
    assert_close(got, reference(q, k, v, g, True, scale=0.3), half_dtype)
    out, lse = attention_forward(q, k, v, dense_shape(q, k, v), causal=True, softmax_scale=0.3)
    assert torch.equal(out[:, :15], torch.zeros_like(out[:, :15])) and torch.isinf(lse[..., :15]).all()
    assert torch.isfinite(lse[..., 15:]).all() and torch.equal(got[1][:, :15], torch.zeros_like(got[1][:, :15]))


class CountedLaunches:
    """A kernel whose launches (`kernel[grid](...)`) are counted."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


def test_deterministic_backward_runs_the_dq_pass(device, half_dtype, monkeypatch):
    """deterministic=True: the same bits twice, with dQ from its own pass even where the table adds it
    atomically (DQ_ATOMIC: on a GPU the order of the fp32 adds varies run to run); dK/dV sum a kv head's
    q heads in registers, no atomics either way."""
    for name in TUNED_TABLE:
        if name.startswith("bwd_kv"):
            monkeypatch.setitem(TUNED_TABLE, name, TUNED_TABLE[name] | {"DQ_ATOMIC": 1})
    dq_pass = CountedLaunches(kernel_module._bwd_dq_kernel)
    monkeypatch.setattr(kernel_module, "_bwd_dq_kernel", dq_pass)
    q, k, v, g = make(1, 90, 90, 4, 1, 64, 64, half_dtype, device)
    first, second = (autograd_run(q, k, v, g, causal=True, deterministic=True) for _ in range(2))
    assert dq_pass.launches == 2
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert_close(first, reference(q, k, v, g, True), half_dtype)


def packed(lens_q, lens_k, Hq, Hkv, D, Dv, dtype, device, seed=1):
    q, k, v, g = make(1, sum(lens_q), sum(lens_k), Hq, Hkv, D, Dv, dtype, device, seed)

    def cu(lens):
        return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)

    return q[0], k[0], v[0], g[0], cu(lens_q), cu(lens_k)


def packed_reference(q, k, v, g, lens_q, lens_k, causal, window):
    """Each sequence through the dense reference on its own, concatenated."""
    parts, q0, k0 = [], 0, 0
    for nq, nk in zip(lens_q, lens_k, strict=True):
        parts.append(reference(*(t[None, s0:s0 + n] for t, s0, n in ((q, q0, nq), (k, k0, nk), (v, k0, nk),
                                                                       (g, q0, nq))), causal, window))
        q0, k0 = q0 + nq, k0 + nk
    return [torch.cat([p[i][0] for p in parts]) for i in range(4)]


def assert_packed_causal_step(lens, heads_q, heads_kv, max_seqlen, device, dtype):
    """A causal d64 forward and backward over packed sequences of these lengths, through autograd, against
    each sequence alone in float64."""
    q, k, v, g, cu, _ = packed(lens, lens, heads_q, heads_kv, 64, 64, dtype, device)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = attention_varlen(q, k, v, cu, cu, max_seqlen, max_seqlen, causal=True)
    out.backward(g)
    assert_close((out, q.grad, k.grad, v.grad), packed_reference(q, k, v, g, lens, lens, True, None), dtype)


# (lens_q, lens_k, Hq, Hkv, causal, window): empty and one-token sequences, a query-only and a key-only one.
PACKED_CASES = {
    "causal-gqa-empty-one-token": ((0, 1, 70, 29, 130), (0, 1, 70, 29, 130), 4, 2, True, None),
    "noncausal": ((3, 0, 64, 17), (3, 0, 64, 17), 2, 2, False, None),
    "causal-unequal-q-k": ((5, 0, 40, 2, 0), (9, 3, 40, 0, 4), 2, 1, True, None),
    "window8": ((1, 100, 33), (1, 100, 33), 2, 1, True, 8),
}


@pytest.mark.parametrize("case", PACKED_CASES.values(), ids=PACKED_CASES.keys())
def test_varlen_matches_each_sequence_alone(case, device, half_dtype):
    lens_q, lens_k, Hq, Hkv, causal, window = case
    q, k, v, g, cu_q, cu_k = packed(lens_q, lens_k, Hq, Hkv, 64, 64, half_dtype, device)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    # max_seqlen larger than the longest sequence: the extra programs exit early.
    out = attention_varlen(q, k, v, cu_q, cu_k, max(lens_q) + 40, max(lens_k) + 7, causal=causal, window=window)
    out.backward(g)
    assert_close((out, q.grad, k.grad, v.grad), packed_reference(q, k, v, g, lens_q, lens_k, causal, window),
                 half_dtype)


def test_every_output_element_is_written_into_poisoned_buffers(device, half_dtype):
    """Forward and backward entry points into NaN-filled buffers, dense (MLA head dims) and packed."""
    q, k, v, g = make(2, 70, 70, 4, 2, 192, 128, half_dtype, device)
    shape = dense_shape(q, k, v)
    out, lse = torch.full_like(g, math.nan), torch.full((2, 4, 70), math.nan, device=device)
    grads = [torch.full_like(t, math.nan) for t in (q, k, v)]
    attention_forward(q, k, v, shape, causal=True, out=out, lse=lse)
    attention_backward(g, q, k, v, out, lse, shape, causal=True, dq=grads[0], dk=grads[1], dv=grads[2])
    assert_close((out, *grads), reference(q, k, v, g, True), half_dtype)

    lens = (0, 1, 70, 29)
    q, k, v, g, cu, _ = packed(lens, lens, 2, 1, 64, 64, half_dtype, device)
    shape = packed_shape(q, k, v, cu, cu, 70, 70)
    out, lse = torch.full_like(g, math.nan), torch.full((2, sum(lens)), math.nan, device=device)
    grads = [torch.full_like(t, math.nan) for t in (q, k, v)]
    attention_forward(q, k, v, shape, causal=True, out=out, lse=lse)
    attention_backward(g, q, k, v, out, lse, shape, causal=True, dq=grads[0], dk=grads[1], dv=grads[2])
    assert_close((out, *grads), packed_reference(q, k, v, g, lens, lens, True, None), half_dtype)


def _bad(device, what):
    """Inputs broken in one way each; the rest valid (q [1, 8, 4, 64], k/v [1, 8, 2, 64])."""
    q, k, v, _ = make(1, 8, 8, 4, 2, 64, 64, torch.float16, device)
    cu = torch.tensor([0, 8], dtype=torch.int32, device=device)
    call = {"q": q, "k": k, "v": v}
    if what == "head dims differ":
        call["k"] = torch.randn(1, 8, 2, 128, device=device).half()
    elif what == "heads not a multiple":
        call["k"] = call["v"] = torch.randn(1, 8, 3, 64, device=device).half()
    elif what == "fp32":
        call = {n: t.float() for n, t in call.items()}
    elif what == "mixed dtypes":
        call["v"] = v.bfloat16()
    elif what == "rank":
        call["q"] = q[0]
    elif what == "batch":
        call["q"] = torch.cat([q, q])
    elif what == "head dim 32":
        call = {n: t[..., :32] for n, t in call.items()}
    elif what == "kv lengths":
        call["v"] = v[:, :5]
    elif what == "window without causal":
        return lambda: attention(q, k, v, window=4)
    elif what == "negative window":
        return lambda: attention(q, k, v, causal=True, window=-1)
    elif what.startswith("cu_seqlens"):
        bad_cu = {"cu_seqlens int64": cu.long(), "cu_seqlens 2-D": cu[None],
                  "cu_seqlens lengths differ": torch.tensor([0, 4, 8], dtype=torch.int32, device=device)}[what]
        return lambda: attention_varlen(q[0], k[0], v[0], cu, bad_cu, 8, 8)
    elif what == "max_seqlen not an int":
        return lambda: attention_varlen(q[0], k[0], v[0], cu, cu, torch.tensor(8), 8)
    return lambda: attention(**call)


@pytest.mark.parametrize(("what", "match"), [
    ("head dims differ", "head dims of q and k differ"),
    ("heads not a multiple", r"q heads \(4\) must be a multiple of k/v heads \(3\)"),
    ("fp32", "bf16 or fp16"),
    ("mixed dtypes", "bf16 or fp16"),
    ("rank", "q must be 4-D"),
    ("batch", "batch sizes of q and k differ"),
    ("head dim 32", "unsupported q/k head dim 32"),
    ("kv lengths", "k and v disagree"),
    ("window without causal", "needs causal=True"),
    ("negative window", "non-negative"),
    ("cu_seqlens int64", "cu_seqlens_k must be a 1-D int32"),
    ("cu_seqlens 2-D", "cu_seqlens_k must be a 1-D int32"),
    ("cu_seqlens lengths differ", "same length"),
    ("max_seqlen not an int", "max_seqlen_q must be a non-negative int"),
])
def test_bad_input_gets_a_one_line_value_error(what, match, device):
    assert_one_line_error(_bad(device, what), match)


def assert_one_line_error(call, match: str) -> None:
    """call() raises a one-line ValueError from the attention op that matches `match`."""
    with pytest.raises(ValueError, match=match) as err:
        call()
    assert "\n" not in str(err.value) and str(err.value).startswith("attention: ")


# (config, the shared memory Triton 3.6 allocates for it on sm_90a): static compiles of the launches'
# specializations (tests/hopper_compile.py, with 16-divisible strides), and three that the H100 refused
# (OutOfResources, 2026-11-24).
FWD = BWD_Q = {"TMA": 0, "num_warps": 8}  # both stream k and v
BWD_KV = FWD | {"DQ_ATOMIC": 0}  # streams q and dO
TRITON_3_6_SHARED_MEMORY = [
    (FWD | {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 3, "HEAD_DIM": 128}, 131072),
    (FWD | {"BLOCK_M": 128, "BLOCK_N": 32, "num_stages": 3, "HEAD_DIM": 128}, 81920),
    (FWD | {"BLOCK_M": 16, "BLOCK_N": 128, "num_stages": 5, "HEAD_DIM": 128}, 270336),
    (FWD | {"BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 2, "HEAD_DIM": 256, "TMA": 1}, 295936),
    (BWD_KV | {"BLOCK_M": 32, "BLOCK_N": 128, "num_stages": 3, "HEAD_DIM": 128}, 115200),
    (BWD_Q | {"BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 1, "HEAD_DIM": 256}, 196608),
    (BWD_Q | {"BLOCK_M": 16, "BLOCK_N": 128, "num_stages": 5, "HEAD_DIM": 128}, 274432),
    # refused by the H100
    (BWD_KV | {"BLOCK_M": 128, "BLOCK_N": 16, "num_stages": 5, "HEAD_DIM": 128}, 278528),
    (BWD_KV | {"BLOCK_M": 128, "BLOCK_N": 16, "num_stages": 4, "HEAD_DIM": 128, "DQ_ATOMIC": 1}, 277504),
    (BWD_KV | {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 2, "HEAD_DIM": 256, "DQ_ATOMIC": 1, "TMA": 1}, 271360),
]


@pytest.mark.parametrize(("cfg", "allocated"), TRITON_3_6_SHARED_MEMORY)
def test_the_shared_memory_estimate_bounds_what_triton_allocates(cfg, allocated):
    """`fits` refuses a config by its shared memory: the estimate is never under Triton's allocation, so
    no config the GPU refuses is tried, and at most 1.6x it (one stage or kept tile too many), so few that
    run are refused."""
    assert allocated <= shared_memory_bytes(cfg) <= allocated * 1.6
    assert fits(cfg) == (allocated <= SHARED_MEMORY_BYTES)


def test_tuned_table_lies_in_the_tunable_space_and_fits():
    for d in (64, 128, 192, 256):
        for pass_ in (*PASSES, "fwd_fp8"):
            config_for(pass_, d, 128 if d == 192 else d)  # raises if a knob lies outside the space
    assert all(fits(cfg) for cfg in TUNED_TABLE.values())
    # 1-byte operands: an FP8 tile fits where the same 16-bit one would not.
    wide = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "HEAD_DIM": 128}
    assert fits(wide | {"ELEMENT_BYTES": 1}) and not fits(wide)
    # dQ added by the dK/dV pass: only in its buckets, and with query blocks wgmma can take (64 rows and up).
    assert config_for("bwd_kv", 128, 128).DQ_ATOMIC == 0 and "DQ_ATOMIC" not in TUNED_TABLE["bwd_q-d128"]
    atomic = TUNED_TABLE["bwd_kv-d128"] | {"DQ_ATOMIC": 1, "num_stages": 2}
    assert fits(atomic | {"BLOCK_M": 64}) and not fits(atomic | {"BLOCK_M": 32})
    assert buckets_for({"D": 192, "Dv": 128}) == {"fwd-d256", "bwd_kv-d256", "bwd_q-d256"}
    assert buckets_for({"D": 64}) == {"fwd-d64", "bwd_kv-d64", "bwd_q-d64"}
    assert buckets_for({"D": 128}, FP8_VARIANT) == {"fwd_fp8-d128", "bwd_kv-d128", "bwd_q-d128"}


def test_attention_shapes_presets_and_schema():
    """Packed shapes carry their mean length in Sq and Sk; causal and window default to 0 in the CSV; every
    preset loads with unique labels."""
    dims = {"B": 3, "Hq": 2, "Hkv": 1, "Sq": 3, "Sk": 3, "D": 64, "Dv": 64, "causal": 1}
    assert Shape(label="p", dims=dims, group_lens=(0, 1, 10)).group_lens == (0, 1, 10)
    with pytest.raises(ValidationError, match="Sk must be the mean of group_lens"):
        Shape(label="p", dims=dims | {"Sk": 4}, group_lens=(0, 1, 10))
    resolved = get_schema("attention").resolve_dims({k: v for k, v in dims.items() if k != "causal"}, "t")
    assert (resolved["causal"], resolved["window"]) == (0, 0)
    for preset in preset_names("attention"):
        labels = [s.label for s in load_shapes("attention", preset)]
        assert len(labels) == len(set(labels)) > 0, preset


def test_smoke_bench_passes_every_check():
    """The OpSpec end to end under the harness's full checks: packed (with the harness's extra hot and
    empty splits), windowed and MLA shapes of the smoke preset, then the unannounced probes (full,
    causal with a window, packed with an empty and a one-token sequence)."""
    shapes = [s for s in load_shapes("attention", "smoke") if "packed" in s.label or "window" in s.label
              or "mla" in s.label]
    run = run_bench(get_spec("attention"), shapes, shapes_source="smoke", repeats=1, warmup=0, probe_seed=3)
    assert run.all_pass, [(r.shape.label, r.snrs, r.error) for r in run.ours] + [run.probe_errors]
    assert len(run.ours) == 3
    kinds = [(p.dims["causal"], p.dims["window"] > 0, p.group_lens is not None) for p in run.probes]
    assert kinds == [(0, False, False), (1, True, False), (1, False, True)]
    assert {0, 1} <= set(run.probes[-1].group_lens)


# --- GPU ---------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("case", [
    (2, 1000, 1000, 8, 2, 128, 128, False, None),
    (2, 1000, 1000, 8, 2, 128, 128, True, None),
    (1, 777, 1500, 4, 4, 64, 64, True, None),
    (1, 2048, 2048, 8, 1, 64, 64, True, 128),
    (1, 513, 513, 4, 4, 256, 256, True, None),
    (1, 600, 600, 4, 4, 192, 128, True, None),
], ids=["gqa-d128", "gqa-causal-d128", "causal-q777-k1500", "window128-mqa", "d256", "mla"])
def test_bf16_on_gpu(case):
    B, Sq, Sk, Hq, Hkv, D, Dv, causal, window = case
    q, k, v, g = make(B, Sq, Sk, Hq, Hkv, D, Dv, torch.bfloat16, "cuda")
    got = autograd_run(q, k, v, g, causal=causal, window=window)
    assert_close(got, reference(q, k, v, g, causal, window), torch.bfloat16)


def test_causal_launches_put_heads_side_by_side_within_the_l2():
    """hopper_ws.heads_together: a head at a time without a causal mask; causal, as many heads as share the
    budget, one at least."""
    budget = hopper_ws.CAUSAL_SHARED_BYTES
    assert hopper_ws.heads_together(False, 1024, budget) == 1
    assert hopper_ws.heads_together(True, 4 * 2**20, budget) == budget // (4 * 2**20) > 1
    assert hopper_ws.heads_together(True, 2 * budget, budget) == 1
    assert hopper_ws.heads_together(True, 0, budget) == budget


def test_warp_specialized_knob(device):
    """WS, a knob of every pass's buckets (dK/dV's: the fused backward): `fits` keeps it to the head dims
    the Gluon kernels serve; where they cannot run (the interpreter, packed problems, a window, Sq > Sk
    causal, MLA) the pass is the Triton one."""
    assert {config_for(p, 128, 128).WS for p in ("fwd", "bwd_kv", "bwd_q")} <= {0, 1}
    assert all(fits(dict(TUNED_TABLE[f"fwd-d{d}"], WS=1)) for d in (64, 128, 256))
    assert not fits(dict(TUNED_TABLE["fwd-d128"], WS=1, HEAD_DIM=192))
    assert fits(dict(TUNED_TABLE["bwd_kv-d128"], WS=1))
    assert fits(dict(TUNED_TABLE["bwd_kv-d256"], WS=1))  # d256: the warpgroups split the head dim
    # The forward's keys a stage and ring depth are table knobs (WS_BLOCK_N, WS_STAGES) of the forward buckets
    # alone, over the widths the kernel has layouts for; every table entry's ring fits, and `fits` refuses one
    # that does not (two stages of 128 keys at d256: 288 KB).
    assert TUNABLE_SPACE["WS_BLOCK_N"] == hopper_ws.BLOCK_NS
    for pass_ in ("fwd", "fwd_fp8"):
        for d in hopper_ws.HEAD_DIMS:
            cfg = config_for(pass_, d, d)
            element = TUNED_TABLE[f"{pass_}-d{d}"].get("ELEMENT_BYTES", 2)
            assert hopper_ws.shared_bytes(d, cfg.WS_BLOCK_N, cfg.WS_STAGES, element) <= SHARED_MEMORY_BYTES
    assert {config_for(p, 128, 128).WS_STAGES for p in ("bwd_kv", "bwd_q")} == {0}
    assert not fits(dict(TUNED_TABLE["fwd-d256"], WS_BLOCK_N=128, WS_STAGES=2))
    q, k, v, _ = make(1, 70, 70, 2, 2, 128, 128, torch.float16, device)
    ring = (config_for("fwd", 128, 128).WS_BLOCK_N, config_for("fwd", 128, 128).WS_STAGES)
    runs_here = device == "cuda" and torch.cuda.get_device_capability() == (9, 0)
    assert hopper_ws.supported(q, k, v, True, None, False, *ring) == runs_here
    assert not hopper_ws.supported(q, k, v, True, 16, False, *ring)  # a window
    assert not hopper_ws.supported(q, k[:, :50], v[:, :50], True, None, False, *ring)  # causal, Sq > Sk
    assert not hopper_ws.supported(q, k, v, False, None, True, *ring)  # packed
    assert not hopper_ws.supported(q, k, v, False, None, False, 32, 2)  # a key block it has no layout for
    assert hopper_ws.supports_dq(q, k, v, q, True, None, False) == runs_here
    q256 = torch.zeros(1, 64, 2, 256, device=device, dtype=torch.float16)
    assert not hopper_ws.supports_dq(q256, q256, q256, q256, False, None, False)  # dQ at d256: the Triton pass
    assert hopper_ws.supports_backward(q, k, v, q, True, None, False) == runs_here
    assert hopper_ws.supports_backward(q256, q256, q256, q256, False, None, False) == runs_here
    assert not hopper_ws.supports_backward(q, k, v, q, True, 16, False)  # a window
    assert not hopper_ws.supported(q, k, v, False, None, False, 128, 4)  # 289 KB of shared memory


def reference_lse(q, k, causal):
    """The natural-log LSE [B, Hq, Sq] in float64 (flash-attn's masks, as `reference`)."""
    (_, Sq, Hq, D), (Sk, Hkv) = q.shape, k.shape[1:3]
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double().repeat_interleave(Hq // Hkv, dim=2)) / math.sqrt(D)
    if causal:
        seen = torch.arange(Sk, device=q.device)[None, :] <= torch.arange(Sq, device=q.device)[:, None] + Sk - Sq
        s = s.masked_fill(~seen, -math.inf)
    return torch.logsumexp(s, dim=-1)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [
    (2, 1000, 1000, 8, 2, 128, False, 128, 2, torch.bfloat16),
    (2, 1000, 1000, 24, 6, 128, True, 128, 2, torch.bfloat16),
    (1, 777, 1500, 4, 4, 128, True, 64, 3, torch.float16),
    (2, 300, 300, 4, 1, 64, True, 128, 3, torch.bfloat16),
    (1, 64, 2000, 2, 2, 64, False, 64, 4, torch.float16),
    (1, 300, 420, 4, 2, 256, True, 64, 2, torch.bfloat16),
], ids=["gqa-d128", "gqa-causal-d128", "causal-q777-k1500-n64-fp16", "mqa-causal-d64", "q64-k2000-d64-fp16",
        "causal-d256"])
def test_warp_specialized_forward_on_gpu(case):
    """hopper_ws's forward (whatever the tuned table picks) against float64, out and LSE, into poisoned
    buffers: partial query and key blocks, GQA, causal with Sq < Sk, both key block widths."""
    B, Sq, Sk, Hq, Hkv, D, causal, block_n, stages, dtype = case
    q, k, v, g = make(B, Sq, Sk, Hq, Hkv, D, D, dtype, "cuda")
    assert hopper_ws.supported(q, k, v, causal, None, False, block_n, stages)
    out = torch.full_like(q, math.nan)
    lse = torch.full((B, Hq, Sq), math.nan, device="cuda")
    hopper_ws.forward_ws(q, k, v, out, lse, causal, kernel_module.LOG2E / math.sqrt(D), block_n, stages)
    assert snr_db(out, reference(q, k, v, g, causal)[0]) >= snr_threshold(dtype_name(dtype))
    want = reference_lse(q, k, causal)
    assert torch.isfinite(lse).all() and (lse.double() - want).abs().max() < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("lazy", [True, False], ids=["lazy", "every-block"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_warp_specialized_forward_rescales_exactly_on_gpu(head_dim, causal, lazy):
    """The forward's lazy rescale (hopper_ws._online_softmax, the tuned table's LAZY knob) keeps the output and
    the LSE exact: keys scaled up along the sequence (x1 to x12) raise each row's max by ~40-60 in log2 units over
    1500 keys, so later blocks move it past the threshold while earlier ones leave P far above 1; against float64,
    into poisoned buffers, beside the output rescaled after every block."""
    q, k, v, _ = make(2, 700, 1500, 4, 2, head_dim, head_dim, torch.bfloat16, "cuda", seed=3)
    k = (k.float() * torch.linspace(1.0, 12.0, 1500, device="cuda")[None, :, None, None]).to(torch.bfloat16)
    out = torch.full_like(q, math.nan)
    lse = torch.full((2, 4, 700), math.nan, device="cuda")
    cfg = config_for("fwd", head_dim, head_dim)
    hopper_ws.forward_ws(q, k, v, out, lse, causal, kernel_module.LOG2E / math.sqrt(head_dim), cfg.WS_BLOCK_N,
                         cfg.WS_STAGES, lazy=lazy)
    assert snr_db(out, reference(q, k, v, torch.zeros_like(q), causal)[0]) >= snr_threshold("bf16")
    assert torch.isfinite(lse).all() and (lse.double() - reference_lse(q, k, causal)).abs().max() < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_warp_specialized_forward_walks_several_tiles_a_cta_on_gpu(head_dim):
    """The non-causal forward's persistent grid (one CTA an SM, hopper_ws._softmax_partition): with 288 tiles, a
    CTA walks two or three, partial query and key blocks among them, GQA; the outputs and LSE equal a CTA a tile's
    bit for bit, into poisoned buffers, and float64's."""
    q, k, v, _ = make(3, 1000, 1300, 12, 4, head_dim, head_dim, torch.bfloat16, "cuda", seed=5)
    scale = kernel_module.LOG2E / math.sqrt(head_dim)
    cfg = config_for("fwd", head_dim, head_dim)
    found = []
    for persistent in (True, False):
        out = torch.full_like(q, math.nan)
        lse = torch.full((3, 12, 1000), math.nan, device="cuda")
        hopper_ws.forward_ws(q, k, v, out, lse, False, scale, cfg.WS_BLOCK_N, cfg.WS_STAGES, persistent=persistent)
        found.append((out, lse))
    (out, lse), (grid_out, grid_lse) = found
    assert torch.equal(out, grid_out) and torch.equal(lse, grid_lse)
    assert snr_db(out, reference(q, k, v, torch.zeros_like(q), False)[0]) >= snr_threshold("bf16")
    assert (lse.double() - reference_lse(q, k, False)).abs().max() < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True], ids=["dq-pass", "fused"])
@pytest.mark.parametrize("case", [
    (2, 1000, 1000, 8, 2, 128, False, torch.bfloat16),
    (2, 1000, 1000, 8, 2, 128, True, torch.bfloat16),
    (1, 777, 1500, 4, 4, 128, True, torch.float16),
    (2, 300, 300, 4, 1, 64, True, torch.bfloat16),
    (1, 64, 2000, 2, 2, 64, False, torch.float16),
    (3, 130, 130, 2, 2, 128, False, torch.bfloat16),
    (2, 300, 420, 4, 2, 256, True, torch.bfloat16),
    (1, 200, 200, 2, 2, 256, False, torch.float16),
    (1, 4096, 4096, 2, 1, 256, True, torch.bfloat16),
], ids=["gqa-d128", "gqa-causal-d128", "causal-q777-k1500-fp16", "mqa-causal-d64", "q64-k2000-d64-fp16",
        "b3-s130-d128", "gqa-causal-d256", "d256-fp16", "mqa-causal-s4k-d256"])
def test_warp_specialized_backward_on_gpu(case, fused):
    """hopper_ws's dQ pass, or its fused backward (dQ, dK and dV), against float64 into poisoned buffers, from
    the float64 LSE and delta: partial query and key blocks (their rows reading the next sequence's), GQA and
    MQA (dK, dV summed over the group), causal with Sq < Sk; a CTA walking 128 query blocks (its warpgroups,
    producer and reducer running far enough apart to show a barrier's phases aliasing)."""
    B, Sq, Sk, Hq, Hkv, D, causal, dtype = case
    q, k, v, g = make(B, Sq, Sk, Hq, Hkv, D, D, dtype, "cuda")
    out, *want = reference(q, k, v, g, causal)
    lse = reference_lse(q, k, causal).float()
    delta = (out * g.double()).sum(-1).transpose(1, 2).float().contiguous()
    got = [torch.full_like(t, math.nan) for t in (q, k, v)]
    scales = (kernel_module.LOG2E / math.sqrt(D), 1 / math.sqrt(D))
    if fused:
        assert hopper_ws.supports_backward(q, k, v, g, causal, None, False)
        hopper_ws.backward_ws(q, k, v, g, lse, delta, *got, causal, *scales)
    elif D not in hopper_ws.DQ_HEAD_DIMS:
        pytest.skip("the dQ pass serves d64 and d128")
    else:
        assert hopper_ws.supports_dq(q, k, v, g, causal, None, False)
        hopper_ws.backward_dq_ws(q, k, v, g, lse, delta, got[0], causal, *scales)
        got, want = got[:1], want[:1]
    for name, have, ref in zip(("dq", "dk", "dv")[:len(got)], got, want, strict=True):
        assert snr_db(have, ref) >= snr_threshold(dtype_name(dtype)), (name, snr_db(have, ref))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_warp_specialized_backward_walks_several_tiles_a_cta_on_gpu(head_dim, causal, monkeypatch):
    """The fused backward's persistent grid, on 5 CTAs so that each walks several tiles (the barriers' phases
    carried from tile to tile, the next tile's K and V loaded while the last one's dK and dV are stored; causal,
    the tiles handed out by the counter and passed to the other partitions, twice, so that the counter starts
    from zero each call): partial blocks, GQA; dQ, dK and dV against float64, into poisoned buffers, and dK and
    dV equal to a CTA a tile's bit for bit."""
    monkeypatch.setattr(hopper_ws, "persistent_programs", lambda device, tiles: min(5, tiles))
    # causal at every head dim, not only where backward_ws takes the persistent grid causal by default
    monkeypatch.setattr(hopper_ws, "CAUSAL_PERSISTENT_HEAD_DIMS", hopper_ws.BWD_HEAD_DIMS)
    q, k, v, g = make(2, 700, 900, 4, 2, head_dim, head_dim, torch.bfloat16, "cuda", seed=7)
    out, *want = reference(q, k, v, g, causal)
    lse = reference_lse(q, k, causal).float()
    delta = (out * g.double()).sum(-1).transpose(1, 2).float().contiguous()
    scales = (kernel_module.LOG2E / math.sqrt(head_dim), 1 / math.sqrt(head_dim))
    found = []
    for persistent in (True, True, False):
        got = [torch.full_like(t, math.nan) for t in (q, k, v)]
        hopper_ws.backward_ws(q, k, v, g, lse, delta, *got, causal, *scales, persistent=persistent)
        found.append(got)
    assert torch.equal(found[0][1], found[1][1]) and torch.equal(found[0][2], found[1][2])
    found = found[1:]
    (dq, dk, dv), (_, grid_dk, grid_dv) = found
    assert torch.equal(dk, grid_dk) and torch.equal(dv, grid_dv)
    for name, have, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), want, strict=True):
        assert snr_db(have, ref) >= snr_threshold("bf16"), (name, snr_db(have, ref))


@pytest.mark.gpu
def test_warp_specialized_causal_heads_side_by_side_on_gpu(monkeypatch):
    """Causal launches run their heads in groups side by side (hopper_ws._heads_side_by_side): with groups of 3
    (8 q heads: 3, 3, 2; 4 kv heads: 3, 1), every tile of the forward, the dQ pass and the fused backward is
    computed once, into poisoned buffers, against float64."""
    monkeypatch.setattr(hopper_ws, "heads_together", lambda causal, *_bytes: 3 if causal else 1)
    q, k, v, g = make(2, 300, 300, 4, 2, 128, 128, torch.bfloat16, "cuda")
    scales = (kernel_module.LOG2E / math.sqrt(128), 1 / math.sqrt(128))
    out = torch.full_like(q, math.nan)
    lse = torch.full((2, 4, 300), math.nan, device="cuda")
    cfg = config_for("fwd", 128, 128)
    hopper_ws.forward_ws(q, k, v, out, lse, True, scales[0], cfg.WS_BLOCK_N, cfg.WS_STAGES)
    want_out, *want = reference(q, k, v, g, True)
    assert snr_db(out, want_out) >= snr_threshold("bf16")
    lse = reference_lse(q, k, True).float()
    delta = (want_out * g.double()).sum(-1).transpose(1, 2).float().contiguous()
    got = [torch.full_like(t, math.nan) for t in (q, k, v)]
    hopper_ws.backward_ws(q, k, v, g, lse, delta, *got, True, *scales)
    dq = torch.full_like(q, math.nan)
    hopper_ws.backward_dq_ws(q, k, v, g, lse, delta, dq, True, *scales)
    for name, have, ref in zip(("dq", "dk", "dv", "dq pass"), (*got, dq), (*want, want[0]), strict=True):
        assert snr_db(have, ref) >= snr_threshold("bf16"), (name, snr_db(have, ref))


@pytest.mark.gpu
def test_varlen_bf16_on_gpu():
    lens = (0, 1, 1000, 37, 2500)
    q, k, v, g, cu, _ = packed(lens, lens, 8, 2, 128, 128, torch.bfloat16, "cuda")
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    out.backward(g)
    assert_close((out, q.grad, k.grad, v.grad), packed_reference(q, k, v, g, lens, lens, True, None), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize(("packed_step", "deterministic", "head_dim"),
                         [(False, False, 128), (False, True, 128), (True, False, 128), (False, False, 64),
                          (False, False, 256)],
                         ids=["dense", "dense-deterministic", "packed", "dense-d64", "dense-d256"])
def test_causal_gqa_step_under_cuda_graph_replay_equals_eager(packed_step, deterministic, head_dim):
    """fwd + bwd captured once, replayed on new values: what eager mode computes, and right. The packed step
    reads cu_seqlens on the device only (a host read would fail the capture). Where dQ is summed across key
    blocks by fp32 reductions (the fused backward on Hopper) its last bits follow the order they land in:
    equal only to rounding there, bit for bit with `deterministic`. At d64 and d256 the fused backward takes
    its causal tiles from a counter in the buffer the call zeroes (a memset node in the graph): each replay
    starts it again."""
    lens = (300, 0, 1, 700)
    if packed_step:
        q, k, v, g, cu, _ = packed(lens, lens, 8, 2, 128, 128, torch.bfloat16, "cuda")
    else:
        q, k, v, g = make(2, 513, 513, 8, 2, head_dim, head_dim, torch.bfloat16, "cuda")
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))

    def step():
        q.grad = k.grad = v.grad = None
        if packed_step:
            out = attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True)
        else:
            out = attention(q, k, v, causal=True, deterministic=deterministic)
        out.backward(g)
        return out, q.grad, k.grad, v.grad

    replayed, eager = replay_and_eager(step, (q, k, v))
    want = packed_reference(q, k, v, g, lens, lens, True, None) if packed_step else reference(q, k, v, g, True)
    fused = not (packed_step or deterministic) and hopper_ws.supports_backward(q, k, v, g, True, None, False)
    for name, got, eager_t in zip(("out", "dq", "dk", "dv"), replayed, eager, strict=True):
        if name == "dq" and fused:
            assert snr_db(got, eager_t.double()) >= 40.0
        else:
            assert torch.equal(got, eager_t), name
    assert_close(replayed, want, torch.bfloat16)
