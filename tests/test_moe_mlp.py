"""MoEMLP (kernels/moe/mlp.py, its experts in kernels/moe/experts.py) against a float64 torch layer
(kernels/moe/reference.py with a loop over the experts), forward and every gradient by SNR; SwiGLU alone;
the FP8 path's fused SwiGLU quantization; GPU: a whole training step under CUDA-graph replay equals eager,
bf16 and FP8, and no more activation memory than the torch layer."""

import pytest
import torch

from harness.memory import activation_bytes
from harness.snr import snr_db, snr_threshold
from kernels.common.dtypes import dtype_name
from kernels.common.fp8 import Float8Config, Granularity, RowGroups, quantize_both
from kernels.grouped_gemm import group_offsets
from kernels.grouped_gemm_fp8 import group_layout, grouped_gemm_fp8, prequantize_weight
from kernels.moe import ExpertWeightsFp8, MoEMLP, RouterConfig, moe_experts, swiglu, swiglu_down_fp8
from kernels.moe.experts import weighted_swiglu_backward
from kernels.moe.reference import loop_experts, torch_moe_experts, torch_moe_mlp
from tests.graph_replay import replay_and_eager

# name: (router, tokens, hidden, intermediate)
CASES = {
    "softmax-top2": (RouterConfig(6, 2, renormalize=True), 37, 48, 40),
    "sigmoid-grouped-top4": (RouterConfig(16, 4, "sigmoid", n_group=4, topk_group=2, renormalize=True,
                                          scaling_factor=2.5), 29, 32, 24),
    "one-token-top1": (RouterConfig(4, 1), 1, 16, 8),
}


def layer_and_reference(case: str, dtype: torch.dtype, device):
    router, T, H, inter = CASES[case]
    torch.manual_seed(0)
    layer = MoEMLP(H, inter, router, expert_bias=router.score_func == "sigmoid", dtype=dtype, device=device)
    if layer.expert_bias is not None:
        layer.expert_bias.copy_(0.05 * torch.randn(router.num_experts))
    x = torch.randn(T, H, dtype=dtype, device=device)
    return layer, x


@pytest.mark.parametrize("case", CASES)
def test_forward_and_gradients_match_a_float64_layer(case, device, half_dtype):
    layer, x = layer_and_reference(case, half_dtype, device)
    x.requires_grad_()
    grad_out = torch.randn_like(x)
    out, routing = layer(x)
    ((out * grad_out).sum() + 0.1 * routing.aux_loss + 0.01 * routing.z_loss).backward()

    params64 = [p.detach().double().requires_grad_() for p in (x, layer.gate, layer.w_gate_up, layer.w_down)]
    bias = layer.expert_bias.double() if layer.expert_bias is not None else None
    # The experts our router chose: float64 logits could break a near tie the other way.
    ref, aux_loss, z_loss = torch_moe_mlp(*params64, layer.router, bias, routing.expert_ids, loop_experts)
    ((ref * grad_out.double()).sum() + 0.1 * aux_loss + 0.01 * z_loss).backward()

    floor = snr_threshold(dtype_name(half_dtype))
    assert snr_db(out, ref) >= floor
    assert snr_db(routing.aux_loss, aux_loss) >= snr_threshold("fp32")
    grads = (x.grad, layer.gate.grad, layer.w_gate_up.grad, layer.w_down.grad)
    for got, (name, want) in zip(grads, zip(("x", "gate", "w_gate_up", "w_down"), params64, strict=True), strict=True):
        assert snr_db(got, want.grad) >= floor, name


