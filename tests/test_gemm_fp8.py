"""gemm_fp8 against float64 by SNR: every format and granularity, both weight layouts, the TMA kernel
(16-byte rows) and the pointer fallback (odd K), pre-quantized operands, poisoned outputs, bad input."""

import itertools

import pytest
import torch

from harness.snr import snr_db
from kernels.common.fp8 import Float8Config, Format, Granularity
from kernels.common.tiles import layer_class
from kernels.gemm_fp8 import Fp8Tensor, fp8_backward, fp8_forward, gemm_fp8, prequantize_weight, quantize
from kernels.gemm_fp8.tuning import TUNABLE_SPACE, TUNED_TABLE, buckets_for, config_for
from tests.graph_replay import replay_and_eager

FLOOR_DB = {torch.float8_e4m3fn: 25.0, torch.float8_e5m2: 20.0}
# (M, N, K): TMA-eligible but no dim a block multiple; then an odd K and N (pointer fallback).
SHAPES = [(160, 144, 272), (97, 75, 200)]


def reference(a, b, g, trans_b):
    w = b.double().t() if trans_b else b.double()
    a64 = a.double()
    return a64 @ w, g.double() @ w.t(), (g.double().t() @ a64) if trans_b else (a64.t() @ g.double())


def run_step(a, b, trans_b, config):
    a, b = a.clone().requires_grad_(), b.clone().requires_grad_()
    out = gemm_fp8(a, b, trans_b=trans_b, config=config)
    grad = torch.randn_like(out)
    out.backward(grad)
    return out, a.grad, b.grad, grad


