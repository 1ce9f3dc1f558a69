"""attention's FP8 forward (E4M3 q, k, v with one scale per sequence and head): against float64 on the
unquantized inputs (the `e4m3-attention` floor of the rules) and, tighter, on the quantized ones (the
kernel's own error: the E4M3 probabilities); dense, GQA, causal, window, every head dim, rows that see no
key, packed sequences with empty and one-token ones; quantize_heads; the training step (FP8 forward, bf16
backward); bad input; the OpSpec variant; its compilation for Hopper (no GPU needed); on a GPU, bf16 outputs and
CUDA-graph replay."""

import math

import pytest
import torch
import yaml

from agent.manifest import Manifest
from harness.files import REPO_ROOT
from harness.quick_test_bench import run_bench
from harness.registry import get_spec
from harness.schema import get_schema
from harness.shapes import Shape, load_shapes
from harness.snr import snr_db, snr_threshold
from kernels.attention import (
    HeadScales,
    attention,
    attention_backward,
    attention_forward,
    attention_varlen,
    dense_shape,
    hopper_ws,
    packed_shape,
)
from kernels.attention import kernel as kernel_module
from kernels.attention import quantize_heads as quantize
from kernels.attention.kernel import LOG2E, key_position, natural_key_order
from kernels.attention.tuning import FP8_VARIANT, buckets_for, config_for
from kernels.common.device import SHARED_MEMORY_BYTES
from kernels.common.fp8 import AMAX_EPS, FP8_MAX
from tests.compiled import BOTH_TRITONS, compiled
from tests.graph_replay import replay_and_eager
from tests.hopper_compile import FP8_WS_LAUNCHES
from tests.test_attention import (
    DENSE_CASES,
    assert_one_line_error,
    make,
    packed,
    packed_reference,
    reference,
    reference_lse,
    tma_everywhere,
)

E4M3_MAX = FP8_MAX[torch.float8_e4m3fn]
FLOOR = snr_threshold("e4m3-attention")
# The kernel against float64 attention on its own quantized inputs: what is left is the E4M3 rounding of
# the probabilities (33-36 dB measured).
KERNEL_FLOOR = 30.0


def dequantized(x8, scale, cu=None):
    """x8 * scale in float64, the scale of each row's sequence and head."""
    if cu is None:
        return x8.double() * scale.double()[:, None, :, None]
    seq = torch.searchsorted(cu[1:], torch.arange(x8.shape[0], device=x8.device, dtype=cu.dtype), right=True)
    return x8.double() * scale.double()[seq][:, :, None]


def dequantized_qkv(q8, k8, v8, scales):
    """Dense q, k and v as the FP8 forward reads them, in float64 (v's keys back in order)."""
    return dequantized(q8, scales.q), dequantized(k8, scales.k), dequantized(natural_key_order(v8), scales.v)


def fp8_inputs(q, k, v, cu_q=None, cu_k=None):
    (q8, qs), (k8, ks) = quantize(q, cu_q), quantize(k, cu_k)
    v8, vs = quantize(v, cu_k, sequence_major=True)
    return (q8, k8, v8), HeadScales(qs, ks, vs)


FP8_CASES = {name: DENSE_CASES[name] for name in (
    "mha-d64-s77", "gqa-causal-d64-s150", "mqa-causal-d128-q45-k80", "causal-q100-k37-empty-rows",
    "noncausal-q33-k150-d128", "causal-d256-s50", "mla-causal-d192-v128-s61", "window16-gqa-s150")}


