"""MoE token permute / unpermute and the router on one GPU, with the harness's timer: GB/s (bytes read +
written) of each pass next to a torch implementation (argsort + index_select / index_add_ for permute
and unpermute; topk + sigmoid or softmax, kernels/moe/reference.py, for the router) and, for permute and
unpermute, to the bandwidth of a plain copy of the permuted tensor measured in the same run (issue 17:
>= 85% of it). The router's acceptance is its ratio: forward + backward >= 5x torch.

DeepSeek-V3 sizes: 4096 and 32768 tokens, top-8, hidden 7168, bf16; 32 experts (an EP8 rank's local
experts) and 256 (global), skewed routing (an eighth of the experts draw most pairs). The router:
DeepSeek-V3's (256 experts, sigmoid, 8 groups, 4 kept, top-8, a selection bias) on bf16 logits with
an eighth of the experts favoured, the load-balancing and z-losses in the loss. With CUDA events
a call's host time shows where it exceeds its GPU time (Triton binds each launch in 50-120 us on the
lent host: permute is three launches); the router's rows end with a one-op graph's backward(), the
autograd engine's fixed cost that each fwd+bwd row pays. A training step pays it once for all its
layers: the "layers a backward()" row routes LAYERS layers' logits in one forward and one backward()
and reports the time per layer, as a model's step sees each router (both sides the same way); `--mode
cuda-graph` replays captured calls, the GPU time alone.

    python benchmarks/moe_ops.py --csv moe_ops.csv [--mode cuda-graph] [--ops router]"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch
from passes_report import report

import kernels  # noqa: F401  (interpreter switch before triton loads)
from harness.timing import Timer
from kernels.moe import RouterConfig, capacity_for, permute, route
from kernels.moe.permute import gather_rows, scatter_rows
from kernels.moe.reference import torch_route

HIDDEN, TOPK = 7168, 8


@dataclass(frozen=True)
class Shape:
    tokens: int
    experts: int
    pad_to: int

    @property
    def label(self) -> str:
        pad = f" pad{self.pad_to}" if self.pad_to > 1 else ""
        return f"dsv3 T{self.tokens} E{self.experts}{pad}"


SHAPES = tuple(Shape(t, e, p) for t in (4096, 32768) for e in (32, 256) for p in (1, 128))


def skewed_ids(tokens: int, experts: int, device: torch.device) -> torch.Tensor:
    """Top-k of random scores where an eighth of the experts get a head start: skewed, none empty."""
    g = torch.Generator(device=device).manual_seed(0)
    scores = torch.rand(tokens, experts, generator=g, device=device)
    scores[:, : max(1, experts // 8)] += 0.35
    return scores.topk(TOPK, dim=1).indices


def rows_for_shape(shape: Shape, timer: Timer, copy_timer: Timer) -> list[dict[str, object]]:
    device = torch.device("cuda")
    T, E, H, K = shape.tokens, shape.experts, HIDDEN, TOPK
    # The copy's buffers first, in the same place each shape, so the reference does not move with the
    # allocations around it.
    copy_src = torch.empty(T * K, H, dtype=torch.bfloat16, device=device)
    copy_dst = torch.empty_like(copy_src)
    x = torch.randn(T, H, dtype=torch.bfloat16, device=device)
    probs = torch.rand(T, K, device=device)
    ids = skewed_ids(T, E, device)
    elt = x.element_size()
    capacity = capacity_for(T, K, E, shape.pad_to)
    r = permute(x, ids, probs, num_experts=E, pad_to=shape.pad_to)
    rows = r.row_map.rows
    grad_permuted = torch.randn_like(r.permuted)
    grad_out = torch.randn_like(x)
    out = torch.empty_like(x)
    grad_h = torch.empty_like(r.permuted)
    grad_probs = torch.empty_like(probs)

    # torch: the pairs sorted by expert (stable), tokens gathered and combined through that order.
    def torch_order() -> tuple[torch.Tensor, torch.Tensor]:
        order = torch.argsort(ids.reshape(-1), stable=True)
        return order, order // K

    order, token_of_row = torch_order()
    sorted_probs = probs.reshape(-1)[order]
    permuted_t = x.index_select(0, token_of_row)

    def torch_permute() -> tuple[torch.Tensor, ...]:
        o, tok = torch_order()
        flat = ids.reshape(-1)  # bincount would read its max on the host: scatter_add_ is graph-safe
        counts = torch.zeros(E, dtype=torch.int64, device=device).scatter_add_(0, flat, torch.ones_like(flat))
        return x.index_select(0, tok), probs.reshape(-1)[o], counts

    def torch_unpermute() -> torch.Tensor:
        return torch.zeros_like(x).index_add_(0, token_of_row, permuted_t * sorted_probs.to(x.dtype)[:, None])

    def torch_permute_bwd() -> torch.Tensor:
        return torch.zeros_like(x).index_add_(0, token_of_row, grad_permuted[: T * K])

    def torch_unpermute_bwd() -> tuple[torch.Tensor, torch.Tensor]:
        g = grad_out.index_select(0, token_of_row)
        return g * sorted_probs.to(x.dtype)[:, None], (g.float() * permuted_t.float()).sum(1)

    def unpermute_bwd() -> None:
        scatter_rows(grad_out, r.row_map, probs, grad_h, r.permuted, grad_probs)

    def copy_gbps() -> float:
        return 2 * copy_src.numel() * elt / copy_timer.time(lambda: copy_dst.copy_(copy_src)).median_ms / 1e6

    copy_before = copy_gbps()
    token_bytes, pairs_bytes, cap_bytes = T * H * elt, T * K * H * elt, capacity * H * elt
    passes: list[tuple[str, Callable[[], object], Callable[[], object], float]] = [
        # permute: each token read once, every row of the capacity written
        ("permute fwd", lambda: permute(x, ids, probs, num_experts=E, pad_to=shape.pad_to), torch_permute,
         token_bytes + cap_bytes),
        # unpermute: topk rows read per token, one written
        ("unpermute fwd", lambda: gather_rows(r.permuted, rows, probs, out), torch_unpermute,
         pairs_bytes + token_bytes),
        ("permute bwd", lambda: gather_rows(grad_permuted, rows, None, out), torch_permute_bwd,
         pairs_bytes + token_bytes),
        # unpermute's backward also reads the permuted rows, for the probabilities' gradient
        ("unpermute bwd", unpermute_bwd, torch_unpermute_bwd, token_bytes + pairs_bytes + cap_bytes),
    ]
    timed = [(name, timer.time(ours).median_ms, timer.time(theirs).median_ms, nbytes)
             for name, ours, theirs, nbytes in passes]
    # The copy before and after the passes, the better one: a reference that drifts (clocks, where the
    # buffers landed) is taken at its best, which only lowers our ratios.
    copy = max(copy_before, copy_gbps())
    return [{
        "label": shape.label, "pass": name, "ours_ms": t_ours, "ours_GBps": nbytes / t_ours / 1e6, "copy_GBps": copy,
        "of_copy": nbytes / t_ours / 1e6 / copy, "anchor": "torch", "anchor_ms": t_theirs,
        "anchor_GBps": nbytes / t_theirs / 1e6, "ratio": t_theirs / t_ours,
    } for name, t_ours, t_theirs, nbytes in timed]


ROUTER_TOKENS = (4096, 32768)


# Routers a step's "layers a backward()" row runs: DeepSeek-V3 has 58 MoE layers, a pipeline stage of
# 8-16 GPUs holds several.
LAYERS = 8

Router = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]


def router_rows(tokens: int, timer: Timer, device: torch.device) -> list[dict[str, object]]:
    """DeepSeek-V3's router, forward alone and forward + backward (from upstream gradients of the
    probabilities and both auxiliary losses), against torch_route on the same bf16 logits; and forward +
    backward of LAYERS layers' routers in one backward(), per layer."""
    config = RouterConfig.deepseek_v3()
    E, K = config.num_experts, config.topk
    g = torch.Generator(device=device).manual_seed(0)
    layer_logits = []
    for _ in range(LAYERS):
        logits = torch.randn(tokens, E, generator=g, device=device)
        logits[:, : E // 8] += 1.0
        layer_logits.append(logits.bfloat16().requires_grad_())
    logits = layer_logits[0]
    bias = 0.05 * torch.randn(E, generator=g, device=device)
    grad_probs = torch.randn(tokens, K, generator=g, device=device)

    def ours(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        r = route(x, config, bias)
        return r.probs, r.aux_loss, r.z_loss

    def theirs(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        probs, _, _, aux_loss, z_loss = torch_route(x, config, bias)
        return probs, aux_loss, z_loss

    # The upstream gradients of the three outputs, as a model's loss would hand them back: the backward
    # starts from them (the loss's own ops are the model's work, not the router's).
    grads = (grad_probs, torch.tensor(0.01, device=device), torch.tensor(0.001, device=device))

    def step(router: Router, inputs: list[torch.Tensor]) -> Callable[[], None]:
        """Each input's router forward, then one backward() through all of them."""
        def run() -> None:
            outputs = []
            for x in inputs:
                x.grad = None
                outputs += router(x)
            torch.autograd.backward(outputs, grads * len(inputs))
        return run

    # forward: the logits read, probabilities and ids written; backward: the logits read, their gradient written
    fwd_bytes = tokens * E * logits.element_size() + tokens * K * 8
    bwd_bytes = 2 * tokens * E * logits.element_size() + tokens * K * 8
    # (pass, ours, torch's, bytes, routers a call)
    passes = [("router fwd", lambda: ours(logits), lambda: theirs(logits), fwd_bytes, 1),
              ("router fwd+bwd", step(ours, [logits]), step(theirs, [logits]), fwd_bytes + bwd_bytes, 1),
              (f"router fwd+bwd, {LAYERS} layers a backward(), per layer", step(ours, layer_logits),
               step(theirs, layer_logits), fwd_bytes + bwd_bytes, LAYERS)]
    rows = []
    for name, mine, torch_impl, nbytes, routers in passes:
        t_ours, t_torch = timer.time(mine).median_ms / routers, timer.time(torch_impl).median_ms / routers
        rows.append({
            "label": f"dsv3 T{tokens} E{E}", "pass": name, "ours_ms": t_ours, "ours_GBps": nbytes / t_ours / 1e6,
            "copy_GBps": float("nan"), "of_copy": float("nan"), "anchor": "torch", "anchor_ms": t_torch,
            "anchor_GBps": nbytes / t_torch / 1e6, "ratio": t_torch / t_ours,
        })
    # What any op's own backward() call costs here, whatever the op: the autograd engine's fixed cost, which
    # both fwd+bwd rows above pay and a training step pays once for the whole model.
    x = torch.zeros(8, device=device, requires_grad=True)

    def one_op_step() -> None:
        x.grad = None
        (2 * x).sum().backward()

    rows.append({"label": f"dsv3 T{tokens} E{E}", "pass": "backward() of a one-op graph",
                 "ours_ms": timer.time(one_op_step).median_ms})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="keep shapes whose label contains this")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--csv", default=None, help="write all rows here")
    parser.add_argument("--mode", choices=("cuda-events", "cuda-graph"), default="cuda-events")
    parser.add_argument("--ops", default="permute,router", help="comma-separated: permute (and unpermute), router")
    args = parser.parse_args()
    device = torch.device("cuda")
    timer = Timer(device, mode=args.mode, repeats=args.repeats, warmup=3)
    # The copy always with CUDA events: replayed from a graph, a device-to-device memcpy node may run on
    # the copy engines, slower than the SMs' copy the kernels are held to.
    copy_timer = Timer(device, repeats=args.repeats, warmup=3)
    ops = set(args.ops.split(","))
    rows = []
    for shape in SHAPES:
        if "permute" in ops and args.only in shape.label:
            rows += rows_for_shape(shape, timer, copy_timer)
            torch.cuda.empty_cache()
    for tokens in ROUTER_TOKENS:
        if "router" in ops and args.only in f"dsv3 T{tokens}":
            rows += router_rows(tokens, timer, device)
    report(rows, f"MoE permute / unpermute (bf16, top-8, hidden 7168) and router ({args.mode})",
           ("label", "pass", "ours_ms", "ours_GBps", "copy_GBps", "of_copy", "anchor_GBps", "ratio"), args.csv)


if __name__ == "__main__":
    main()