@pytest.mark.parametrize("granularity", list(Granularity))
def test_quantizing_a_swiglu_input_equals_quantizing_its_output(granularity, device, half_dtype):
    """quantize_both(h, glu=True), the FP8 path's fused SwiGLU, writes the same bytes and scales as
    quantize_both of silu(gate) * up computed in fp32, in both layouts, over token groups with an empty one."""
    h = torch.randn(150, 2 * 40, dtype=half_dtype, device=device)
    offs = torch.tensor([0, 30, 30, 101, 150], device=device)
    gate, up = h.float().chunk(2, dim=-1)
    fused = quantize_both(h, torch.float8_e4m3fn, granularity, RowGroups.tokens(offs), glu=True)
    plain = quantize_both((torch.nn.functional.silu(gate) * up).contiguous(), torch.float8_e4m3fn, granularity,
                          RowGroups.tokens(offs))
    for (q, scale), (q_plain, scale_plain) in ((fused.rows, plain.rows), (fused.cols_t, plain.cols_t)):
        assert torch.equal(q.view(torch.uint8), q_plain.view(torch.uint8))
        assert torch.allclose(scale, scale_plain, rtol=1e-6, atol=0)


def test_fp8_layer_matches_a_float64_layer(device, half_dtype):
    """The FP8 experts (SwiGLU fused into the Down GEMM's quantization): forward and gradients by SNR at
    the FP8 formats' floors, two E4M3 GEMMs in a row."""
    router, T, H, inter = CASES["softmax-top2"]
    torch.manual_seed(0)
    layer = MoEMLP(H, inter, router, fp8=Float8Config(), dtype=half_dtype, device=device)
    x = torch.randn(T, H, dtype=half_dtype, device=device, requires_grad=True)
    grad_out = torch.randn_like(x)
    out, routing = layer(x)
    (out * grad_out).sum().backward()
    params64 = [p.detach().double().requires_grad_() for p in (x, layer.gate, layer.w_gate_up, layer.w_down)]
    ref, _, _ = torch_moe_mlp(*params64, router, None, routing.expert_ids, loop_experts)
    (ref * grad_out.double()).sum().backward()
    floor = snr_threshold("e4m3") - 5  # two quantized GEMMs in a row, each at the e4m3 floor or above
    snrs = [snr_db(out, ref), *(snr_db(p.grad, p64.grad) for p, p64 in
                                zip((x, layer.gate, layer.w_gate_up, layer.w_down), params64, strict=True))]
    assert min(snrs) >= floor, snrs


@pytest.mark.parametrize("granularity", list(Granularity), ids=lambda g: g.value)
def test_fp8_experts_match_float64_on_skewed_routing_with_empty_experts(granularity, device, half_dtype):
    """moe_experts in FP8 (tokens quantized in expert order straight from x, the combine's gradient
    straight from the output's): most pairs on two experts, four experts empty; the output and the
    gradients of x, probs and both stacks by SNR against float64."""
    T, H, inter, E, topk = 45, 64, 40, 8, 2
    g = torch.Generator().manual_seed(3)
    ids = torch.stack([torch.where(torch.rand(T, generator=g) < 0.8, 0, 5),
                       torch.where(torch.rand(T, generator=g) < 0.7, 3, 6)], dim=1).to(device)
    probs = torch.rand(T, topk, generator=g).to(device).requires_grad_()
    x = torch.randn(T, H, generator=g).to(device, half_dtype).requires_grad_()
    w_gate_up = (torch.randn(E, 2 * inter, H, generator=g) * H**-0.5).to(device, half_dtype).requires_grad_()
    w_down = (torch.randn(E, H, inter, generator=g) * inter**-0.5).to(device, half_dtype).requires_grad_()
    grad_out = torch.randn(T, H, generator=g).to(device, half_dtype)
    leaves = (x, probs, w_gate_up, w_down)
    out = moe_experts(x, ids, probs, w_gate_up, w_down, fp8=Float8Config(granularity=granularity))
    (out * grad_out).sum().backward()
    leaves64 = [leaf.detach().double().requires_grad_() for leaf in leaves]
    ref = torch_moe_experts(leaves64[0], ids, *leaves64[1:], experts=loop_experts)
    (ref * grad_out.double()).sum().backward()
    floor = snr_threshold("e4m3") - 5  # two quantized GEMMs in a row
    snrs = {"out": snr_db(out, ref), **{name: snr_db(leaf.grad, leaf64.grad) for name, leaf, leaf64 in
                                         zip(("x", "probs", "w_gate_up", "w_down"), leaves, leaves64, strict=True)}}
    assert min(snrs.values()) >= floor, snrs
    assert torch.all(w_gate_up.grad[[1, 2, 4, 7]] == 0) and torch.all(w_down.grad[[1, 2, 4, 7]] == 0)


