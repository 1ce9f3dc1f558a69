import pytest
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from harness.snr import snr_db
from kernels.common.device import default_device
from kernels.common.tiles import TileConfig, config_from_table, layer_class
from kernels.common.tma import descriptor, stack_tma_layout, tma_layout
from kernels.gemm import gemm, gemm_backward, gemm_forward
from kernels.gemm.tuning import TUNABLE_SPACE, TUNED_TABLE, buckets_for, config_for, shape_bucket

# (M, N, K): none divisible by the blocks, a long K, a single row (the pointer kernel); then shapes
# whose rows are 16-byte multiples, not multiples of the blocks either (the TMA kernel).
SHAPES = [(97, 75, 61), (64, 48, 300), (1, 33, 17), (130, 70, 64), (136, 72, 96), (200, 104, 168)]


def reference(a, b, g, trans_a, trans_b):
    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    out = (a64.t() if trans_a else a64) @ (b64.t() if trans_b else b64)
    out.backward(g.double())
    return out, a64.grad, b64.grad


def operands(M, N, K, trans_a, trans_b, dtype, device):
    a = torch.randn((K, M) if trans_a else (M, K), dtype=dtype, device=device, requires_grad=True)
    b = torch.randn((N, K) if trans_b else (K, N), dtype=dtype, device=device, requires_grad=True)
    return a, b


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("mnk", SHAPES)
def test_forward_and_backward_match_float64(mnk, trans_a, trans_b, device, half_dtype):
    torch.manual_seed(hash((mnk, trans_a, trans_b)) % 2**31)
    a, b = operands(*mnk, trans_a, trans_b, half_dtype, device)
    out = gemm(a, b, trans_a, trans_b)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    ref_out, ref_da, ref_db = reference(a, b, grad_out, trans_a, trans_b)
    floor = 50 if half_dtype == torch.float16 else 40
    assert out.dtype == half_dtype and a.grad.shape == a.shape and b.grad.shape == b.shape
    assert snr_db(out, ref_out) > floor
    assert snr_db(a.grad, ref_da) > floor
    assert snr_db(b.grad, ref_db) > floor


@pytest.mark.parametrize(("M", "N", "K"), [(77, 45, 52), (136, 72, 200)])
def test_every_element_written_into_poisoned_buffers(M, N, K, device, half_dtype):
    a = torch.randn(M, K, dtype=half_dtype, device=device)
    b = torch.randn(N, K, dtype=half_dtype, device=device)
    g = torch.randn(M, N, dtype=half_dtype, device=device)
    out = torch.full((M, N), float("nan"), dtype=half_dtype, device=device)
    da, db = torch.full_like(a, float("nan")), torch.full_like(b, float("nan"))
    gemm_forward(a, b, trans_b=True, out=out)
    gemm_backward(g, a, b, trans_b=True, grad_a=da, grad_b=db)
    ref_out, ref_da, ref_db = reference(a, b, g, False, True)
    for got, ref in ((out, ref_out), (da, ref_da), (db, ref_db)):
        assert torch.isfinite(got).all()
        assert snr_db(got, ref) > 40


def test_non_contiguous_views_and_fp32_output(device, half_dtype):
    base_a = torch.randn(80, 90, dtype=half_dtype, device=device)
    base_b = torch.randn(70, 100, dtype=half_dtype, device=device)
    a, b = base_a[::2, 5:55], base_b[3:53, ::3]  # strided in both dims
    out = gemm(a, b, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert snr_db(out, a.double() @ b.double()) > 50


def test_empty_and_zero_k(device, half_dtype):
    a = torch.randn(0, 16, dtype=half_dtype, device=device)
    b = torch.randn(16, 8, dtype=half_dtype, device=device)
    assert gemm(a, b).shape == (0, 8)
    a, b = torch.randn(4, 0, dtype=half_dtype, device=device), torch.randn(0, 8, dtype=half_dtype, device=device)
    assert torch.equal(gemm(a, b), torch.zeros(4, 8, dtype=half_dtype, device=device))


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "a_dtype", "b_dtype", "match"),
    [
        ((4, 8), (9, 4), torch.float16, torch.float16, "inner dims differ"),
        ((2, 4, 8), (8, 4), torch.float16, torch.float16, "2-D"),
        ((4, 8), (8, 4), torch.float32, torch.float32, "bf16 or fp16"),
        ((4, 8), (8, 4), torch.float16, torch.bfloat16, "bf16 or fp16"),
    ],
)
def test_bad_input_raises_value_error(a_shape, b_shape, a_dtype, b_dtype, match):
    device = default_device()
    a, b = torch.randn(a_shape, device=device).to(a_dtype), torch.randn(b_shape, device=device).to(b_dtype)
    with pytest.raises(ValueError, match=match):
        gemm(a, b)


def test_bad_out_dtype_raises():
    a = torch.randn(4, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match="out_dtype"):
        gemm(a, a.t().contiguous(), out_dtype=torch.int32)


def test_tma_layout_names_the_contiguous_dim_or_refuses():
    t = torch.empty(64, 96, dtype=torch.float16)
    assert tma_layout(t) is True and tma_layout(t.t()) is False
    assert tma_layout(torch.empty(64, 61, dtype=torch.float16)) is None  # 122-byte rows
    assert tma_layout(t[:, 1:]) is None  # a base 2 bytes off alignment
    assert tma_layout(t[::2, ::2]) is None  # no unit stride


