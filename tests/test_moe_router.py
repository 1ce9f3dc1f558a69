"""The MoE router (kernels/moe/router.py) against the float64 torch implementation (kernels/moe/reference.py):
softmax and sigmoid, group-limited top-k with a selection bias, renormalized and scaled; skewed logits,
empty experts, one token, top-1 and top-8; every buffer poisoned before the kernels write it; gradients
of the probabilities, the load-balancing loss and the z-loss by SNR. GPU: DeepSeek-V3 sizes and CUDA-graph
replay."""

import math

import pytest
import torch

from harness.snr import snr_db, snr_threshold
from kernels.common.dtypes import dtype_name
from kernels.moe import RouterConfig, route
from kernels.moe import router as router_module
from kernels.moe.reference import torch_route
from kernels.moe.specs import distinct_logits
from tests.graph_replay import replay_and_eager

DSV3 = RouterConfig.deepseek_v3()
# name: (config, tokens, logits kind, with a selection bias)
CASES = {
    "softmax-top2-skewed": (RouterConfig(6, 2), 37, "skewed", False),
    "softmax-top1-scaled": (RouterConfig(5, 1, scaling_factor=2.0), 29, "skewed", False),
    "softmax-top8-empty": (RouterConfig(24, 8, renormalize=True, scaling_factor=1.5), 21, "empty", False),
    "sigmoid-top8-one-token": (RouterConfig(16, 8, "sigmoid", renormalize=True), 1, "skewed", True),
    "sigmoid-top1-empty": (RouterConfig(12, 1, "sigmoid"), 33, "empty", True),
    "softmax-grouped": (RouterConfig(20, 3, n_group=4, topk_group=2), 25, "skewed", False),
    "deepseek-v3": (DSV3, 19, "skewed", True),
    "deepseek-v3-empty": (DSV3, 11, "empty", True),
}


