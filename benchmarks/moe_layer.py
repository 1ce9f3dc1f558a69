"""The MoE MLP layer on one GPU, forward and forward + backward: kernels.moe.MoEMLP (bf16, and FP8 E4M3
rowwise) next to a torch layer of the same math (kernels/moe/reference.py: torch_route, argsort +
index_select, torch._grouped_mm for GateUP and Down, silu * up, index_add_), on the same weights and tokens,
with the harness's timer; `ratio` is torch's step time over the row's. TFLOPS count the expert GEMMs
only, as SonicMoE does: 6 * T * topk * H * I forward, twice that backward. Also the forward's activation
memory (peak allocated while the graph is alive, past what was allocated before). The backward starts from a
fixed gradient of the output and the routing losses' weights (no loss is computed: its kernels are no part of
the layer), and the tokens' gradient is handed on each microbatch, as a previous layer would take it.

Issue 17's acceptance (H100, bf16, skewed routing): >= 1.25x torch on DeepSeek-V3 (32 local experts, 4096
tokens) and Qwen3-235B, >= 2x on the SonicMoE configuration (32k tokens, hidden 4096, 128 experts, top-8,
inter 512); FP8 >= 1.3x our bf16; activation memory no larger than torch's.

`--accumulate N`: a gradient-accumulation loop, N microbatches per optimizer step timed as one call (step_ms
is that call over N: the weights' quantization is paid once per call, not hidden by a median); our FP8
layer quantizes its expert weights once per call (MoEMLP.quantize_weights), every microbatch reads them
and its expert wgrads add into bf16 main_grad buffers zeroed at the start of the call, as
benchmarks/training_step.py's expert steps do; the others accumulate .grad as autograd does.

    python benchmarks/moe_layer.py --csv moe_layer.csv [--mode cuda-graph] [--accumulate 8]
    python benchmarks/moe_layer.py --kernels --only sonicmoe --accumulate 8   # where each one's GPU time goes
    python benchmarks/moe_layer.py --kernels --launches --only sonicmoe      # each launch of a microbatch, in order"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch
from passes_report import report

import kernels  # noqa: F401  (interpreter switch before triton loads)
from harness.memory import activation_bytes
from harness.timing import Timer
from kernels.common.fp8 import Float8Config
from kernels.moe import ExpertWeightsFp8, MoEMLP, RouterConfig
from kernels.moe.reference import torch_moe_mlp

Forward = Callable[[ExpertWeightsFp8 | None], tuple[torch.Tensor, ...]]


@dataclass(frozen=True)
class Layer:
    label: str
    tokens: int
    hidden: int
    intermediate: int
    router: RouterConfig


LAYERS = (
    # an EP8 rank of DeepSeek-V3: 32 local experts, sigmoid routing in 8 groups of 4, 4 kept
    Layer("dsv3 E32 T4096", 4096, 7168, 2048,
          RouterConfig(32, 8, "sigmoid", n_group=8, topk_group=4, renormalize=True, scaling_factor=2.5)),
    Layer("qwen3-235b E128 T8192", 8192, 4096, 1536, RouterConfig(128, 8, renormalize=True)),
    Layer("sonicmoe E128 T32768", 32768, 4096, 512, RouterConfig(128, 8, renormalize=True)),
)


def skewed_tokens(layer: MoEMLP, tokens: int) -> torch.Tensor:
    """Tokens sharing a direction u that the first eighth of the experts' gate rows lean towards: their
    logits about 1 higher, so they draw most tokens (skewed routing, as a trained router's)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    H, E = layer.hidden, layer.router.num_experts
    u = torch.randn(H, generator=g, device="cuda")
    u /= u.norm()
    with torch.no_grad():
        layer.gate[: max(1, E // 8)] += (0.25 * u).to(layer.gate.dtype)
    return (torch.randn(tokens, H, generator=g, device="cuda") + 4 * u).bfloat16().requires_grad_()


@dataclass(frozen=True)
class Impl:
    """One implementation of a layer: its forward (a microbatch's, the weights already quantized), the
    quantization at an optimizer step's start (FP8 with --accumulate > 1), and one optimizer step's
    microbatches, forward and backward."""

    name: str
    forward: Forward
    quantize: Callable[[], ExpertWeightsFp8] | None
    step: Callable[[], None]


def layer_impls(spec: Layer, accumulate: int = 1) -> tuple[list[Impl], Callable[[], None]]:
    """The torch layer, our bf16 layer and our FP8 layer on the same weights and skewed tokens, and a
    function that clears every gradient they accumulate."""
    torch.manual_seed(0)
    bf16 = MoEMLP(spec.hidden, spec.intermediate, spec.router, expert_bias=spec.router.score_func == "sigmoid",
                  dtype=torch.bfloat16, device="cuda")
    x = skewed_tokens(bf16, spec.tokens)
    fp8 = MoEMLP(spec.hidden, spec.intermediate, spec.router, expert_bias=bf16.expert_bias is not None,
                 fp8=Float8Config(), dtype=torch.bfloat16, device="cuda")
    fp8.load_state_dict(bf16.state_dict())
    # The gradients a training loop hands the layer: its output's, and the routing losses' weights. Backward from
    # them, not from a loss computed here: a loss's own kernels (out * grad_out, its sum and their backward, 0.68
    # ms of SonicMoE's microbatch) are no part of the layer.
    grad_out = torch.randn_like(x)
    loss_weights = (torch.tensor(1e-2, device="cuda"), torch.tensor(1e-3, device="cuda"))
    params = (x, bf16.gate, bf16.w_gate_up, bf16.w_down, fp8.gate, fp8.w_gate_up, fp8.w_down)

    # The FP8 layer's gradient-accumulation buffers (--accumulate > 1): its expert wgrads add into them.
    main_grads = (torch.zeros_like(fp8.w_gate_up), torch.zeros_like(fp8.w_down)) if accumulate > 1 else None

    def ours(layer: MoEMLP) -> Forward:
        def forward(weights_fp8: ExpertWeightsFp8 | None = None) -> tuple[torch.Tensor, ...]:
            out, routing = layer(x, weights_fp8=weights_fp8, main_grads=main_grads if weights_fp8 else None)
            return out, routing.aux_loss, routing.z_loss
        return forward

    def quantize_fp8() -> ExpertWeightsFp8:
        """An optimizer step's start for the FP8 layer: its buffers zeroed, its weights quantized."""
        for buffer in main_grads:
            buffer.zero_()
        return fp8.quantize_weights()

    def torch_layer(weights_fp8: None = None) -> tuple[torch.Tensor, ...]:
        return torch_moe_mlp(x, bf16.gate, bf16.w_gate_up, bf16.w_down, spec.router, bf16.expert_bias)

    def step(forward: Forward, quantize: Callable[[], ExpertWeightsFp8] | None) -> Callable[[], None]:
        """One optimizer step's microbatches (one with accumulate 1: the weights quantized in the forward)."""
        def run() -> None:
            weights_fp8 = quantize() if quantize else None
            for _ in range(accumulate):
                # x stands for the previous layer's output: its gradient is handed on, not summed over microbatches
                x.grad = None
                out, aux_loss, z_loss = forward(weights_fp8)
                torch.autograd.backward((out, aux_loss, z_loss), (grad_out, *loss_weights))
        return run

    def clear_grads() -> None:
        for p in params:
            p.grad = None

    impls = [("torch", torch_layer, None), ("ours bf16", ours(bf16), None),
             ("ours fp8", ours(fp8), quantize_fp8 if accumulate > 1 else None)]
    return [Impl(name, forward, quantize, step(forward, quantize)) for name, forward, quantize in impls], clear_grads


def rows_for_layer(spec: Layer, timer: Timer, accumulate: int = 1) -> list[dict[str, object]]:
    impls, clear_grads = layer_impls(spec, accumulate)
    gemm_flops = 6.0 * spec.tokens * spec.router.topk * spec.hidden * spec.intermediate
    rows = []
    times = {}
    for impl in impls:
        clear_grads()
        weights_fp8 = impl.quantize() if impl.quantize else None  # a microbatch's forward: weights quantized
        fwd_ms = timer.time(lambda f=impl.forward, w=weights_fp8: f(w)).median_ms
        step_ms = timer.time(impl.step).median_ms / accumulate
        times[impl.name] = step_ms
        rows.append({"label": spec.label, "impl": impl.name, "fwd_ms": fwd_ms, "step_ms": step_ms,
                     "fwd_TFLOPS": gemm_flops / fwd_ms / 1e9, "step_TFLOPS": 3 * gemm_flops / step_ms / 1e9,
                     "fwd_act_MiB": activation_bytes(lambda f=impl.forward, w=weights_fp8: f(w)) / 2**20})
    for row in rows:
        row["ratio"] = times["torch"] / row["step_ms"]
        row["vs_ours_bf16"] = times["ours bf16"] / row["step_ms"]
    return rows


def kernel_tables(spec: Layer, accumulate: int, in_order: bool = False) -> None:
    """Each implementation's GPU kernels over one optimizer step (after a warm-up step), by total time, or
    (`in_order`) each launch in the order it ran with its time: the passes of one kernel apart."""
    impls, clear_grads = layer_impls(spec, accumulate)
    for impl in impls:
        clear_grads()
        impl.step()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            impl.step()
            torch.cuda.synchronize()
        print(f"=== {spec.label} {impl.name}, one step of {accumulate} microbatches")
        if not in_order:
            print(prof.key_averages().table(sort_by="device_time_total", row_limit=24, max_name_column_width=80))
            continue
        launches = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                          key=lambda e: e.time_range.start)
        for event in launches:
            print(f"{event.device_time / 1e3:8.3f} ms  {event.name[:100]}")
        print(f"{sum(e.device_time for e in launches) / 1e3:8.3f} ms  in {len(launches)} launches")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="keep layers whose label contains this")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--csv", default=None, help="write all rows here")
    parser.add_argument("--mode", choices=("cuda-events", "cuda-graph"), default="cuda-events")
    parser.add_argument("--accumulate", type=int, default=1,
                        help="microbatches per optimizer step, timed as one call (our FP8 layer quantizes its "
                             "expert weights once per step)")
    parser.add_argument("--kernels", action="store_true",
                        help="print each implementation's kernel table (torch.profiler) instead of timing")
    parser.add_argument("--launches", action="store_true",
                        help="with --kernels: every launch in order with its time, not the table by kernel")
    args = parser.parse_args()
    if args.accumulate < 1:
        parser.error("--accumulate must be at least 1")
    if args.launches and not args.kernels:
        parser.error("--launches goes with --kernels")
    if args.kernels:
        for spec in LAYERS:
            if args.only in spec.label:
                kernel_tables(spec, args.accumulate, args.launches)
                torch.cuda.empty_cache()
        return
    timer = Timer(torch.device("cuda"), mode=args.mode, repeats=args.repeats, warmup=3)
    rows = []
    for spec in LAYERS:
        if args.only in spec.label:
            rows += rows_for_layer(spec, timer, args.accumulate)
            torch.cuda.empty_cache()
    per = f", microbatches of {args.accumulate}" if args.accumulate > 1 else ""
    report(rows, f"MoE MLP layer, fwd + bwd, skewed routing ({args.mode}{per})",
           ("label", "impl", "fwd_ms", "step_ms", "fwd_TFLOPS", "step_TFLOPS", "fwd_act_MiB", "ratio",
            "vs_ours_bf16"), args.csv, group="impl")


if __name__ == "__main__":
    main()