def test_prequantized_expert_weights_give_the_same_microbatches(device, half_dtype):
    """A gradient-accumulation loop's FP8 layer: weights quantized once (quantize_weights) and read by two
    microbatches give the outputs and accumulated gradients of quantizing them in each microbatch."""
    router, T, H, inter = CASES["softmax-top2"]
    torch.manual_seed(0)
    layer = MoEMLP(H, inter, router, fp8=Float8Config(), dtype=half_dtype, device=device)
    xs = [torch.randn(T, H, dtype=half_dtype, device=device) for _ in range(2)]
    grads = [torch.randn(T, H, dtype=half_dtype, device=device) for _ in range(2)]

    def two_microbatches(weights_fp8):
        layer.zero_grad(set_to_none=True)
        outs = []
        for x, grad_out in zip(xs, grads, strict=True):
            out, _ = layer(x, weights_fp8=weights_fp8)
            (out * grad_out).sum().backward()
            outs.append(out.detach())
        return outs, [p.grad.clone() for p in (layer.gate, layer.w_gate_up, layer.w_down)]

    plain_outs, plain_grads = two_microbatches(None)
    outs, grads_acc = two_microbatches(layer.quantize_weights())
    for got, expected in zip(outs + grads_acc, plain_outs + plain_grads, strict=True):
        assert torch.equal(got, expected)

    # The expert wgrads added into fp32 main_grad buffers instead: the same sums, and no .grad on the stacks.
    main_grads = (torch.zeros_like(layer.w_gate_up, dtype=torch.float32),
                  torch.zeros_like(layer.w_down, dtype=torch.float32))
    layer.zero_grad(set_to_none=True)
    weights_fp8 = layer.quantize_weights()
    for x, grad_out in zip(xs, grads, strict=True):
        out, _ = layer(x, weights_fp8=weights_fp8, main_grads=main_grads)
        (out * grad_out).sum().backward()
    assert layer.w_gate_up.grad is None and layer.w_down.grad is None
    assert torch.equal(layer.gate.grad, plain_grads[0])
    for buffer, expected in zip(main_grads, plain_grads[1:], strict=True):
        assert snr_db(buffer, expected) >= snr_threshold(dtype_name(half_dtype))


def test_swiglu_forward_and_backward(device, half_dtype):
    h = torch.randn(7, 2 * 40, dtype=half_dtype, device=device, requires_grad=True)
    grad = torch.randn(7, 40, dtype=half_dtype, device=device)
    out = swiglu(h)
    out.backward(grad)
    h64 = h.detach().double().requires_grad_()
    gate, up = h64.chunk(2, dim=-1)
    ref = torch.nn.functional.silu(gate) * up
    ref.backward(grad.double())
    floor = snr_threshold(dtype_name(half_dtype))
    assert snr_db(out, ref) >= floor and snr_db(h.grad, h64.grad) >= floor