@pytest.mark.parametrize("case", FP8_CASES.values(), ids=FP8_CASES.keys())
def test_fp8_forward_matches_float64(case, device, half_dtype):
    B, Sq, Sk, Hq, Hkv, D, Dv, causal, window = case
    q, k, v, g = make(B, Sq, Sk, Hq, Hkv, D, Dv, half_dtype, device)
    (q8, k8, v8), scales = fp8_inputs(q, k, v)
    out = torch.full((B, Sq, Hq, Dv), math.nan, device=device, dtype=half_dtype)
    lse = torch.full((B, Hq, Sq), math.nan, device=device)
    attention_forward(q8, k8, v8, dense_shape(q8, k8, v8), causal, window=window, out=out, lse=lse, scales=scales)
    want = reference(q, k, v, g, causal, window)[0]
    assert snr_db(out, want) >= FLOOR, snr_db(out, want)
    on_quantized = reference(*dequantized_qkv(q8, k8, v8, scales), g, causal, window)[0]
    assert snr_db(out, on_quantized) >= KERNEL_FLOOR, snr_db(out, on_quantized)
    # The LSE the backward reads: +inf on the rows that see no key, finite elsewhere, and right.
    blind = want.abs().amax(dim=(2, 3)) == 0  # [B, Sq]
    assert torch.isinf(lse.transpose(1, 2)[blind]).all() and torch.isfinite(lse.transpose(1, 2)[~blind]).all()


def test_fp8_forward_through_tensor_descriptors(device, half_dtype, monkeypatch):
    """With the tuned table's TMA knob on, the FP8 forward reads q and k as [rows, heads x head dim] and
    its sequence-major v as [batch x heads x head dim, keys] boxes, transposed in the kernel: causal GQA, MQA,
    unequal head dims, d256, and a key count off 16 bytes (quantize_heads pads v's rows to 16 bytes, as TMA
    needs). Packed v (sequences start at any key) stays on pointers."""
    taken = tma_everywhere(monkeypatch)
    for B, Sq, Sk, Hq, Hkv, D, Dv, causal in [(2, 150, 144, 4, 2, 64, 64, True), (1, 48, 80, 4, 1, 128, 128, False),
                                              (1, 33, 64, 2, 2, 128, 64, False), (1, 50, 64, 2, 1, 256, 256, True),
                                              (1, 40, 37, 2, 1, 64, 64, True)]:
        q, k, v, g = make(B, Sq, Sk, Hq, Hkv, D, Dv, half_dtype, device)
        (q8, k8, v8), scales = fp8_inputs(q, k, v)
        out, _ = attention_forward(q8, k8, v8, dense_shape(q8, k8, v8), causal, scales=scales)
        on_quantized = reference(*dequantized_qkv(q8, k8, v8, scales), g, causal)[0]
        assert snr_db(out, on_quantized) >= KERNEL_FLOOR, (Sk, D, snr_db(out, on_quantized))
    q, k, v, g, cu, _ = packed((0, 1, 70, 29, 60), (0, 1, 70, 29, 60), 4, 2, 64, 64, half_dtype, device)
    (q8, k8, v8), scales = fp8_inputs(q, k, v, cu, cu)
    attention_forward(q8, k8, v8, packed_shape(q8, k8, v8, cu, cu, 70, 70), causal=True, scales=scales)
    assert taken == [True, True, True, True, True, False]


def test_fp8_forward_of_packed_sequences(device, half_dtype):
    lens_q, lens_k = (0, 1, 70, 29, 130), (0, 1, 70, 29, 130)
    q, k, v, g, cu_q, cu_k = packed(lens_q, lens_k, 4, 2, 64, 64, half_dtype, device)
    (q8, k8, v8), scales = fp8_inputs(q, k, v, cu_q, cu_k)
    shape = packed_shape(q8, k8, v8, cu_q, cu_k, max(lens_q) + 9, max(lens_k))
    out = torch.full_like(g, math.nan)
    attention_forward(q8, k8, v8, shape, causal=True, out=out, scales=scales)
    want = packed_reference(q, k, v, g, lens_q, lens_k, True, None)[0]
    assert snr_db(out, want) >= FLOOR, snr_db(out, want)
    on_quantized = packed_reference(dequantized(q8, scales.q, cu_q), dequantized(k8, scales.k, cu_k),
                                    dequantized(v8, scales.v, cu_k), g, lens_q, lens_k, True, None)[0]
    assert snr_db(out, on_quantized) >= KERNEL_FLOOR, snr_db(out, on_quantized)


