"""The OpSpecs of the MoE ops: permute, unpermute and the router (memory-bound, timed in GB/s) and the
layer's experts (moe_mlp: kernels/moe/experts.py's moe_experts for a given routing, in TFLOPS of the expert
GEMMs).

The registry finds an op by its package (`kernels/<op>/spec.py` defining SPEC): the thin packages
kernels/moe_permute, kernels/moe_unpermute, kernels/moe_router and kernels/moe_mlp each take theirs from
here, and their mutable files are this package's sources. This module is named `specs`, not `spec`, so
that kernels/moe itself is no op.

Routing in every problem is skewed: the first eighth of the experts draw a head start and the last
sixteenth are never chosen (empty experts), seeded by the problem.

Backward runners time the backward kernels alone, so what a forward keeps for its backward comes from the
inputs: the row map (permute, unpermute) from a torch stable sort of the expert ids, and the router's
choice (ids and tokens per expert, float32: refilled with the logits when the harness refills the
inputs in place, which it does for floating tensors only) from the float64 torch router.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from kernels.common.dtypes import dtype_name
from kernels.common.opspec import OpSpec, Problem, Runner, Tensors
from kernels.grouped_gemm import grouped_dgrad, grouped_forward, grouped_wgrad
from kernels.moe.experts import moe_experts, swiglu_backward, swiglu_forward
from kernels.moe.permute import RowMap, capacity_for, gather_rows, permute, route_and_scatter, scatter_rows, unpermute
from kernels.moe.reference import grouped_mm_experts, loop_experts, torch_moe_experts, torch_permute_rows, torch_route
from kernels.moe.router import RouterConfig, route, router_backward, router_forward

# DeepSeek-V3's routed_scaling_factor, for the sigmoid problems (the softmax models scale by 1).
SIGMOID_SCALING = 2.5


def _generator(problem: Problem) -> torch.Generator:
    return torch.Generator(device=problem.device).manual_seed(problem.seed)


def skewed_ids(tokens: int, experts: int, topk: int, g: torch.Generator, device: torch.device) -> torch.Tensor:
    """expert ids [T, topk] int64: top-k of random scores, the first eighth of the experts ahead, the last
    sixteenth never picked (while topk experts remain)."""
    scores = torch.rand(tokens, experts, generator=g, device=device)
    scores[:, : max(1, experts // 8)] += 0.35
    empty = min(experts // 16, experts - topk)
    if empty:
        scores[:, experts - empty:] -= 2.0
    return scores.topk(topk, dim=1).indices


# --- permute and unpermute -----------------------------------------------------------------------------


def _token_inputs(problem: Problem, extra: Callable[[torch.Generator, int], Tensors]) -> Tensors:
    """ids, probs and the row map (rows, group_offs, counts) of a problem, and what `extra` adds."""
    d, g = problem.dims, _generator(problem)
    ids = skewed_ids(d["T"], d["E"], d["topk"], g, problem.device)
    rows, group_offs, counts = torch_permute_rows(ids, d["E"], d["pad_to"])
    probs = torch.rand(d["T"], d["topk"], generator=g, device=problem.device)
    capacity = capacity_for(d["T"], d["topk"], d["E"], d["pad_to"])
    return {"ids": ids, "rows": rows, "group_offs": group_offs, "counts": counts, "probs": probs,
            **extra(g, capacity)}


def _randn(problem: Problem, g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g, device=problem.device).to(problem.dtype)


def _pair_tokens(rows: torch.Tensor) -> torch.Tensor:
    """The token of each (token, k) pair, in the flat order of rows."""
    return torch.arange(rows.numel(), device=rows.device) // rows.shape[1]


def _row_map(problem: Problem, inputs: Tensors) -> RowMap:
    d = problem.dims
    return RowMap(inputs["rows"], inputs["group_offs"], inputs["counts"],
                  capacity_for(d["T"], d["topk"], d["E"], d["pad_to"]))


def _token_bytes(problem: Problem) -> tuple[float, float, float, float]:
    """Bytes of the tokens [T, H], of their T*topk copies, of the padded capacity, of a [T, topk] fp32."""
    d = problem.dims
    size = torch.tensor([], dtype=problem.dtype).element_size()
    capacity = capacity_for(d["T"], d["topk"], d["E"], d["pad_to"])
    pairs = d["T"] * d["topk"]
    return float(d["T"] * d["H"] * size), float(pairs * d["H"] * size), float(capacity * d["H"] * size), pairs * 4.0


def permute_inputs(problem: Problem) -> Tensors:
    """x [T, H], ids, probs, the row map, and the gradients of the permuted tokens and probabilities."""
    H = problem.dims["H"]
    return _token_inputs(problem, lambda g, capacity: {
        "x": _randn(problem, g, problem.dims["T"], H),
        "grad_out": _randn(problem, g, capacity, H),
        "grad_out_probs": torch.randn(capacity, generator=g, device=problem.device),
    })


def permute_outputs(problem: Problem, inputs: Tensors) -> Tensors:
    x, probs = inputs["x"], inputs["probs"]
    return {"out": torch.empty_like(inputs["grad_out"]), "out_probs": torch.empty_like(inputs["grad_out_probs"]),
            "dx": torch.empty_like(x), "dprobs": torch.empty_like(probs)}


def permute_reference(inputs: Tensors) -> Tensors:
    """Each pair's copy of its token (and probability) on its row, zeros elsewhere, in the inputs' dtypes
    (copies are exact: a float64 [capacity, H] would be 17 GB at DeepSeek-V3's 32k tokens); the gradients in
    float64, the tokens' summed over each token's copies one k at a time."""
    rows, x, probs = inputs["rows"], inputs["x"], inputs["probs"]
    flat = rows.reshape(-1).long()
    capacity = inputs["grad_out"].shape[0]
    grad = inputs["grad_out"]
    dx = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for k in range(rows.shape[1]):
        dx += grad.index_select(0, rows[:, k].long()).double()
    return {
        "out": x.new_zeros(capacity, x.shape[1]).index_copy_(0, flat, x.index_select(0, _pair_tokens(rows))),
        "out_probs": probs.new_zeros(capacity).index_copy_(0, flat, probs.reshape(-1)),
        "dx": dx,
        "dprobs": inputs["grad_out_probs"].double()[flat].view(rows.shape),
    }


def permute_bytes(problem: Problem) -> tuple[float, float]:
    """Forward: the tokens read, every row of the capacity written (and the probabilities); backward: each
    pair's row read, the tokens written."""
    tokens, pairs, capacity, pair_probs = _token_bytes(problem)
    rows_probs = capacity / problem.dims["H"] / torch.tensor([], dtype=problem.dtype).element_size() * 4
    return tokens + capacity + pair_probs + rows_probs, pairs + tokens + 2 * pair_probs


def _permute_forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    route_and_scatter(inputs["x"], inputs["ids"], inputs["probs"], problem.dims["E"], problem.dims["pad_to"],
                      outputs["out"].shape[0], outputs["out"], outputs["out_probs"])


def _permute_backward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    gather_rows(inputs["grad_out"], inputs["rows"], None, outputs["dx"], inputs["grad_out_probs"], outputs["dprobs"])


def permute_train_step(problem: Problem, inputs: Tensors) -> Tensors:
    x, probs = (inputs[n].detach().clone().requires_grad_() for n in ("x", "probs"))
    p = permute(x, inputs["ids"], probs, num_experts=problem.dims["E"], pad_to=problem.dims["pad_to"])
    ((p.permuted * inputs["grad_out"]).sum() + (p.permuted_probs * inputs["grad_out_probs"]).sum()).backward()
    return {"out": p.permuted.detach(), "out_probs": p.permuted_probs.detach(), "dx": x.grad, "dprobs": probs.grad}


def _torch_permute_forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> Tensors:
    """argsort + index_select into a zeroed capacity (the row map computed in the timed call)."""
    d = problem.dims
    rows = torch_permute_rows(inputs["ids"], d["E"], d["pad_to"])[0].reshape(-1).long()
    x, capacity = inputs["x"], outputs["out"].shape[0]
    tokens = _pair_tokens(inputs["ids"])
    return {"out": x.new_zeros(capacity, x.shape[1]).index_copy_(0, rows, x.index_select(0, tokens)),
            "out_probs": inputs["probs"].new_zeros(capacity).index_copy_(0, rows, inputs["probs"].reshape(-1))}


def _torch_permute_backward(problem: Problem, inputs: Tensors, outputs: Tensors) -> Tensors:
    rows, grad = inputs["rows"].reshape(-1).long(), inputs["grad_out"]
    return {"dx": torch.zeros_like(inputs["x"]).index_add_(0, _pair_tokens(inputs["rows"]), grad.index_select(0, rows)),
            "dprobs": inputs["grad_out_probs"][rows].view(inputs["rows"].shape)}


def unpermute_inputs(problem: Problem) -> Tensors:
    """h [capacity, H] (the experts' output), ids, probs, the row map, and the gradient of the tokens."""
    d = problem.dims
    return _token_inputs(problem, lambda g, capacity: {
        "h": _randn(problem, g, capacity, d["H"]), "grad_out": _randn(problem, g, d["T"], d["H"])})


def unpermute_outputs(problem: Problem, inputs: Tensors) -> Tensors:
    return {"out": torch.empty_like(inputs["grad_out"]), "dh": torch.empty_like(inputs["h"]),
            "dprobs": torch.empty_like(inputs["probs"])}


def unpermute_reference(inputs: Tensors) -> Tensors:
    """float64 autograd of out[t] = sum_k probs[t, k] * h[rows[t, k]] (index_select + index_add_)."""
    h = inputs["h"].double().requires_grad_()
    probs = inputs["probs"].double().requires_grad_()
    rows = inputs["rows"].reshape(-1).long()
    picked = h.index_select(0, rows) * probs.reshape(-1, 1)
    out = picked.new_zeros(inputs["grad_out"].shape).index_add(0, _pair_tokens(inputs["rows"]), picked)
    dh, dprobs = torch.autograd.grad(out, (h, probs), inputs["grad_out"].double())
    return {"out": out.detach(), "dh": dh, "dprobs": dprobs}


def unpermute_bytes(problem: Problem) -> tuple[float, float]:
    """Forward: topk rows read a token, the token written; backward: the token's gradient read, every row of
    the capacity written, and each pair's row read again for the probabilities' gradient."""
    tokens, pairs, capacity, pair_probs = _token_bytes(problem)
    return pairs + tokens + pair_probs, tokens + capacity + pairs + 2 * pair_probs


def _unpermute_forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    gather_rows(inputs["h"], inputs["rows"], inputs["probs"], outputs["out"])


def _unpermute_backward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    scatter_rows(inputs["grad_out"], _row_map(problem, inputs), inputs["probs"], outputs["dh"], inputs["h"],
                 outputs["dprobs"])


def unpermute_train_step(problem: Problem, inputs: Tensors) -> Tensors:
    h, probs = (inputs[n].detach().clone().requires_grad_() for n in ("h", "probs"))
    out = unpermute(h, _row_map(problem, inputs), probs)
    (out * inputs["grad_out"]).sum().backward()
    return {"out": out.detach(), "dh": h.grad, "dprobs": probs.grad}


def _torch_unpermute_forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> Tensors:
    rows, h, probs = inputs["rows"].reshape(-1).long(), inputs["h"], inputs["probs"]
    picked = h.index_select(0, rows) * probs.reshape(-1, 1).to(h.dtype)
    return {"out": torch.zeros_like(inputs["grad_out"]).index_add_(0, _pair_tokens(inputs["rows"]), picked)}


def _torch_unpermute_backward(problem: Problem, inputs: Tensors, outputs: Tensors) -> Tensors:
    rows, h, probs = inputs["rows"].reshape(-1).long(), inputs["h"], inputs["probs"]
    grad = inputs["grad_out"].index_select(0, _pair_tokens(inputs["rows"]))
    return {"dh": torch.zeros_like(h).index_copy_(0, rows, grad * probs.reshape(-1, 1).to(h.dtype)),
            "dprobs": (grad.float() * h.index_select(0, rows).float()).sum(1).view(probs.shape)}


def _token_formats(*names: str) -> Callable[[Problem], dict[str, str]]:
    """The tokens' gradients and copies at the problem's dtype; probabilities and their gradients fp32."""
    def formats(problem: Problem) -> dict[str, str]:
        return {n: "fp32" if "probs" in n else dtype_name(problem.dtype) for n in names}
    return formats


def _unpermute_flops(problem: Problem) -> tuple[float, float]:
    """A multiply-add per element of each pair's row: the weighted sum; backward the scaling and the dots."""
    pair_elements = problem.dims["T"] * problem.dims["topk"] * problem.dims["H"]
    return 2.0 * pair_elements, 3.0 * pair_elements


PERMUTE = OpSpec(
    name="moe_permute",
    description="MoE token permute: tokens sorted by expert (padded per expert), forward and backward",
    mutable_files=("kernels/moe/permute.py",),
    schema="moe_permute",
    shape_family="moe_tokens",
    dtypes=("bf16", "fp16"),
    forward_outputs=("out", "out_probs"),
    backward_outputs=("dx", "dprobs"),
    make_inputs=permute_inputs,
    make_outputs=permute_outputs,
    reference=permute_reference,
    flops=lambda problem: (0.0, problem.dims["T"] * problem.dims["topk"] * problem.dims["H"] * 1.0),
    bytes_moved=permute_bytes,
    snr_formats=_token_formats("out", "out_probs", "dx", "dprobs"),
    runner=Runner("turbo-opt", _permute_forward, _permute_backward),
    baselines=(Runner("torch index_select", _torch_permute_forward, _torch_permute_backward),),
    default_preset="deepseek-v3",
    train_step=permute_train_step,
)

UNPERMUTE = OpSpec(
    name="moe_unpermute",
    description="MoE token unpermute: each token's top-k expert outputs combined by its probabilities, "
                "forward and backward",
    mutable_files=("kernels/moe/permute.py",),
    schema="moe_unpermute",
    shape_family="moe_tokens",
    dtypes=("bf16", "fp16"),
    forward_outputs=("out",),
    backward_outputs=("dh", "dprobs"),
    make_inputs=unpermute_inputs,
    make_outputs=unpermute_outputs,
    reference=unpermute_reference,
    flops=_unpermute_flops,
    bytes_moved=unpermute_bytes,
    snr_formats=_token_formats("out", "dh", "dprobs"),
    runner=Runner("turbo-opt", _unpermute_forward, _unpermute_backward),
    baselines=(Runner("torch index_add_", _torch_unpermute_forward, _torch_unpermute_backward),),
    default_preset="deepseek-v3",
    train_step=unpermute_train_step,
)


# --- router --------------------------------------------------------------------------------------------


def router_config(problem: Problem) -> RouterConfig:
    """Sigmoid problems route as DeepSeek-V3 (renormalized, scaled by 2.5, a selection bias); softmax ones
    as Qwen3 and GPT-OSS (renormalized over the k)."""
    d = problem.dims
    sigmoid = bool(d["sigmoid"])
    return RouterConfig(d["E"], d["topk"], "sigmoid" if sigmoid else "softmax", n_group=d["n_group"],
                        topk_group=d["topk_group"], renormalize=True,
                        scaling_factor=SIGMOID_SCALING if sigmoid else 1.0)


def _config_of(inputs: Tensors) -> RouterConfig:
    """The config make_inputs wrote down (a CPU tensor: the reference sees the inputs alone)."""
    E, topk, sigmoid, n_group, topk_group = inputs["config"].tolist()
    return RouterConfig(E, topk, "sigmoid" if sigmoid else "softmax", n_group=n_group, topk_group=topk_group,
                        renormalize=True, scaling_factor=SIGMOID_SCALING if sigmoid else 1.0)


def distinct_logits(scores: torch.Tensor) -> torch.Tensor:
    """Logits in the order of scores [T, E] with no two alike in a row: each row's ranks times a power of
    two, exact in bf16 (integers up to 256 are) and spread over about [-4, 4]. Random bf16 logits tie
    often (about one token in eight at the top-8 boundary of 128 experts), and which of two equal experts
    a router takes is its own choice, not something to check against a reference."""
    E = scores.shape[1]
    ranks = scores.argsort(dim=1).argsort(dim=1).to(torch.float32)
    return (ranks - E // 2) * 2.0 ** math.floor(math.log2(8 / E))


def router_inputs(problem: Problem) -> Tensors:
    """Skewed logits [T, E] (an eighth of the experts ahead in most tokens, a sixteenth behind all others),
    tie-free; the bias (sigmoid only), the gradients of the probabilities and of both losses, and the float64
    router's choice."""
    d, g = problem.dims, _generator(problem)
    T, E = d["T"], d["E"]
    scores = torch.randn(T, E, generator=g, device=problem.device)
    scores[:, : max(1, E // 8)] += 1.0
    scores[:, E - min(E // 16, E - d["topk"]):] -= 8.0
    config = router_config(problem)
    inputs = {"logits": distinct_logits(scores).to(problem.dtype),
              "config": torch.tensor([E, d["topk"], d["sigmoid"], d["n_group"], d["topk_group"]])}
    if d["sigmoid"]:
        inputs["expert_bias"] = 0.05 * torch.randn(E, generator=g, device=problem.device)
    inputs["grad_probs"] = torch.randn(T, d["topk"], generator=g, device=problem.device)
    inputs["grad_aux"] = torch.rand((), generator=g, device=problem.device)
    inputs["grad_z"] = torch.rand((), generator=g, device=problem.device)
    bias = inputs.get("expert_bias")
    _, ids, counts, _, _ = torch_route(inputs["logits"].double(), config, bias.double() if bias is not None else None)
    # float32: the backward kernel reads ids of any numeric dtype (as int32) and scales by the counts either way
    inputs["chosen_ids"], inputs["chosen_counts"] = ids.float(), counts.float()
    return inputs


def router_outputs(problem: Problem, inputs: Tensors) -> Tensors:
    f32 = {"dtype": torch.float32, "device": problem.device}
    return {"probs": torch.empty(inputs["grad_probs"].shape, **f32), "aux_loss": torch.empty((), **f32),
            "z_loss": torch.empty((), **f32), "dlogits": torch.empty_like(inputs["logits"])}


def router_reference(inputs: Tensors) -> Tensors:
    logits = inputs["logits"].double().requires_grad_()
    bias = inputs.get("expert_bias")
    probs, _, _, aux_loss, z_loss = torch_route(logits, _config_of(inputs), bias.double() if bias is not None else None)
    loss = (probs * inputs["grad_probs"].double()).sum() + inputs["grad_aux"].double() * aux_loss \
        + inputs["grad_z"].double() * z_loss
    (dlogits,) = torch.autograd.grad(loss, logits)
    return {"probs": probs.detach(), "aux_loss": aux_loss.detach(), "z_loss": z_loss.detach(), "dlogits": dlogits}


def router_bytes(problem: Problem) -> tuple[float, float]:
    """Forward: the logits read, probabilities and ids written; backward: the logits and the ids and
    probabilities' gradient read, the logits' gradient written."""
    d = problem.dims
    logits = d["T"] * d["E"] * torch.tensor([], dtype=problem.dtype).element_size()
    pairs = d["T"] * d["topk"] * 8.0
    return logits + pairs, 2.0 * logits + pairs


def router_flops(problem: Problem) -> tuple[float, float]:
    """Approximate (the roofline's intensity only): a few operations per logit for the scores, one compare
    and select per logit for each of the topk picks; backward about twice the scores' work."""
    d = problem.dims
    per_logit = 8 + 2 * d["topk"]
    return float(d["T"] * d["E"] * per_logit), float(d["T"] * d["E"] * 16)


def router_formats(problem: Problem) -> dict[str, str]:
    return {"probs": "fp32", "aux_loss": "fp32", "z_loss": "fp32", "dlogits": dtype_name(problem.dtype)}


def _router_forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    router_forward(inputs["logits"], router_config(problem), inputs.get("expert_bias"), outputs["probs"],
                   outputs["aux_loss"], outputs["z_loss"])


def _router_backward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    router_backward(inputs["logits"], inputs["chosen_ids"], inputs["chosen_counts"], router_config(problem),
                    inputs["grad_probs"], inputs["grad_aux"], inputs["grad_z"], outputs["dlogits"])


def _router_loss(inputs: Tensors, probs: torch.Tensor, aux_loss: torch.Tensor, z_loss: torch.Tensor) -> torch.Tensor:
    return (probs * inputs["grad_probs"]).sum() + inputs["grad_aux"] * aux_loss + inputs["grad_z"] * z_loss


def router_train_step(problem: Problem, inputs: Tensors) -> Tensors:
    logits = inputs["logits"].detach().clone().requires_grad_()
    r = route(logits, router_config(problem), inputs.get("expert_bias"))
    _router_loss(inputs, r.probs, r.aux_loss, r.z_loss).backward()
    return {"probs": r.probs.detach(), "aux_loss": r.aux_loss.detach(), "z_loss": r.z_loss.detach(),
            "dlogits": logits.grad}


# The torch router's graph of its last forward (one slot, replaced by the next: a saved activation, not
# a result cache), so that its backward can be timed alone, as attention's baselines do.
_TORCH_GRAPH: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


def _torch_router_forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> Tensors:
    logits = inputs["logits"].detach().requires_grad_()
    probs, _, _, aux_loss, z_loss = torch_route(logits, router_config(problem), inputs.get("expert_bias"))
    _TORCH_GRAPH["torch"] = (_router_loss(inputs, probs, aux_loss, z_loss), logits)
    return {"probs": probs.detach(), "aux_loss": aux_loss.detach(), "z_loss": z_loss.detach()}


def _torch_router_backward(problem: Problem, inputs: Tensors, outputs: Tensors) -> Tensors:
    loss, logits = _TORCH_GRAPH["torch"]
    return {"dlogits": torch.autograd.grad(loss, logits, retain_graph=True)[0]}


ROUTER = OpSpec(
    name="moe_router",
    description="MoE top-k router: softmax or sigmoid scores, group-limited top-k with a selection bias, "
                "renormalized probabilities, tokens per expert, load-balancing and z-losses, forward and backward",
    mutable_files=("kernels/moe/router.py",),
    schema="moe_router",
    shape_family="moe_router",
    dtypes=("bf16", "fp16", "fp32"),
    forward_outputs=("probs", "aux_loss", "z_loss"),
    backward_outputs=("dlogits",),
    make_inputs=router_inputs,
    make_outputs=router_outputs,
    reference=router_reference,
    flops=router_flops,
    bytes_moved=router_bytes,
    snr_formats=router_formats,
    runner=Runner("turbo-opt", _router_forward, _router_backward),
    baselines=(Runner("torch topk", _torch_router_forward, _torch_router_backward),),
    default_preset="deepseek-v3",
    train_step=router_train_step,
)


# --- the layer's experts (moe_mlp) ---------------------------------------------------------------------
# The routing is an input (skewed, as above): the router is checked on its own (moe_router), and a layer
# that routed here would pick other experts than a float64 reference wherever two bf16 logits tie.


def mlp_inputs(problem: Problem) -> Tensors:
    """x [T, H], a skewed routing (ids, probs, its row map), the weight stacks [E, 2I, H] and [E, H, I], the
    output's gradient."""
    d = problem.dims
    H, I, E = d["H"], d["I"], d["E"]

    def extra(g: torch.Generator, capacity: int) -> Tensors:
        return {"x": _randn(problem, g, d["T"], H), "grad_out": _randn(problem, g, d["T"], H),
                "w_gate_up": (torch.randn(E, 2 * I, H, generator=g, device=problem.device) * H**-0.5).to(
                    problem.dtype),
                "w_down": (torch.randn(E, H, I, generator=g, device=problem.device) * I**-0.5).to(problem.dtype)}

    return _token_inputs(dataclasses.replace(problem, dims={**d, "pad_to": 1}), extra)


def mlp_outputs(problem: Problem, inputs: Tensors) -> Tensors:
    """The checked outputs and the activations the backward reads (permuted, h, a, y) with its own scratch."""
    rows = inputs["rows"].numel()
    x = inputs["x"]
    H, I2 = x.shape[1], inputs["w_gate_up"].shape[1]

    def empty(*shape: int) -> torch.Tensor:
        return torch.empty(shape, dtype=x.dtype, device=x.device)

    return {"out": torch.empty_like(x), "dx": torch.empty_like(x), "dprobs": torch.empty_like(inputs["probs"]),
            "dw_gate_up": torch.empty_like(inputs["w_gate_up"]), "dw_down": torch.empty_like(inputs["w_down"]),
            "permuted": empty(rows, H), "h": empty(rows, I2), "a": empty(rows, I2 // 2), "y": empty(rows, H),
            "grad_y": empty(rows, H), "grad_a": empty(rows, I2 // 2), "grad_h": empty(rows, I2),
            "grad_permuted": empty(rows, H)}


MLP_LEAVES = ("x", "probs", "w_gate_up", "w_down")
MLP_GRADS = ("dx", "dprobs", "dw_gate_up", "dw_down")


def mlp_reference(inputs: Tensors) -> Tensors:
    """float64 autograd of torch_moe_experts with one matmul per expert."""
    leaves = [inputs[n].double().requires_grad_() for n in MLP_LEAVES]
    x, probs, w_gate_up, w_down = leaves
    out = torch_moe_experts(x, inputs["ids"], probs, w_gate_up, w_down, loop_experts)
    grads = torch.autograd.grad(out, leaves, inputs["grad_out"].double())
    return {"out": out.detach(), **dict(zip(MLP_GRADS, grads, strict=True))}


def mlp_flops(problem: Problem) -> tuple[float, float]:
    """The expert GEMMs, as SonicMoE counts them: 6 * T * topk * H * I forward (GateUP 2I wide, Down),
    twice that backward (dgrad and wgrad of each)."""
    d = problem.dims
    fwd = 6.0 * d["T"] * d["topk"] * d["H"] * d["I"]
    return fwd, 2 * fwd


def mlp_bytes(problem: Problem) -> tuple[float, float]:
    """Forward: the weights read once, each pair's activations (permuted H, h 2I, a I, y H) written and read
    once; backward about twice that, and the weights' gradients written."""
    d = problem.dims
    size = torch.tensor([], dtype=problem.dtype).element_size()
    weights = 3 * d["E"] * d["H"] * d["I"] * size
    activations = 2 * d["T"] * d["topk"] * (2 * d["H"] + 3 * d["I"]) * size
    return float(weights + activations), float(3 * weights + 2 * activations)


def mlp_formats(problem: Problem) -> dict[str, str]:
    return dict.fromkeys(("out", *MLP_GRADS), dtype_name(problem.dtype))


def _mlp_row_map(problem: Problem, inputs: Tensors) -> RowMap:
    return _row_map(dataclasses.replace(problem, dims={**problem.dims, "pad_to": 1}), inputs)


def _mlp_forward(problem: Problem, inputs: Tensors, o: Tensors) -> None:
    offs = inputs["group_offs"]
    route_and_scatter(inputs["x"], inputs["ids"], None, problem.dims["E"], 1, o["permuted"].shape[0], o["permuted"],
                      None)
    grouped_forward(o["permuted"], inputs["w_gate_up"], offs, True, o["h"])
    swiglu_forward(o["h"], o["a"])
    grouped_forward(o["a"], inputs["w_down"], offs, True, o["y"])
    gather_rows(o["y"], inputs["rows"], inputs["probs"], o["out"])


def _mlp_backward(problem: Problem, inputs: Tensors, o: Tensors) -> None:
    offs = inputs["group_offs"]
    scatter_rows(inputs["grad_out"], _mlp_row_map(problem, inputs), inputs["probs"], o["grad_y"], o["y"], o["dprobs"])
    grouped_dgrad(o["grad_y"], inputs["w_down"], offs, True, o["grad_a"])
    grouped_wgrad(o["grad_y"], o["a"], offs, True, o["dw_down"])
    swiglu_backward(o["h"], o["grad_a"], o["grad_h"])
    grouped_dgrad(o["grad_h"], inputs["w_gate_up"], offs, True, o["grad_permuted"])
    grouped_wgrad(o["grad_h"], o["permuted"], offs, True, o["dw_gate_up"])
    gather_rows(o["grad_permuted"], inputs["rows"], None, o["dx"])


def mlp_train_step(problem: Problem, inputs: Tensors) -> Tensors:
    leaves = [inputs[n].detach().clone().requires_grad_() for n in MLP_LEAVES]
    x, probs, w_gate_up, w_down = leaves
    out = moe_experts(x, inputs["ids"], probs, w_gate_up, w_down)
    (out * inputs["grad_out"]).sum().backward()
    return {"out": out.detach(), **{name: leaf.grad for name, leaf in zip(MLP_GRADS, leaves, strict=True)}}


# The torch layer's graph of its last forward (one slot, as the router's baseline keeps).
_TORCH_MLP_GRAPH: dict[str, tuple[torch.Tensor, list[torch.Tensor]]] = {}


def _torch_mlp_forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> Tensors:
    """torch_moe_experts with torch._grouped_mm (a loop over the experts off the GPU)."""
    leaves = [inputs[n].detach().requires_grad_() for n in MLP_LEAVES]
    x, probs, w_gate_up, w_down = leaves
    experts = grouped_mm_experts if x.is_cuda else loop_experts
    out = torch_moe_experts(x, inputs["ids"], probs, w_gate_up, w_down, experts)
    _TORCH_MLP_GRAPH["torch"] = (out, leaves)
    return {"out": out.detach()}


def _torch_mlp_backward(problem: Problem, inputs: Tensors, outputs: Tensors) -> Tensors:
    out, leaves = _TORCH_MLP_GRAPH["torch"]
    grads = torch.autograd.grad(out, leaves, inputs["grad_out"], retain_graph=True)
    return dict(zip(MLP_GRADS, grads, strict=True))


MLP = OpSpec(
    name="moe_mlp",
    description="MoE layer experts for a given routing: permute -> GateUP grouped GEMM -> SwiGLU -> Down grouped "
                "GEMM -> unpermute, forward and backward (TFLOPS of the expert GEMMs)",
    mutable_files=("kernels/moe/experts.py", "kernels/moe/permute.py"),
    schema="moe_mlp",
    shape_family="moe_mlp",
    dtypes=("bf16", "fp16"),
    forward_outputs=("out",),
    backward_outputs=MLP_GRADS,
    make_inputs=mlp_inputs,
    make_outputs=mlp_outputs,
    reference=mlp_reference,
    flops=mlp_flops,
    bytes_moved=mlp_bytes,
    snr_formats=mlp_formats,
    runner=Runner("turbo-opt", _mlp_forward, _mlp_backward),
    baselines=(Runner("torch._grouped_mm layer", _torch_mlp_forward, _torch_mlp_backward),),
    default_preset="sonicmoe",
    train_step=mlp_train_step,
)