def test_weighted_swiglu_backward_gives_the_weights_gradient_from_what_it_reads(device, half_dtype):
    """weighted_swiglu_backward against float64 autograd of out[r] = weight[r] * swiglu(h[r]): h's gradient, and
    each row's weight gradient at 1 + r (0 at index 0, for pairs without a row); a row no pair fills
    (source -1, its weight unset: NaN here) gets a zero gradient and a zero dot; widths past one column block."""
    R, I = 37, 1100
    g = torch.Generator().manual_seed(4)
    h = torch.randn(R, 2 * I, generator=g).to(device, half_dtype)
    grad_out = torch.randn(R, I, generator=g).to(device, half_dtype)
    weight = torch.rand(R, generator=g).to(device)
    sources = torch.arange(R, dtype=torch.int32, device=device)
    sources[[3, 20]] = -1
    weight[[3, 20]] = float("nan")
    grad_h, dots = weighted_swiglu_backward(h, grad_out, weight, sources)
    filled = (sources >= 0).to(device)
    h64 = h.double().requires_grad_()
    w64 = torch.where(filled, weight, 0.0).double().requires_grad_()
    out = w64[:, None] * torch.nn.functional.silu(h64[:, :I]) * h64[:, I:]
    out.backward(grad_out.double())
    assert snr_db(grad_h, h64.grad) > 40
    assert not grad_h[~filled].any()
    assert dots[0] == 0 and not dots[1:][~filled].any()
    assert snr_db(dots[1:][filled], w64.grad[filled]) > 40


@pytest.mark.parametrize("granularity", [Granularity.ROWWISE, Granularity.BLOCKWISE])
def test_swiglu_down_fp8_matches_float64_on_skewed_and_empty_groups(granularity, device, half_dtype):
    """swiglu_down_fp8 (the SwiGLU inside the Down GEMM's quantization) against silu(gate) * up @ w_g^T in
    float64, per group, forward and both gradients; with a prequantized weight and a main_grad the same, the
    wgrad landing in the buffer."""
    torch.manual_seed(3)
    lens = torch.tensor([0, 150, 3, 0, 47], device=device)  # skewed, with empty groups
    E, H, inter, R = lens.numel(), 48, 136, int(lens.sum())
    offs = group_offsets(lens)
    h = torch.randn(R, 2 * inter, dtype=half_dtype, device=device, requires_grad=True)
    w = (torch.randn(E, H, inter, dtype=half_dtype, device=device) * inter**-0.5).requires_grad_()
    grad = torch.randn(R, H, dtype=half_dtype, device=device)
    config = Float8Config(granularity=granularity)
    out = swiglu_down_fp8(h, w, offs, config)
    out.backward(grad)
    h64, w64 = (t.detach().double().requires_grad_() for t in (h, w))
    gate, up = h64.chunk(2, dim=-1)
    act = torch.nn.functional.silu(gate) * up
    ref = torch.cat([act[int(offs[g]):int(offs[g + 1])] @ w64[g].t() for g in range(E)])
    ref.backward(grad.double())
    floor = snr_threshold("e4m3") - 5  # the SwiGLU output and the gradient quantized
    assert min(snr_db(out, ref), snr_db(h.grad, h64.grad), snr_db(w.grad, w64.grad)) >= floor
    assert torch.isfinite(out).all() and torch.isfinite(h.grad).all()

    main_grad = torch.zeros_like(w, dtype=torch.float32)
    w_fp8 = prequantize_weight(w, True, config)
    h.grad = None
    again = swiglu_down_fp8(h, w, offs, config, w_fp8=w_fp8, main_grad=main_grad)
    again.backward(grad)
    assert torch.equal(again, out)
    assert snr_db(main_grad, w64.grad) >= floor


@pytest.mark.parametrize("granularity", [Granularity.ROWWISE, Granularity.BLOCKWISE])
def test_a_shared_token_layout_gives_the_same_step_bit_for_bit(granularity, device, half_dtype):
    """GateUP -> swiglu_down_fp8 handed one group_layout (mapped once for both ops and their backward) equals
    the two ops mapping their own, output and every gradient bit for bit: the layout is the same."""
    torch.manual_seed(5)
    lens = torch.tensor([0, 150, 3, 0, 47], device=device)  # skewed, with empty groups
    E, H, inter, T = lens.numel(), 48, 40, int(lens.sum())
    offs = group_offsets(lens)
    x = torch.randn(T, H, dtype=half_dtype, device=device, requires_grad=True)
    w_gate_up = (torch.randn(E, 2 * inter, H, dtype=half_dtype, device=device) * H**-0.5).requires_grad_()
    w_down = (torch.randn(E, H, inter, dtype=half_dtype, device=device) * inter**-0.5).requires_grad_()
    grad = torch.randn(T, H, dtype=half_dtype, device=device)
    config = Float8Config(granularity=granularity)

    def step(layout):
        x.grad = w_gate_up.grad = w_down.grad = None
        h = grouped_gemm_fp8(x, w_gate_up, lens, offs, config=config, layout=layout)
        out = swiglu_down_fp8(h, w_down, offs, config, layout=layout)
        out.backward(grad)
        return out, x.grad, w_gate_up.grad, w_down.grad

    for own, shared in zip(step(None), step(group_layout(offs, T)), strict=True):
        assert torch.equal(own, shared)