def test_quantize_heads_scales_each_sequence_and_head(device, half_dtype):
    q, _, v, _ = make(2, 37, 37, 3, 3, 64, 64, half_dtype, device)
    q8, scale = quantize(q)
    assert q8.dtype == torch.float8_e4m3fn and scale.shape == (2, 3) and scale.is_contiguous()
    torch.testing.assert_close(scale, q.float().abs().amax(dim=(1, 3)) / E4M3_MAX)
    assert (q8.float().abs().amax(dim=(1, 3)) == E4M3_MAX).all()  # each head's largest value maps to the max
    # Round to nearest: within half an E4M3 step (3 mantissa bits) of the value.
    err = (dequantized(q8, scale) - q.double()).abs()
    assert (err <= q.double().abs() * 2.0**-4 + scale.double().amax() * 2.0**-9).all()
    # Sequence-major (dense): each 32-key block's keys in the E4M3 operand's order, rows of whole blocks, zeros
    # past the keys (37 keys: rows of 64, positions 37-63 hold keys 36 (at 40) and zeros).
    v8, v_scale = quantize(v, sequence_major=True)
    assert v8.shape == v.shape and v8.stride(1) == 1 and v8.stride(3) == 64
    assert torch.equal(natural_key_order(v8).float(), quantize(v)[0].float()) and torch.equal(v_scale, quantize(v)[1])
    assert sorted(key_position(key) for key in range(32)) == list(range(32)) and key_position(8) == 2
    rows = v8.as_strided((2, 3, 64, 64), (v8.stride(0), v8.stride(2), 64, 1))
    assert torch.equal(rows[..., 32 + key_position(4)].float(), quantize(v)[0][:, 36].float())
    filled = 32 + torch.tensor([key_position(key) for key in range(5)])
    gaps = torch.ones(64, dtype=torch.bool)
    gaps[:32] = gaps[filled] = False
    assert (rows[..., gaps.to(device)].float() == 0).all()
    # Packed: one scale per sequence; an empty sequence gets the floor's.
    lens = (0, 5, 40)
    qp, _, vp, _, cu, _ = packed(lens, lens, 2, 2, 64, 64, half_dtype, device)
    qp8, scale = quantize(qp, cu)
    assert scale.shape == (3, 2)
    assert torch.equal(scale[0], torch.full_like(scale[0], AMAX_EPS / E4M3_MAX))
    for b, (start, n) in enumerate(((0, 5), (5, 40)), start=1):
        torch.testing.assert_close(scale[b], qp[start:start + n].float().abs().amax(dim=(0, 2)) / E4M3_MAX)
        assert (qp8[start:start + n].float().abs().amax(dim=(0, 2)) == E4M3_MAX).all()
    vp8, _ = quantize(vp, cu, sequence_major=True)  # packed: the keys in order (sequences start at any key)
    assert vp8.stride(0) == 1 and torch.equal(vp8.float(), quantize(vp, cu)[0].float())


def test_quantize_heads_writes_the_scale_of_every_sequence(device, half_dtype):
    """The cast kernel writes the scales, a row block of sequences at a time: 70 packed sequences (more than
    a block), empty ones among them, each head's scale its own amax over 448, the floor's where empty."""
    g = torch.Generator().manual_seed(7)
    lens = torch.randint(0, 4, (70,), generator=g)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32)
    x = (torch.randn(int(cu[-1]), 2, 64, generator=g) * torch.rand(int(cu[-1]), 2, 1, generator=g) * 8)
    x = x.to(device=device, dtype=half_dtype)
    scale = torch.full((70, 2), math.nan, device=device)  # poisoned: every entry must be written
    amax = torch.zeros(70, 2, device=device)
    _, got = kernel_module.quantize_per_head(x, cu.to(device), amax=amax, scale=scale)
    assert got.data_ptr() == scale.data_ptr()
    for b in range(70):
        rows = x[int(cu[b]):int(cu[b + 1])].float()
        want = rows.abs().amax(dim=(0, 2)) / E4M3_MAX if len(rows) else torch.full((2,), AMAX_EPS / E4M3_MAX)
        torch.testing.assert_close(scale[b].cpu(), want.cpu(), rtol=2**-23, atol=0)