@pytest.mark.parametrize("mnk", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(("fmt", "gran"), list(itertools.product(Format, Granularity)),
                         ids=lambda v: getattr(v, "value", v))
def test_forward_and_backward_match_float64(mnk, fmt, gran, device, half_dtype):
    M, N, K = mnk
    torch.manual_seed(hash((mnk, fmt, gran)) % 2**31)
    config = Float8Config(fmt, gran)
    for trans_b in (True, False):
        a = torch.randn(M, K, dtype=half_dtype, device=device)
        b = torch.randn((N, K) if trans_b else (K, N), dtype=half_dtype, device=device)
        out, da, db, grad = run_step(a, b, trans_b, config)
        ref_out, ref_da, ref_db = reference(a, b, grad, trans_b)
        assert out.dtype == half_dtype and da.shape == a.shape and db.shape == b.shape
        assert snr_db(out, ref_out) >= FLOOR_DB[config.forward_dtype], trans_b
        assert snr_db(da, ref_da) >= FLOOR_DB[config.grad_dtype], trans_b
        assert snr_db(db, ref_db) >= FLOOR_DB[config.grad_dtype], trans_b


@pytest.mark.parametrize("mnk", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_element_written_into_poisoned_buffers(mnk, device, half_dtype):
    M, N, K = mnk
    config = Float8Config(Format.HYBRID, Granularity.BLOCKWISE)
    a, b = torch.randn(M, K, dtype=half_dtype, device=device), torch.randn(N, K, dtype=half_dtype, device=device)
    g = torch.randn(M, N, dtype=half_dtype, device=device)
    out, da, db = (torch.full(s, float("nan"), dtype=half_dtype, device=device) for s in ((M, N), (M, K), (N, K)))
    saved = fp8_forward(a, b, True, config, out, needs=(True, True))
    fp8_backward(g, saved, True, config, da, db)
    for got, ref, fp8 in zip((out, da, db), reference(a, b, g, True), (torch.float8_e4m3fn, *[torch.float8_e5m2] * 2),
                             strict=True):
        assert torch.isfinite(got).all() and snr_db(got, ref) >= FLOOR_DB[fp8]


@pytest.mark.parametrize("gran", list(Granularity), ids=lambda g: g.value)
def test_a_weight_kept_in_fp8_gives_the_same_result_and_gradients_for_the_input(gran, device, half_dtype):
    M, N, K = SHAPES[0]
    torch.manual_seed(7)
    config = Float8Config(Format.E4M3, gran)
    a = torch.randn(M, K, dtype=half_dtype, device=device, requires_grad=True)
    w = torch.randn(N, K, dtype=half_dtype, device=device)
    w8 = quantize(w, torch.float8_e4m3fn, gran, weight=True)
    out = gemm_fp8(a, w8, config=config)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref_out, ref_da, _ = reference(a.detach(), w, grad, True)
    assert snr_db(out, ref_out) >= 25 and snr_db(a.grad, ref_da) >= 25
    assert snr_db(w8.dequantize(torch.float32), w) >= 25  # the scales are what `dequantize` says they are
    both = gemm_fp8(quantize(a.detach(), torch.float8_e4m3fn, gran), w8, config=config)
    assert both.dtype == torch.bfloat16 and snr_db(both, ref_out) >= 25


def test_an_fp8_activation_still_gives_the_weight_its_gradient(device, half_dtype):
    M, N, K = SHAPES[0]
    config = Float8Config(Format.E4M3, Granularity.ROWWISE)
    a = torch.randn(M, K, dtype=half_dtype, device=device)
    w = torch.randn(N, K, dtype=half_dtype, device=device, requires_grad=True)
    out = gemm_fp8(quantize(a, torch.float8_e4m3fn, Granularity.ROWWISE), w, config=config)
    grad = torch.randn_like(out)
    out.backward(grad)
    _, _, ref_db = reference(a, w.detach(), grad, True)
    assert snr_db(w.grad, ref_db) >= 25


def _fp8(shape, gran=Granularity.ROWWISE, scale_shape=None, dtype=torch.float8_e4m3fn):
    data = torch.randn(shape).to(dtype)
    return Fp8Tensor(data, torch.ones(scale_shape or (shape[0],), dtype=torch.float32), gran)


@pytest.mark.parametrize(
    ("a", "b", "kwargs", "match"),
    [
        (torch.randn(4, 8), torch.randn(6, 8), {}, "bf16/fp16"),
        (torch.randn(4, 8).half(), torch.randn(6, 9).half(), {}, "inner dims differ"),
        (torch.randn(4, 8).half(), torch.randn(6, 8).bfloat16(), {}, "share a dtype"),
        (torch.randn(2, 4, 8).half(), torch.randn(6, 8).half(), {}, "2-D"),
        (torch.randn(4, 8).half(), torch.randn(6, 8).half(), {"config": "e4m3"}, "Float8Config"),
        (torch.randn(4, 8).half(), torch.randn(6, 8).half(), {"out_dtype": torch.int8}, "out_dtype"),
        (torch.randn(4, 8).half(), _fp8((6, 8), scale_shape=(5,)), {}, r"b.scale must be float32 \[6\]"),
        (torch.randn(4, 8).half(), _fp8((6, 8), dtype=torch.float8_e5m2), {}, "the config wants torch.float8_e4m3fn"),
        (torch.randn(4, 8).half(), _fp8((6, 8), Granularity.BLOCKWISE), {}, "quantized blockwise"),
        (torch.randn(4, 8).half(), _fp8((6, 8), scale_shape=(6,)), {"trans_b": False}, "trans_b=True"),
        (_fp8((4, 8), Granularity.BLOCKWISE, (4, 2)), torch.randn(6, 8).half(),
         {"config": Float8Config(granularity=Granularity.BLOCKWISE)}, r"a.scale must be float32 \[4, 1\]"),
    ],
)
def test_bad_input_is_one_clear_value_error(a, b, kwargs, match):
    with pytest.raises(ValueError, match=match):
        gemm_fp8(a, b, **kwargs)


def test_tuned_table_lies_in_the_tunable_space_and_covers_every_pass():
    for bucket in TUNED_TABLE:
        assert set(TUNED_TABLE[bucket]) == set(TUNABLE_SPACE), bucket
    dims = {"B": 1, "M": 8192, "N": 8192, "K": 8192}
    for gran in Granularity:
        for key in buckets_for(dims, f"e4m3-{gran.value}"):
            assert key in TUNED_TABLE
    assert config_for("fwd", 8192, 8192, Granularity.BLOCKWISE, (8192, 8192)).BLOCK_K == 128


@pytest.mark.parametrize("trans_b", [True, False])
def test_every_pass_asks_for_its_layers_entry(monkeypatch, trans_b, device, half_dtype):
    """The table may split a bucket by layer (`<bucket> <N>x<K>`): each pass names the layer's weight, whichever
    way round it holds it, so a split entry serves the forward, the dgrad and the wgrad of its layer alone."""
    import kernels.gemm_fp8.kernel as kernel

    asked = []

    def recording(pass_name, rows, cols, granularity, weight_dims):
        asked.append((pass_name, layer_class(*weight_dims)))
        return config_for(pass_name, rows, cols, granularity, weight_dims)

    monkeypatch.setattr(kernel, "config_for", recording)
    M, N, K = SHAPES[0]
    b = torch.randn((N, K) if trans_b else (K, N), device=device, dtype=half_dtype)
    run_step(torch.randn(M, K, device=device, dtype=half_dtype), b, trans_b, Float8Config())
    assert sorted(asked) == [("dgrad", f"{max(N, K)}x{min(N, K)}"), ("fwd", f"{max(N, K)}x{min(N, K)}"),
                             ("wgrad", f"{max(N, K)}x{min(N, K)}")]
    bucket_group_m = TUNED_TABLE["fwd/small"]["GROUP_M"]
    monkeypatch.setitem(TUNED_TABLE, f"fwd/small {max(N, K)}x{min(N, K)}", TUNED_TABLE["fwd/small"] | {"GROUP_M": 1})
    this_layer, another = (config_for("fwd", M, N, Granularity.ROWWISE, dims).GROUP_M for dims in ((N, K), (N + 16, K)))
    assert (this_layer, another) == (1, bucket_group_m) and bucket_group_m != 1
    assert f"fwd/small {max(N, K)}x{min(N, K)}" in buckets_for({"M": M, "N": N, "K": K})


@pytest.mark.gpu
@pytest.mark.parametrize(("fmt", "gran"), list(itertools.product(Format, Granularity)),
                         ids=lambda v: getattr(v, "value", v))
@pytest.mark.parametrize("mnk", [(4096, 4096, 4096), (1000, 3000, 777)], ids=lambda s: "x".join(map(str, s)))
def test_bf16_on_gpu(mnk, fmt, gran):
    torch.manual_seed(0)
    M, N, K = mnk
    config = Float8Config(fmt, gran)
    a = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(N, K, dtype=torch.bfloat16, device="cuda")
    out, da, db, grad = run_step(a, b, True, config)
    for got, ref, fp8 in zip((out, da, db), reference(a, b, grad, True),
                             (config.forward_dtype, config.grad_dtype, config.grad_dtype), strict=True):
        assert snr_db(got, ref) >= FLOOR_DB[fp8]


@pytest.mark.gpu
@pytest.mark.parametrize("ws", [False, True], ids=["table", "ws-everywhere"])
@pytest.mark.parametrize("gran", list(Granularity), ids=lambda g: g.value)
def test_a_captured_step_replays_like_eager(gran, ws, monkeypatch):
    """`ws-everywhere`: every bucket with WS 1 (the rowwise and tensorwise passes on the warp-specialized kernel,
    which the table leaves on the dense TMA kernel)."""
    if ws:
        for name, entry in TUNED_TABLE.items():
            monkeypatch.setitem(TUNED_TABLE, name, entry | {"WS": 1})
    config = Float8Config(Format.HYBRID, gran)
    a = torch.randn(1024, 512, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    b = torch.randn(768, 512, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    grad = torch.randn(1024, 768, dtype=torch.bfloat16, device="cuda")

    def step():
        a.grad = b.grad = None
        out = gemm_fp8(a, b, config=config)
        out.backward(grad)
        return out, a.grad, b.grad

    replayed, eager = replay_and_eager(step, (a, b))
    for got, want, exact in zip(replayed, eager, reference(a.detach(), b.detach(), grad, True), strict=True):
        assert torch.equal(got, want)  # the replay computes what eager mode computes on the new inputs
        assert snr_db(got, exact) >= 20.0  # E5M2 gradients' floor


@pytest.mark.parametrize("gran", [Granularity.ROWWISE, Granularity.BLOCKWISE], ids=lambda g: g.value)
@pytest.mark.parametrize("wants", ["input", "weight"])
def test_a_step_that_wants_one_gradient_gets_it_right(gran, wants, device, half_dtype):
    """The forward keeps only what the wanted gradient reads (the weight for the dgrad, the input along
    its tokens for the wgrad): each path alone still matches float64."""
    M, N, K = SHAPES[0]
    a = torch.randn(M, K, dtype=half_dtype, device=device, requires_grad=wants == "input")
    w = torch.randn(N, K, dtype=half_dtype, device=device, requires_grad=wants == "weight")
    out = gemm_fp8(a, w, config=Float8Config(Format.E4M3, gran))
    grad = torch.randn_like(out)
    out.backward(grad)
    _, ref_da, ref_db = reference(a.detach(), w.detach(), grad, True)
    got, ref, other = (a.grad, ref_da, w.grad) if wants == "input" else (w.grad, ref_db, a.grad)
    assert other is None and snr_db(got, ref) >= 25


@pytest.mark.parametrize("gran", [Granularity.ROWWISE, Granularity.BLOCKWISE], ids=lambda g: g.value)
@pytest.mark.parametrize("trans_b", [True, False])
def test_a_weight_quantized_once_gives_the_same_step(gran, trans_b, device, half_dtype):
    """prequantize_weight once, then the op reads that copy instead of quantizing w: the same output and
    gradients (w's included), bit for bit."""
    M, N, K = SHAPES[0]
    config = Float8Config(Format.HYBRID, gran)
    torch.manual_seed(3)
    a0 = torch.randn(M, K, dtype=half_dtype, device=device)
    w0 = torch.randn((N, K) if trans_b else (K, N), dtype=half_dtype, device=device)
    grad = torch.randn(M, N, dtype=half_dtype, device=device)
    results = []
    for prequantized in (False, True):
        a, w = a0.clone().requires_grad_(), w0.clone().requires_grad_()
        w8 = prequantize_weight(w, trans_b, config) if prequantized else None
        out = gemm_fp8(a, w, trans_b=trans_b, config=config, b_fp8=w8)
        out.backward(grad)
        results.append((out, a.grad, w.grad))
    for plain, reused in zip(*results, strict=True):
        assert torch.equal(plain, reused)


def test_a_foreign_weight_copy_is_refused(device):
    a = torch.randn(8, 32, dtype=torch.float16, device=device)
    w = torch.randn(16, 32, dtype=torch.float16, device=device, requires_grad=True)
    w8 = prequantize_weight(w)
    with pytest.raises(ValueError, match="b_fp8 is of a"):
        gemm_fp8(a, w.detach().t().contiguous(), trans_b=False, b_fp8=w8)
    with pytest.raises(ValueError, match="goes with a bf16/fp16 b"):
        gemm_fp8(a, quantize(w.detach(), torch.float8_e4m3fn, Granularity.ROWWISE, weight=True), b_fp8=w8)
    with pytest.raises(ValueError, match=r"the config wants torch\.float8_e4m3fn blockwise"):
        gemm_fp8(a, w, config=Float8Config(granularity=Granularity.BLOCKWISE), b_fp8=w8)
    with pytest.raises(ValueError, match="2-D"):
        prequantize_weight(w[None])


@pytest.mark.parametrize("gran", list(Granularity), ids=lambda g: g.value)
@pytest.mark.parametrize("trans_b", [True, False])
# K 136: the accumulating wgrad's operands and output meet TMA's rules (loads through descriptors);
# K 37 with trans_b: its [N, K] rows are 74 bytes, not a multiple of 16 (pointer loads).
@pytest.mark.parametrize(("K", "buffer_dtype"), [(136, "fp32"), (136, "w's dtype"), (37, "w's dtype")])
def test_the_wgrad_accumulates_into_main_grad(gran, trans_b, K, buffer_dtype, device, half_dtype):
    """Two microbatches (odd token counts) adding their weight gradients into a main_grad that holds an
    earlier sum: the buffer ends at that sum plus both float64 wgrads; w.grad stays None and the input's
    gradient is the plain op's, bit for bit."""
    N = 48
    cfg = Float8Config(Format.E4M3, gran)
    torch.manual_seed(3)
    w = torch.randn((N, K) if trans_b else (K, N), dtype=half_dtype, device=device, requires_grad=True)
    main_grad = torch.randn(w.shape, dtype=torch.float32 if buffer_dtype == "fp32" else half_dtype, device=device)
    start = main_grad.clone()
    added = torch.zeros(w.shape, dtype=torch.float64, device=device)
    for M in (40, 77):
        a = torch.randn(M, K, dtype=half_dtype, device=device, requires_grad=True)
        grad = torch.randn(M, N, dtype=half_dtype, device=device)
        gemm_fp8(a, w, trans_b=trans_b, config=cfg, main_grad=main_grad).backward(grad)
        da = a.grad
        a.grad = None
        gemm_fp8(a, w.detach(), trans_b=trans_b, config=cfg).backward(grad)
        assert torch.equal(da, a.grad)
        wgrad = grad.double().t() @ a.double()  # [N, K]
        added += wgrad if trans_b else wgrad.t()
    assert w.grad is None
    assert snr_db(main_grad.double() - start.double(), added) >= 25


def test_a_main_grad_the_wgrad_cannot_add_into_is_refused(device):
    a = torch.randn(8, 32, dtype=torch.float16, device=device)
    w = torch.randn(16, 32, dtype=torch.float16, device=device, requires_grad=True)
    with pytest.raises(ValueError, match=r"b's shape \[16, 32\]"):
        gemm_fp8(a, w, main_grad=torch.zeros(32, 16, device=device))
    with pytest.raises(ValueError, match="goes with a bf16/fp16 b"):
        gemm_fp8(a, quantize(w.detach(), torch.float8_e4m3fn, Granularity.ROWWISE, weight=True),
                 main_grad=torch.zeros(16, 32, device=device))
    with pytest.raises(ValueError, match="does not require grad"):
        gemm_fp8(a, w.detach(), main_grad=torch.zeros(16, 32, device=device))