def test_bad_inputs_raise_one_line_value_errors(device):
    layer = MoEMLP(16, 8, RouterConfig(4, 2), dtype=torch.float16, device=device)
    x = torch.randn(5, 16, dtype=torch.float16, device=device)
    ids, probs = torch.zeros(5, 2, dtype=torch.int64, device=device), torch.rand(5, 2, device=device)
    weights = ExpertWeightsFp8.of(layer.w_gate_up, layer.w_down, Float8Config())
    swapped = ExpertWeightsFp8(weights.down, weights.gate_up)  # each stack's copy handed to the other
    cases = [
        (lambda: layer(torch.randn(5, 12, dtype=torch.float16, device=device)), r"x must be \[T, hidden=16\]"),
        (lambda: layer(torch.randn(5, 16, device=device)), "x is torch.float32 but the parameters are torch.float16"),
        (lambda: MoEMLP(16, 8, (4, 2)), "router must be a RouterConfig"),
        (lambda: MoEMLP(16, 8, RouterConfig(4, 2), fp8="e4m3"), "fp8 must be a Float8Config"),
        (lambda: MoEMLP(0, 8, RouterConfig(4, 2)), "must be positive"),
        (lambda: swiglu(torch.randn(3, 5)), r"h must be \[rows, 2 \* I\]"),
        (lambda: swiglu_down_fp8(torch.randn(5, 12, dtype=torch.float16, device=device), layer.w_down,
                                 torch.zeros(5, dtype=torch.int64, device=device), Float8Config()),
         r"swiglu_down_fp8: h must be \[rows, 2 \* I\] and w_down \[E, H, I\]"),
        (lambda: swiglu_down_fp8(torch.randn(5, 16, dtype=torch.float16, device=device), layer.w_down,
                                 torch.zeros(4, dtype=torch.int64, device=device), Float8Config()),
         r"group_offs must be \[E \+ 1\] = \[5\]"),
        (lambda: swiglu_down_fp8(torch.randn(5, 16, device=device), layer.w_down,
                                 torch.zeros(5, dtype=torch.int64, device=device), Float8Config()),
         "h and w_down must share a dtype"),
        (lambda: swiglu_down_fp8(torch.randn(5, 16, dtype=torch.float16, device=device), layer.w_down,
                                 torch.zeros(5, dtype=torch.int64, device=device), "e4m3"),
         "config must be a Float8Config"),
        (lambda: swiglu_down_fp8(torch.randn(5, 16, dtype=torch.float16, device=device), layer.w_down,
                                 torch.zeros(5, dtype=torch.int64, device=device), Float8Config(), layout=ids),
         "swiglu_down_fp8: layout must be a TokenLayout"),
        (lambda: swiglu_down_fp8(torch.randn(500, 16, dtype=torch.float16, device=device), layer.w_down,
                                 torch.zeros(5, dtype=torch.int64, device=device), Float8Config(),
                                 layout=group_layout(torch.zeros(5, dtype=torch.int64, device=device), 5)),
         r"swiglu_down_fp8: layout must be group_layout\(group_offs, 500\): 8 blocks of 128 rows over 4 groups, "
         "got 5 blocks of 128 over 4"),
        (lambda: moe_experts(x, ids, probs, layer.w_gate_up[:, :15], layer.w_down), r"w_gate_up must be \[E, 2I, H\]"),
        (lambda: moe_experts(x, ids, probs, layer.w_gate_up, layer.w_down[:, :, :4]),
         r"w_down must be \[E, H, I\] = \[4, 16, 8\]"),
        (lambda: layer.quantize_weights(), "the layer has no fp8 config"),
        (lambda: moe_experts(x, ids, probs, layer.w_gate_up, layer.w_down, weights_fp8=weights),
         "weights_fp8 goes with an fp8 config"),
        (lambda: moe_experts(x, ids, probs, layer.w_gate_up, layer.w_down, Float8Config(), weights_fp8=(1, 2)),
         "weights_fp8 must be an ExpertWeightsFp8"),
        (lambda: moe_experts(x, ids, probs, layer.w_gate_up, layer.w_down, Float8Config(), weights_fp8=swapped),
         r"moe_experts \(gate_up\): b_fp8 is of a \[4, 16, 8\] weight"),
        (lambda: moe_experts(x, ids, probs, layer.w_gate_up, layer.w_down, main_grads=(ids, ids)),
         "main_grads go with an fp8 config"),
        (lambda: moe_experts(x, ids, probs, layer.w_gate_up, layer.w_down, Float8Config(),
                             main_grads=(torch.zeros_like(layer.w_down), torch.zeros_like(layer.w_down))),
         r"moe_experts \(gate_up\): main_grad"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match) as err:
            call()
        assert "\n" not in str(err.value)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [None, Float8Config()], ids=["bf16", "fp8"])