@pytest.mark.parametrize("packed_step", [False, True], ids=["dense", "packed"])
def test_training_step_with_the_fp8_forward(packed_step, device, half_dtype):
    """fp8_forward: the FP8 forward, then the high-precision backward from its out and LSE on the saved
    inputs: the gradients are what attention_backward gives for that out and LSE, bit for bit."""
    lens = (0, 1, 70, 29)
    if packed_step:
        q, k, v, g, cu, _ = packed(lens, lens, 4, 2, 64, 64, half_dtype, device)
        shape = packed_shape(q, k, v, cu, cu, 70, 70)
        want = packed_reference(q, k, v, g, lens, lens, True, None)
    else:
        q, k, v, g = make(2, 90, 90, 4, 2, 64, 64, half_dtype, device)
        shape = dense_shape(q, k, v)
        cu = None
        want = reference(q, k, v, g, True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if packed_step:
        out = attention_varlen(*leaves, cu, cu, 70, 70, causal=True, fp8_forward=True)
    else:
        out = attention(*leaves, causal=True, fp8_forward=True)
    out.backward(g)
    for name, got, ref in zip(("out", "dq", "dk", "dv"), (out, *(t.grad for t in leaves)), want, strict=True):
        assert snr_db(got, ref) >= FLOOR, (name, snr_db(got, ref))
    inputs8, scales = fp8_inputs(q, k, v, cu, cu)
    out8, lse8 = attention_forward(*inputs8, shape, causal=True, out=torch.empty_like(g), scales=scales)
    assert torch.equal(out8, out.detach())
    grads = attention_backward(g, q, k, v, out8, lse8, shape, causal=True)
    assert all(torch.equal(a, t.grad) for a, t in zip(grads, leaves, strict=True))


def _bad(device, what):
    q, k, v, _ = make(1, 8, 8, 4, 2, 64, 64, torch.float16, device)
    (q8, k8, v8), scales = fp8_inputs(q, k, v)
    shape = dense_shape(q8, k8, v8)
    if what == "scales with 16-bit inputs":
        return lambda: attention_forward(q, k, v, dense_shape(q, k, v), scales=scales)
    if what == "fp8 without scales":
        return lambda: attention_forward(q8, k8, v8, shape)
    if what == "fp8 into autograd":
        return lambda: attention(q8, k8, v8)
    if what == "scale shape":
        return lambda: attention_forward(q8, k8, v8, shape, scales=HeadScales(scales.q, scales.q, scales.v))
    if what == "strided scale":
        strided = torch.empty(1, 4, device=device)[:, ::2]
        return lambda: attention_forward(q8, k8, v8, shape, scales=HeadScales(scales.q, strided, scales.v))
    if what == "quantize fp32":
        return lambda: quantize(q.float())
    if what == "quantize packed without 3 dims":
        return lambda: quantize(q, torch.tensor([0, 8], dtype=torch.int32, device=device))
    if what == "quantize int64 cu_seqlens":
        return lambda: quantize(q[0], torch.tensor([0, 8], device=device))
    if what == "fp8 backward":
        return lambda: attention_backward(q, q8, k8, v8, q, torch.zeros(1, 4, 8, device=device), shape)
    raise AssertionError(what)


@pytest.mark.parametrize(("what", "match"), [
    ("scales with 16-bit inputs", "scales go with float8_e4m3fn"),
    ("fp8 without scales", "attention_forward without scales takes bf16 or fp16"),
    ("fp8 into autograd", "attention takes bf16 or fp16"),
    ("scale shape", r"scales.k must be \[1, 2\]"),
    ("strided scale", "scales.k must be contiguous"),
    ("fp8 backward", "attention_backward takes bf16 or fp16"),
    ("quantize fp32", r"quantize_heads: x must be a 4-D bf16/fp16 tensor \[B, S, H, D\], got torch.float32"),
    ("quantize packed without 3 dims", "quantize_heads: x must be a 3-D"),
    ("quantize int64 cu_seqlens", "cu_seqlens must be a 1-D int32"),
])
def test_bad_fp8_input_gets_a_one_line_value_error(what, match, device):
    assert_one_line_error(_bad(device, what), match)


def test_the_fp8_variant_of_the_opspec_passes_every_check():
    """`--variant e4m3-forward` end to end under the full checks (packed and MLA shapes of the smoke preset,
    then the unannounced probes), with our bf16 forward as a baseline."""
    shapes = [s for s in load_shapes("attention", "smoke") if "packed" in s.label or "mla" in s.label]
    run = run_bench(get_spec("attention"), shapes, shapes_source="smoke", repeats=1, warmup=0, probe_seed=3,
                    variant=FP8_VARIANT)
    assert run.all_pass, [(r.shape.label, r.snrs, r.error) for r in run.ours] + [run.probe_errors]
    assert all(FLOOR <= r.snrs["out"] < snr_threshold("bf16") for r in run.ours)


# --- GPU ---------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("case", [
    (2, 1000, 1000, 8, 2, 128, 128, False, None),
    (2, 1000, 1000, 8, 2, 128, 128, True, None),
    (1, 2048, 2048, 8, 1, 64, 64, True, 128),
    (1, 513, 513, 4, 4, 256, 256, True, None),
    (1, 600, 600, 4, 4, 192, 128, False, None),
], ids=["gqa-d128", "gqa-causal-d128", "window128-mqa-d64", "d256", "mla"])
def test_fp8_forward_on_gpu(case):
    B, Sq, Sk, Hq, Hkv, D, Dv, causal, window = case
    q, k, v, g = make(B, Sq, Sk, Hq, Hkv, D, Dv, torch.bfloat16, "cuda")
    (q8, k8, v8), scales = fp8_inputs(q, k, v)
    out = torch.full((B, Sq, Hq, Dv), math.nan, device="cuda", dtype=torch.bfloat16)
    attention_forward(q8, k8, v8, dense_shape(q8, k8, v8), causal, window=window, out=out, scales=scales)
    assert snr_db(out, reference(q, k, v, g, causal, window)[0]) >= FLOOR
    on_quantized = reference(*dequantized_qkv(q8, k8, v8, scales), g, causal, window)[0]
    assert snr_db(out, on_quantized) >= KERNEL_FLOOR


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", [
    (2, 1000, 1000, 8, 2, 128), (1, 777, 1500, 4, 4, 64), (1, 513, 601, 4, 2, 256),
], ids=["gqa-d128", "q777-k1500-d64", "gqa-q513-k601-d256"])
def test_warp_specialized_fp8_forward_on_gpu(case, causal):
    """hopper_ws's FP8 forward at every head dim it serves, with the tuned table's key block and stages, lazy
    rescale and not, into poisoned buffers, key counts that no key block divides (v's sequence-major rows padded
    with zeros to whole 32-key blocks): against float64 on the unquantized inputs and on the quantized ones, and
    its LSE (the P shift taken out) against float64's."""
    B, Sq, Sk, Hq, Hkv, D = case
    q, k, v, g = make(B, Sq, Sk, Hq, Hkv, D, D, torch.bfloat16, "cuda")
    (q8, k8, v8), scales = fp8_inputs(q, k, v)
    cfg = config_for("fwd_fp8", D, D)
    assert hopper_ws.supported(q8, k8, v8, causal, None, False, cfg.WS_BLOCK_N, cfg.WS_STAGES)
    want = reference(q, k, v, g, causal)[0]
    on_quantized = reference(*dequantized_qkv(q8, k8, v8, scales), g, causal)[0]
    want_lse = reference_lse(dequantized(q8, scales.q), dequantized(k8, scales.k), causal)
    for lazy in (True, False):
        out = torch.full_like(q, math.nan)
        lse = torch.full((B, Hq, Sq), math.nan, device="cuda")
        hopper_ws.forward_ws(q8, k8, v8, out, lse, causal, LOG2E / math.sqrt(D), cfg.WS_BLOCK_N, cfg.WS_STAGES,
                             lazy=lazy, scales=(scales.q, scales.k, scales.v))
        assert snr_db(out, want) >= FLOOR and snr_db(out, on_quantized) >= KERNEL_FLOOR, lazy
        assert torch.isfinite(lse).all() and (lse.double() - want_lse).abs().max() < 1e-3, lazy