def make_logits(case: str, dtype: torch.dtype, device, seed: int = 0):
    """(logits [T, E], bias [E] or None, config). skewed: the first eighth of the experts ahead in most
    tokens; empty: every third expert behind all others (chosen by no token)."""
    config, T, kind, with_bias = CASES[case]
    E = config.num_experts
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(T, E, generator=g, dtype=torch.float64)
    if kind == "skewed":
        scores[:, : max(1, E // 8)] += 2.0
    else:
        scores[:, ::3] -= 30.0
    bias = 0.1 * torch.randn(E, generator=g, dtype=torch.float32) if with_bias else None
    return distinct_logits(scores).to(device, dtype), bias.to(device) if with_bias else None, config


@pytest.fixture
def poisoned(monkeypatch):
    """torch.empty / empty_like hand out NaN (floats) or -7 (ints) while it is active: a kernel that leaves
    an output or a partial unwritten shows up in the results."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def fill(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(math.nan if t.is_floating_point() else -7)

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(real_empty_like(*a, **k)))


def check_forward(r, ref, config: RouterConfig, near_ties: int = 0) -> torch.Tensor:
    """ids and counts exact, but for up to `near_ties` tokens whose choice fp32 and float64 may break
    apart (two selection or group scores within rounding); the probabilities of the other tokens and the
    losses by SNR. Returns the tokens that agree."""
    probs, ids, counts, aux_loss, z_loss = ref
    assert r.expert_ids.dtype == torch.int32 and r.tokens_per_expert.dtype == torch.int64
    agree = (r.expert_ids.long() == ids).all(dim=1)
    assert int((~agree).sum()) <= near_ties
    assert int((r.tokens_per_expert - counts).abs().sum()) <= 2 * config.topk * near_ties
    floor = snr_threshold("fp32")
    assert snr_db(r.probs[agree], probs[agree]) >= floor
    assert snr_db(r.aux_loss, aux_loss) >= floor and snr_db(r.z_loss, z_loss) >= floor
    assert r.aux_loss.shape == () and r.z_loss.shape == ()
    assert int(counts.sum()) == ids.numel() and config.topk == ids.shape[1]
    return agree


@pytest.mark.parametrize("case", CASES)
def test_forward_matches_float64_into_poisoned_buffers(case, device, half_dtype, poisoned):
    logits, bias, config = make_logits(case, half_dtype, device)
    r = route(logits, config, bias)
    ref = torch_route(logits.double(), config, bias.double() if bias is not None else None)
    check_forward(r, ref, config)
    if CASES[case][2] == "empty":
        assert not bool(r.tokens_per_expert[::3].any())


def gradients(case: str, dtype: torch.dtype, device, seed: int = 1):
    """grad_logits of ours and of float64 autograd for each loss alone (probs, aux, z) and all together."""
    logits, bias, config = make_logits(case, dtype, device, seed)
    grad_probs = torch.randn(logits.shape[0], config.topk, device=device)
    weights = [(1.0, 0.0, 0.0), (0.0, 3.0, 0.0), (0.0, 0.0, 0.5), (1.0, 0.01, 0.001)]
    pairs = []
    for w_probs, w_aux, w_z in weights:
        ours = logits.clone().requires_grad_()
        ref = logits.double().requires_grad_()
        r = route(ours, config, bias)
        (r.probs * grad_probs * w_probs).sum().add(w_aux * r.aux_loss + w_z * r.z_loss).backward()
        probs, _, _, aux_loss, z_loss = torch_route(ref, config, bias.double() if bias is not None else None)
        ((probs * grad_probs.double()).sum() * w_probs + w_aux * aux_loss + w_z * z_loss).backward()
        pairs.append((ours.grad, ref.grad))
    return pairs


@pytest.mark.parametrize("case", CASES)
def test_gradients_of_probs_aux_and_z_losses_by_snr(case, device, half_dtype, poisoned):
    floor = snr_threshold(dtype_name(half_dtype))
    for got, want in gradients(case, half_dtype, device):
        assert got.dtype == half_dtype
        assert snr_db(got, want) >= floor


def test_fp32_logits(device):
    for got, want in gradients("deepseek-v3", torch.float32, device):
        assert snr_db(got, want) >= snr_threshold("fp32")


def test_programs_walking_several_blocks(device, half_dtype, monkeypatch, poisoned):
    """Fewer programs than blocks (as at 32k tokens): each walks several, the last one partly empty, and
    the losses kernel sums the partials of every program."""
    monkeypatch.setattr(router_module, "MAX_PROGRAMS", 2)
    config = RouterConfig(16, 4, "sigmoid", n_group=4, topk_group=2, renormalize=True)
    scores = torch.randn(300, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    logits = distinct_logits(scores).to(device, half_dtype).requires_grad_()
    assert router_module.cdiv(300, router_module._block_t(16)) > 4
    r = route(logits, config)
    ref_logits = logits.detach().double().requires_grad_()
    ref = torch_route(ref_logits, config)
    check_forward(r, ref, config)
    (r.probs.sum() + r.aux_loss + r.z_loss).backward()
    (ref[0].sum() + ref[3] + ref[4]).backward()
    assert snr_db(logits.grad, ref_logits.grad) >= snr_threshold(dtype_name(half_dtype))


def test_bias_steers_the_choice_but_not_the_weights(device, half_dtype):
    """A large bias on expert 3 puts it in every token's top-k, with its unbiased score as its weight."""
    config = RouterConfig(8, 2, "sigmoid")
    logits = distinct_logits(torch.randn(13, 8, generator=torch.Generator().manual_seed(4))).to(device, half_dtype)
    bias = torch.zeros(8, device=device)
    bias[3] = 10.0
    r = route(logits, config, bias)
    assert bool((r.expert_ids == 3).any(dim=1).all())
    at_three = r.probs[r.expert_ids == 3]
    assert torch.allclose(at_three, torch.sigmoid(logits[:, 3].float()), rtol=1e-6)


def test_unused_outputs_and_expanded_gradients(device, half_dtype):
    """A loss on the probabilities alone (the losses' gradients skipped) and a sum's expanded gradient."""
    logits, _, config = make_logits("softmax-top2-skewed", half_dtype, device)
    ours, ref = logits.clone().requires_grad_(), logits.double().requires_grad_()
    route(ours, config).probs.sum().backward()
    torch_route(ref, config)[0].sum().backward()
    assert snr_db(ours.grad, ref.grad) >= snr_threshold(dtype_name(half_dtype))


def test_bad_inputs_raise_one_line_value_errors(device):
    logits = torch.randn(4, 8, dtype=torch.float16, device=device)
    config = RouterConfig(8, 2)
    cases = [
        (lambda: RouterConfig(10, 2, n_group=4), "not divisible into n_group=4"),
        (lambda: RouterConfig(8, 9), r"topk must be an int in \[1, num_experts=8\]"),
        (lambda: RouterConfig(8, 0), "topk must be"),
        (lambda: RouterConfig(0, 1), "num_experts must be a positive int"),
        (lambda: RouterConfig(8, 2, "relu"), "score_func must be one of"),
        (lambda: RouterConfig(8, 2, n_group=4, topk_group=5), r"topk_group must be an int in \[1, n_group=4\]"),
        (lambda: RouterConfig(8, 6, n_group=4, topk_group=2), "topk=6 exceeds the 4 experts"),
        (lambda: route(logits, config=(8, 2)), "config must be a RouterConfig"),
        (lambda: route(logits[:, :6], config), r"logits must be \[T, num_experts=8\], got \[4, 6\]"),
        (lambda: route(logits[0], config), r"logits must be \[T, num_experts=8\]"),
        (lambda: route(logits[:0], config), "no tokens"),
        (lambda: route(logits.to(torch.int32), config), "logits must be float32, bfloat16 or float16"),
        (lambda: route(logits, config, torch.zeros(7, device=device)), r"expert_bias must be \[num_experts=8\]"),
        (lambda: route(logits, config, torch.zeros(8, dtype=torch.int64, device=device)), "expert_bias must be"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match) as err:
            call()
        assert "\n" not in str(err.value)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [4096, 32768])
def test_gpu_deepseek_v3_matches_float64(tokens):
    """DeepSeek-V3's router on bf16 logits: ids and counts exact but for a few near ties in 32k tokens,
    probabilities, losses and the logits' gradient by SNR against float64."""
    torch.manual_seed(0)
    scores = torch.randn(tokens, 256, device="cuda")
    scores[:, :32] += 1.0
    logits = distinct_logits(scores).bfloat16().requires_grad_()
    bias = 0.05 * torch.randn(256, device="cuda")
    grad_probs = torch.randn(tokens, 8, device="cuda")
    r = route(logits, DSV3, bias)
    ref_logits = logits.detach().double().requires_grad_()
    ref = torch_route(ref_logits, DSV3, bias.double())
    agree = check_forward(r, ref, DSV3, near_ties=tokens // 1000)
    ((r.probs * grad_probs).sum() + 0.01 * r.aux_loss + 0.001 * r.z_loss).backward()
    ((ref[0] * grad_probs.double()).sum() + 0.01 * ref[3] + 0.001 * ref[4]).backward()
    assert snr_db(logits.grad[agree], ref_logits.grad[agree]) >= snr_threshold("bf16")


@pytest.mark.gpu
def test_gpu_router_step_replays_under_cuda_graphs():
    """Forward and backward captured once, replayed on new logits: bit for bit the eager results."""
    torch.manual_seed(0)
    logits = torch.randn(4096, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    bias = 0.05 * torch.randn(256, device="cuda")
    grad_probs = torch.randn(4096, 8, device="cuda")

    def step():
        logits.grad = None
        r = route(logits, DSV3, bias)
        ((r.probs * grad_probs).sum() + 0.01 * r.aux_loss + 0.001 * r.z_loss).backward()
        return r.probs, r.expert_ids, r.tokens_per_expert, r.aux_loss, r.z_loss, logits.grad

    replayed, eager = replay_and_eager(step, (logits,))
    for got, want in zip(replayed, eager, strict=True):
        assert torch.equal(got, want)