def test_stack_tma_layout_names_the_contiguous_dim_or_refuses():
    b = torch.empty(3, 64, 96, dtype=torch.float16)
    assert stack_tma_layout(b) is True and stack_tma_layout(b.transpose(1, 2)) is False
    assert stack_tma_layout(torch.empty(3, 64, 61, dtype=torch.float16)) is None  # 122-byte rows
    assert stack_tma_layout(b[:, :, 1:]) is None  # a base 2 bytes off alignment
    assert stack_tma_layout(torch.empty(3, 64, 4, dtype=torch.float16)) is None  # 8-byte rows
    odd_groups = torch.empty(128, dtype=torch.float16).as_strided((3, 4, 8), (33, 8, 1))
    assert stack_tma_layout(odd_groups) is None  # a 66-byte group stride


def test_a_checked_descriptor_is_a_triton_descriptor_of_the_whole_tensor():
    """What the launchers build past tma_layout: Triton's TensorDescriptor (the binder and the launcher take it
    as one), without its checks again, but refusing an empty dim by name."""
    t = torch.empty(64, 96, dtype=torch.float16)
    desc = descriptor(t.t(), [32, 16])
    assert isinstance(desc, TensorDescriptor) and desc.base.data_ptr() == t.data_ptr()
    assert (desc.shape, desc.strides, desc.block_shape) == ([96, 64], [1, 96], [32, 16])
    with pytest.raises(ValueError, match="non-empty"):
        descriptor(torch.empty(0, 96, dtype=torch.float16), [32, 16])


def test_tuned_table_lies_in_the_tunable_space():
    for bucket, cfg in TUNED_TABLE.items():
        config_from_table(TUNED_TABLE, TUNABLE_SPACE, bucket)  # raises if a knob is outside the space
        assert set(cfg) == set(TUNABLE_SPACE), bucket
    assert shape_bucket(64, 64, 64) == "small" and shape_bucket(8192, 8192, 8192) == "large"
    with pytest.raises(ValueError, match="outside the tunable space"):
        config_from_table({"odd": TUNED_TABLE["small"] | {"BLOCK_M": 48}}, TUNABLE_SPACE, "odd")
    assert isinstance(config_for(100, 100, 100), TileConfig)


def test_a_knob_some_buckets_hold_is_checked_where_held_and_defaults_elsewhere():
    """WS (the FP8 ops' warp-specialized kernel) lives in some buckets only: a bucket without it runs the Triton
    kernels; one holding it must hold a value of the space; a space that does not declare it refuses it."""
    space = TUNABLE_SPACE | {"WS": (0, 1)}
    plain = TUNED_TABLE["small"]
    assert config_from_table({"b": plain}, space, "b").WS == 0
    assert config_from_table({"b": plain | {"WS": 1}}, space, "b").WS == 1
    with pytest.raises(ValueError, match="WS=2 is outside the tunable space"):
        config_from_table({"b": plain | {"WS": 2}}, space, "b")
    with pytest.raises(ValueError, match="WS=1 is outside the tunable space"):
        config_from_table({"b": plain | {"WS": 1}}, TUNABLE_SPACE, "b")


@pytest.mark.parametrize("trans_b", [True, False])
def test_every_pass_of_a_layer_asks_for_its_entry(monkeypatch, trans_b, device, half_dtype):
    """The table may split a bucket by layer (`<bucket> <N>x<K>`, the weight's dims): the forward, the dgrad and
    the wgrad of a gemm call all name b's, whichever way round it is held, and a split entry serves that layer
    alone."""
    import kernels.gemm as package

    asked = []

    def recording(M, N, K, weight_dims=None):
        asked.append(weight_dims and layer_class(*weight_dims))
        return config_for(M, N, K, weight_dims)

    monkeypatch.setattr(package, "config_for", recording)
    M, N, K = 130, 70, 64
    a, b = operands(M, N, K, False, trans_b, half_dtype, device)
    gemm(a, b, trans_b=trans_b).backward(torch.randn(M, N, dtype=half_dtype, device=device))
    assert asked == ["70x64"] * 3
    monkeypatch.setitem(TUNED_TABLE, "small 70x64", TUNED_TABLE["small"] | {"GROUP_M": 1})
    this_layer, another, no_layer = (config_for(M, N, K, dims).GROUP_M for dims in ((N, K), (N + 8, K), None))
    assert (this_layer, another, no_layer) == (1, TUNED_TABLE["small"]["GROUP_M"], TUNED_TABLE["small"]["GROUP_M"])
    assert TUNED_TABLE["small"]["GROUP_M"] != 1 and "small 70x64" in buckets_for({"M": M, "N": N, "K": K})



@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(4096, 4096, 4096), (8192, 6144, 4096), (1000, 3000, 777)])
def test_bf16_on_gpu(mnk):
    torch.manual_seed(0)
    a, b = operands(*mnk, False, True, torch.bfloat16, "cuda")
    out = gemm(a, b, trans_b=True)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    ref_out, ref_da, ref_db = reference(a, b, grad_out, False, True)
    assert snr_db(out, ref_out) > 40
    assert snr_db(a.grad, ref_da) > 40
    assert snr_db(b.grad, ref_db) > 40


@pytest.mark.gpu
def test_cuda_graph_capture():
    a = torch.randn(512, 384, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(256, 384, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(512, 256, dtype=torch.bfloat16, device="cuda")
    gemm_forward(a, b, trans_b=True, out=out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm_forward(a, b, trans_b=True, out=out)
    out.fill_(float("nan"))
    a.copy_(torch.randn_like(a))
    graph.replay()
    torch.cuda.synchronize()
    assert snr_db(out, a.double() @ b.double().t()) > 40