@pytest.mark.gpu
def test_fp8_forward_step_under_cuda_graph_replay_equals_eager():
    """fwd + bwd captured once, replayed on new values: what eager mode computes, and right. The backward is the
    bf16 one: where the fused backward sums dQ across key blocks by fp32 reductions (Hopper), its last bits
    follow the order they land in, so dQ equals eager's to rounding only (as in test_attention.py)."""
    q, k, v, g = make(2, 513, 513, 8, 2, 128, 128, torch.bfloat16, "cuda")
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))

    def step():
        q.grad = k.grad = v.grad = None
        out = attention(q, k, v, causal=True, fp8_forward=True)
        out.backward(g)
        return out, q.grad, k.grad, v.grad

    replayed, eager = replay_and_eager(step, (q, k, v))
    fused = hopper_ws.supports_backward(q, k, v, g, True, None, False)
    for name, got, eager_t, want in zip(("out", "dq", "dk", "dv"), replayed, eager, reference(q, k, v, g, True),
                                        strict=True):
        if name == "dq" and fused:
            assert snr_db(got, eager_t.double()) >= 40.0
        else:
            assert torch.equal(got, eager_t), name
        assert snr_db(got, want) >= FLOOR, name


# Spills a Triton leaves that were measured not to cost: d128's non-causal persistent backward under 3.6 (K's and
# V's descriptors built each step remove them, and ran 0.985x on the H100); the FP8 forward at d128 (128-key blocks:
# a tile's own values stored before its key loop and loaded after it, none in the loop; 1.12-1.15x the 64-key
# blocks that do not spill: docs/performance.md).
KNOWN_SPILLS = {"3.6": {"attention-bwd-ws-d128-persistent": 20, "attention-ws-fp8-d128": 116,
                        "attention-ws-fp8-d128-causal": 76},
                "3.9": {"attention-ws-fp8-d128": 96}}