def test_gpu_training_step_replays_under_cuda_graphs(fp8):
    """DeepSeek-V3's router over 64 experts (hidden 1024, intermediate 512, 2048 tokens): forward and
    backward captured once and replayed on new tokens equal eager bit for bit; close to float64."""
    torch.manual_seed(0)
    router = RouterConfig(64, 8, "sigmoid", n_group=8, topk_group=4, renormalize=True, scaling_factor=2.5)
    layer = MoEMLP(1024, 512, router, expert_bias=True, fp8=fp8, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(2048, 1024, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    grad_out = torch.randn_like(x)
    params = (x, layer.gate, layer.w_gate_up, layer.w_down)

    def step():
        for p in params:
            p.grad = None
        out, routing = layer(x)
        ((out * grad_out).sum() + 1e-2 * routing.aux_loss + 1e-3 * routing.z_loss).backward()
        return out, routing.tokens_per_expert, *(p.grad for p in params)

    replayed, eager = replay_and_eager(step, (x,))
    for got, want in zip(replayed, eager, strict=True):
        assert torch.equal(got, want)
    out, counts = eager[0], eager[1]
    assert int(counts.sum()) == 2048 * 8
    params64 = [p.detach().double().requires_grad_() for p in params]
    chosen = layer(x)[1].expert_ids
    ref, _, _ = torch_moe_mlp(*params64, router, layer.expert_bias.double(), chosen, loop_experts)
    # Five roundings in a row (logits, GateUP, SwiGLU, Down, the combine): below one bf16 output's 40 dB.
    assert snr_db(out, ref) >= (20 if fp8 else 30)


@pytest.mark.gpu
def test_gpu_forward_keeps_no_more_activation_memory_than_the_torch_layer():
    """Issue 17: the layer's forward (graph kept for the backward) holds no more memory than the torch
    layer of torch._grouped_mm calls on the same weights and tokens."""
    torch.manual_seed(0)
    layer = MoEMLP(1024, 512, RouterConfig(64, 8, renormalize=True), dtype=torch.bfloat16, device="cuda")
    x = torch.randn(4096, 1024, dtype=torch.bfloat16, device="cuda", requires_grad=True)

    def held(forward) -> int:
        forward()  # compiled and warm: what is measured is the activations, not first-call allocations
        return activation_bytes(forward)

    ours = held(lambda: layer(x))
    theirs = held(lambda: torch_moe_mlp(x, layer.gate, layer.w_gate_up, layer.w_down, layer.router))
    assert ours <= theirs, (ours / 2**20, theirs / 2**20)