@BOTH_TRITONS
def test_the_kernels_compile_to_hopper_tensor_core_and_tma_instructions(triton_dir):
    """Compiled for sm_90a here (no GPU needed), with the installed Triton and with the GPU's: both products of
    the FP8 forward are E4M3 wgmma, with no mma.sync fallback; the bf16 forward and both backward passes are
    wgmma too, and with the tuned table's TMA knob on, their tile streams are TMA loads; dK/dV adding dQ adds
    a wgmma product and fp32 atomic adds (TMA reductions with TMA on); quantize_heads' kernels compile (relaxed
    atomic amax, E4M3 conversions), as does quantize_both's rowwise amax pass (relaxed atomics); the
    warp-specialized kernels spill nothing (but KNOWN_SPILLS)."""
    counts = compiled(["-m", "tests.hopper_compile"], triton_dir, timeout=900)
    known_spills = KNOWN_SPILLS.get(".".join(counts.pop("triton").split(".")[:2]), {})
    for kernel in ("bf16-d128", "bwd_kv-d128", "bwd_q-d128"):
        pointers, tma = counts[f"{kernel}-pointers"], counts[f"{kernel}-tma"]
        assert pointers["wgmma"] > 0 and pointers["wgmma_e4m3"] == pointers["mma_sync"] == 0, (kernel, pointers)
        assert pointers["tma_loads"] == 0 and tma["tma_loads"] > 0, (kernel, tma)
        assert tma["wgmma"] == pointers["wgmma"] and tma["mma_sync"] == 0, (kernel, tma)
    for streams in ("pointers", "tma"):  # dQ added by the dK/dV pass: one more wgmma product, fp32 atomics
        atomic, separate = counts[f"bwd_kv-d128-{streams}-dq-atomic"], counts[f"bwd_kv-d128-{streams}"]
        assert atomic["wgmma"] > separate["wgmma"] and atomic["mma_sync"] == 0, atomic
        assert separate["atomic_adds"] == separate["tma_reduces"] == 0, separate
        # pointers: atomic adds; TMA: the tiles reduced by TMA, no per-element atomics
        assert (atomic["atomic_adds"] > 0) == (streams == "pointers") != (atomic["tma_reduces"] > 0), atomic
    # P goes into the E4M3 operand without crossing threads (v's keys in the operand's order): at most the 2
    # indexed shuffles the kernels hold elsewhere, against 18-34 (Triton) and 257 (Gluon) before.
    for d in (64, 128, 256):
        fp8, fp8_tma = counts[f"fp8-d{d}"], counts[f"fp8-d{d}-tma"]
        assert fp8["wgmma"] == fp8["wgmma_e4m3"] > 0 and fp8["mma_sync"] == 0, (d, fp8)
        assert fp8_tma["wgmma"] == fp8_tma["wgmma_e4m3"] > 0 and fp8_tma["mma_sync"] == 0, (d, fp8_tma)
        assert fp8["tma_loads"] == 0 and fp8_tma["tma_loads"] > 0, (d, fp8_tma)
        assert fp8["shuffles"] <= 2 and fp8_tma["shuffles"] <= 2, (d, fp8, fp8_tma)
    for layout in ("dense", "packed"):
        assert counts[f"quantize-{layout}"]["atomics"] > 0 and counts[f"quantize-{layout}"]["cvt_e4m3"] > 0
    # The amax kernels' atomics (quantize_heads', quantize_both's) are relaxed: nothing in the launch reads them.
    for kernel in ("quantize-dense", "quantize-packed", "rowwise-amax", "rowwise-amax-rows"):
        amax = counts[kernel]
        assert amax["atomics"] == amax["relaxed_atomics"] > 0 and amax["fences"] == 0, (kernel, amax)
    # The warp-specialized FP8 forward at each head dim, as the tuned table launches it: both products E4M3 wgmma,
    # P into its operand without shuffles and cast where the PV product reads it (no E4M3 bytes unpacked and packed
    # again), K and V by TMA, within its bound, no spills (but KNOWN_SPILLS).
    for d, n, stages, _lazy in FP8_WS_LAUNCHES:
        for causal in ("", "-causal"):
            key = f"attention-ws-fp8-d{d}{causal}"
            ws = counts[key]
            assert ws["wgmma"] == ws["wgmma_e4m3"] > 0 and ws["mma_sync"] == 0 and ws["tma_loads"] > 0, ws
            assert ws["shuffles"] <= 2 and ws["byte_permutes"] == 0, ws
            assert ws["shared_bytes"] <= hopper_ws.shared_bytes(d, n, stages, 1), ws
            assert ws["spill_bytes"] <= known_spills.get(key, 0), ws
    # The warp-specialized forward (hopper_ws): wgmma only, K and V by TMA, no spills, within its bound.
    for d, n, stages in ((128, 128, 2), (128, 64, 3), (64, 64, 4), (256, 64, 2)):
        for causal in ("", "-causal"):
            ws = counts[f"attention-ws-d{d}-n{n}-s{stages}{causal}"]
            assert ws["wgmma"] > 0 and ws["mma_sync"] == 0 and ws["tma_loads"] > 0 and ws["spill_bytes"] == 0, ws
            assert ws["shared_bytes"] <= hopper_ws.shared_bytes(d, n, stages), ws
    # Its dQ pass: wgmma only, K and V by TMA, no spills.
    for d in hopper_ws.DQ_HEAD_DIMS:
        for causal in ("", "-causal"):
            dq = counts[f"attention-dq-ws-d{d}{causal}"]
            assert dq["wgmma"] > 0 and dq["mma_sync"] == 0 and dq["tma_loads"] > 0 and dq["spill_bytes"] == 0, dq
    # The fused backward (a CTA a tile, or its persistent grid): wgmma only, q and dO by TMA loads, dQ by TMA
    # reductions; within shared memory; no spills (at d256 K's and V's descriptors hoisted out of the step loop
    # spilled 148-180 bytes a thread under Triton 3.6, 0-16 under 3.9: hopper_ws._bwd_consume_tile).
    for d in hopper_ws.BWD_HEAD_DIMS:
        causal_persistent = ("-persistent-causal",) if d in hopper_ws.CAUSAL_PERSISTENT_HEAD_DIMS else ()
        for launch in ("", "-causal", "-persistent", *causal_persistent):  # as backward_ws launches it
            key = f"attention-bwd-ws-d{d}{launch}"
            bwd = counts[key]
            assert bwd["wgmma"] > 0 and bwd["mma_sync"] == 0 and bwd["tma_loads"] > 0 and bwd["tma_reduces"] > 0, bwd
            assert bwd["shared_bytes"] <= SHARED_MEMORY_BYTES and bwd["spill_bytes"] <= known_spills.get(key, 0), bwd


def test_the_fp8_campaign_preset_validates_and_tunes_the_fp8_forward():
    manifest = Manifest.model_validate(yaml.safe_load((REPO_ROOT / "campaigns/attention-fp8-llama3.yaml").read_text()))
    assert manifest.resolved_variant == FP8_VARIANT and manifest.primary_metric == "forward"
    dims = load_shapes("attention", manifest.shapes)[0].dims
    assert "fwd_fp8-d128" in buckets_for(dims, manifest.resolved_variant)


def test_the_fp8_forward_is_judged_on_the_fp8_roofline(tmp_path):
    """ANALYZE (and the roofline check) put the FP8 forward, whose outputs have a floor of their own, on the
    fp8 rate, and count its q, k and v reads at one byte."""
    from agent.analysis import analyze
    from harness.schema import read_summary, write_summary

    dims = {"B": 1, "Hq": 2, "Hkv": 2, "Sq": 64, "Sk": 64, "D": 64, "Dv": 64}
    row = {"label": "s1", **dims, "causal": 0, "window": 0, "Check": "PASS", "Forward TFLOPS": 100.0,
           "Forward TFLOPS_stddev": 1.0, "Backward TFLOPS": 90.0, "Backward TFLOPS_stddev": 1.0,
           "Forward Time (ms)": 0.1, "Backward Time (ms)": 0.2, "out_snr": 27.0, "dq_snr": 27.0, "dk_snr": 27.0,
           "dv_snr": 30.0}
    summary = read_summary(write_summary(tmp_path / "s.csv", get_schema("attention"), [row]))
    shape = Shape(label="s1", dims=dims)
    ceilings = {"tflops": 800.0, "fp8_tflops": 1600.0, "gbps": 1e9}  # huge bandwidth: compute-bound
    spec = get_spec("attention")
    fp8, bf16 = (analyze(spec, [shape], summary, "bf16", variant, ceilings)[0] for variant in (FP8_VARIANT, "default"))
    assert fp8.roofline_tflops == pytest.approx(1600.0) and bf16.roofline_tflops == pytest.approx(800.0)
    assert fp8.intensity > bf16.intensity
