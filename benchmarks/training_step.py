"""The training step as a training loop sees it (issue 15): forward and backward through autograd, steps
timed back to back with the host's time in them, bf16 torch, our FP8 ops and torchao's FP8 training ops
side by side in one run; with each step's host time (its launches enqueued from an idle GPU), GPU kernel
time and kernel launches (torch.profiler), and the FP8 results' SNR against the bf16 step's.

With `--accumulate N`, a step is one microbatch of a gradient-accumulation loop: the weights' gradients
add up over N microbatches (as between two optimizer steps). Our FP8 ops quantize the weights once per
N microbatches (`prequantize_weight`, at the first one, inside the timed loop) and read that copy in
every microbatch (`b_fp8=`), as TransformerEngine's `is_first_microbatch` does; their wgrad adds into
a bf16 main_grad buffer (`main_grad=`, zeroed at the first microbatch) where autograd would add a
separate copy of the gradient. Times are per microbatch. bf16 and torchao run the same loop,
autograd accumulating their .grad (torchao quantizes its weights in every microbatch).

With `--graph`, each implementation's whole microbatch (forward, backward, gradient accumulation, and
at the first microbatch of an optimizer step the gradients' clearing and the weights' quantization) is
captured in CUDA graphs and replayed, the router's outcome copied into static inputs first: a loop with
full-iteration graphs (Megatron's, torch.compile's reduce-overhead) runs it so, with a few launches of
host work a microbatch. Eager is what a loop without graphs sees.

- dense: a Linear layer, y = x @ W^T, on the llama3 presets (QKV / O / gate_up / down / lm_head).
- moe: an expert MLP, GateUP -> SwiGLU -> Down as grouped GEMMs, the routed tokens split over the local
  experts by a skewed router drawn anew every step (group sizes in multiples of 16, which torchao needs;
  drawn before timing, kept on the GPU: no host sync). bf16 torch and torchao run the SwiGLU as torch
  ops; ours as kernels/moe does (FP8: computed inside the Down GEMM's quantization, never written);
  "bf16 ours" (our bf16 grouped GEMMs and SwiGLU kernels) shows what the SwiGLU's handling alone is worth.

    python3 benchmarks/training_step.py --suite dense --shapes llama3 --csv dense.csv
    python3 benchmarks/training_step.py --suite moe --csv moe.csv
    python3 benchmarks/training_step.py --suite moe --accumulate 8 --csv moe_acc8.csv
    python3 benchmarks/training_step.py --suite dense --shapes llama3-8b --graph --accumulate 8 --csv dense_graph.csv
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from passes_report import report

import kernels  # noqa: F401  (interpreter switch before triton loads)
from harness.shapes import load_shapes
from harness.snr import snr_db
from kernels.common.fp8 import Float8Config, Format, Granularity
from kernels.gemm_fp8 import gemm_fp8
from kernels.gemm_fp8 import prequantize_weight as prequantize_linear
from kernels.grouped_gemm import group_offsets, grouped_gemm
from kernels.grouped_gemm_fp8 import group_layout, grouped_gemm_fp8
from kernels.grouped_gemm_fp8 import prequantize_weight as prequantize_experts
from kernels.grouped_gemm_fp8.kernel import WeightFp8
from kernels.moe import swiglu, swiglu_down_fp8

# One microbatch of one implementation: its argument numbers it in the loop, which picks the router's
# outcome (MoE; a Linear has none) and whether it is the first microbatch after an optimizer step.
Step = Callable[[int], dict[str, torch.Tensor]]
DRAWS = 8
VARIANTS = {
    "e4m3-rowwise": Float8Config(Format.E4M3, Granularity.ROWWISE),
    "e4m3-blockwise": Float8Config(Format.E4M3, Granularity.BLOCKWISE),
    "hybrid-rowwise": Float8Config(Format.HYBRID, Granularity.ROWWISE),
}


@dataclass(frozen=True)
class MoECase:
    """The local experts of one expert-parallel rank and the tokens routed to them in one step."""

    experts: int
    hidden: int
    inter: int
    tokens: int
    top_k: int

    @property
    def routed(self) -> int:
        return self.tokens * self.top_k


# As issue 15 states them: DeepSeek-V3 (EP8 of 256 experts), Qwen3-235B (EP8 of 128), GPT-OSS-120B (EP4 of 128).
MOE_CASES = {
    "deepseek-v3": MoECase(experts=32, hidden=7168, inter=2048, tokens=4096, top_k=8),
    "qwen3-235b": MoECase(experts=16, hidden=4096, inter=1536, tokens=4096, top_k=8),
    "gpt-oss-120b": MoECase(experts=32, hidden=2880, inter=2880, tokens=4096, top_k=4),
}


def skewed_splits(total: int, groups: int, draws: int, seed: int) -> list[list[int]]:
    """`draws` router outcomes: log-normal expert popularity (sigma 0.6, as the harness's "topk" skew), no
    token dropped, every group a multiple of 16 (some empty)."""
    rng = np.random.default_rng(seed)
    blocks = total // 16
    splits = []
    for _ in range(draws):
        popularity = rng.lognormal(0.0, 0.6, size=groups)
        splits.append([16 * int(n) for n in rng.multinomial(blocks, popularity / popularity.sum())])
    return splits


def timed_steps(step: Step, microbatches: int, repeats: int = 3) -> float:
    """Milliseconds per microbatch, `microbatches` (whole accumulation cycles) run back to back between
    two events (the GPU waits for the host whenever the host is slower), a new router outcome each
    one, median over `repeats` loops."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for i in range(microbatches):
            step(i)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / microbatches)
    return statistics.median(times)


def host_ms(step: Step, accumulate: int, cycles: int = 10) -> float:
    """The host's time to enqueue one microbatch from an idle GPU (its launch queue empty, so it never
    blocks): each accumulation cycle's total over its microbatches, median over `cycles`."""
    totals = []
    for cycle in range(cycles):
        total = 0.0
        for i in range(cycle * accumulate, (cycle + 1) * accumulate):
            torch.cuda.synchronize()
            started = time.perf_counter()
            step(i)
            total += time.perf_counter() - started
        totals.append(total * 1e3 / accumulate)
    torch.cuda.synchronize()
    return statistics.median(totals)


def kernels_per_step(step: Step, microbatches: int) -> tuple[float, float]:
    """GPU kernel time (ms) and launches per microbatch, from torch.profiler's device events."""
    activity = torch.profiler.ProfilerActivity.CUDA
    with torch.profiler.profile(activities=[activity]) as prof:
        for i in range(microbatches):
            step(i)
        torch.cuda.synchronize()
    device = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in device) / 1e3 / microbatches, len(device) / microbatches


def whole_cycles(accumulate: int) -> int:
    """Microbatches in the fewest whole accumulation cycles that meet every router outcome."""
    return accumulate * math.ceil(DRAWS / accumulate)


def measure(label: str, impl: str, step: Step, flops: float, steps: int, accumulate: int) -> dict[str, object]:
    """One implementation's row: `steps` optimizer steps of `accumulate` microbatches per timed loop."""
    cycle = whole_cycles(accumulate)
    for i in range(cycle):  # the warm-up: compiles, autotunes, lazy imports
        step(i)
    ms = timed_steps(step, steps * accumulate)
    gpu_ms, launches = kernels_per_step(step, cycle)
    return {"label": label, "impl": impl, "step_ms": ms, "tflops": flops / ms / 1e9,
            "host_ms": host_ms(step, accumulate), "gpu_ms": gpu_ms, "launches": launches}


class Accumulation:
    """Gradient accumulation over `microbatches` per optimizer step, as an implementation takes part in
    it. Our FP8 ops: weight copies quantized at the first microbatch (`prequantize`) and read by the
    others, and, where the op offers it (`fused`), main_grad buffers the wgrad adds into, zeroed at the
    first microbatch. bf16 and torchao: autograd adds each microbatch's weight gradient into .grad.
    Without accumulation (one microbatch) every implementation runs its plain step."""

    def __init__(self, microbatches: int, weights: list[torch.Tensor],
                 prequantize: Callable[[torch.Tensor], WeightFp8] | None = None, fused: bool = False):
        self.microbatches, self.weights = microbatches, weights
        self.prequantize = prequantize if microbatches > 1 else None
        self.main_grads = [torch.zeros_like(w) for w in weights] if fused and microbatches > 1 else None
        self.copies: list[WeightFp8 | None] = [None] * len(weights)

    def start(self, i: int) -> None:
        """Microbatch i begins; the first one after an optimizer step clears the weights' gradients
        (zero_grad(set_to_none=True), or zeroing the main_grad buffers) and quantizes the weights."""
        if i % self.microbatches:
            return
        for w in self.weights:
            w.grad = None
        for buffer in self.main_grads or []:
            buffer.zero_()
        if self.prequantize is not None:
            self.copies = [self.prequantize(w) for w in self.weights]

    def op_args(self, j: int) -> dict[str, object]:
        """What our op reads for weight j: its FP8 copy and its main_grad buffer (None: none)."""
        return {"b_fp8": self.copies[j], "main_grad": self.main_grads[j] if self.main_grads else None}

    def grads(self) -> list[torch.Tensor | None]:
        """The weights' gradients accumulated so far in this optimizer step."""
        return self.main_grads or [w.grad for w in self.weights]


# One implementation's layer: (x, the router outcome's tensors...) -> y.
Layer = Callable[..., torch.Tensor]


def captured(body: Step, microbatches: int, refill: Callable[[int], None]) -> Step:
    """`body` (a microbatch reading static inputs) as a loop that captures its whole microbatch in CUDA
    graphs runs it (full-iteration graphs, as Megatron's and torch.compile's reduce-overhead): one graph
    for the first microbatch of an optimizer step (it clears the gradients, zeroes the main_grads and
    quantizes the weights), one for the others; each call copies the router's outcome into the static
    inputs (`refill`) and replays one graph. Captured on the first call, after a warm-up on a side stream
    that compiles every kernel, so that a step that cannot be captured fails where run_suite catches it."""
    graphs: list[torch.cuda.CUDAGraph] = []
    outputs: list[dict[str, torch.Tensor]] = []

    def capture() -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(2 * microbatches):
                body(i)
        torch.cuda.current_stream().wait_stream(side)
        for i in range(min(microbatches, 2)):  # i = 0: the first microbatch; i = 1: the others
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs.append(body(i))
            graphs.append(graph)

    def step(i: int) -> dict[str, torch.Tensor]:
        if not graphs:
            capture()
        refill(i)
        which = 0 if i % microbatches == 0 else 1
        graphs[which].replay()
        return outputs[which]

    return step


def steps_of(
    layers: dict[str, tuple[Layer, Accumulation]], x: torch.Tensor, grad: torch.Tensor,
    draw_inputs: Callable[[str, int], tuple[torch.Tensor, ...]], grad_names: list[str], graph: bool,
) -> dict[str, Step]:
    """Each implementation's microbatch: its layer on x and the router outcome the microbatch's number
    picks, then the backward of the upstream gradient; with `graph`, the whole microbatch captured."""

    def microbatch(layer: Layer, acc: Accumulation, inputs: Callable[[int], tuple[torch.Tensor, ...]]) -> Step:
        def step(i: int) -> dict[str, torch.Tensor]:
            x.grad = None
            acc.start(i)
            y = layer(x, *inputs(i))
            y.backward(grad)
            return {"out": y, "dx": x.grad} | dict(zip(grad_names, acc.grads(), strict=True))
        return step

    def step_of(impl: str, layer: Layer, acc: Accumulation) -> Step:
        if not graph:
            return microbatch(layer, acc, lambda i: draw_inputs(impl, i % DRAWS))
        static = tuple(t.clone() for t in draw_inputs(impl, 0))

        def refill(i: int) -> None:
            for buffer, value in zip(static, draw_inputs(impl, i % DRAWS), strict=True):
                buffer.copy_(value)
        return captured(microbatch(layer, acc, lambda i: static), acc.microbatches, refill)

    return {impl: step_of(impl, layer, acc) for impl, (layer, acc) in layers.items()}


def dense_steps(
    M: int, N: int, K: int, variants: list[str], torchao: bool, accumulate: int, graph: bool = False
) -> dict[str, Step]:
    """One Linear layer's microbatch per implementation, on the same x, W and upstream gradient."""
    gen = torch.Generator(device="cuda").manual_seed(M * 7 + N * 3 + K)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    grad = torch.randn(M, N, device="cuda", dtype=torch.bfloat16, generator=gen)
    weight = torch.nn.Parameter(torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=gen) / K**0.5)

    layers = {"bf16 torch": (lambda t: F.linear(t, weight), Accumulation(accumulate, [weight]))}
    for name in variants:
        c = VARIANTS[name]
        acc = Accumulation(accumulate, [weight], lambda w, c=c: prequantize_linear(w, config=c), fused=True)
        layers[f"ours {name}"] = (
            lambda t, c=c, acc=acc: gemm_fp8(t, weight, trans_b=True, config=c, **acc.op_args(0)), acc)
    if torchao:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        for recipe in ("rowwise", "tensorwise"):
            linear = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
            linear.weight = torch.nn.Parameter(weight.detach().clone())
            module = convert_to_float8_training(linear, config=Float8LinearConfig.from_recipe_name(recipe))
            layers[f"torchao {recipe}"] = (module, Accumulation(accumulate, [module.weight]))
    return steps_of(layers, x, grad, lambda impl, k: (), ["dw"], graph)


def moe_steps(
    case: MoECase, variants: list[str], torchao: bool, accumulate: int, graph: bool = False
) -> dict[str, Step]:
    """One expert MLP's microbatch per implementation, under the router outcome its number picks:
    group sizes for our op, their cumulative offsets for torch's and torchao's."""
    E, H, I, T = case.experts, case.hidden, case.inter, case.routed
    gen = torch.Generator(device="cuda").manual_seed(E * 31 + H)
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    grad = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=gen)
    w1 = torch.nn.Parameter(torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16, generator=gen) / H**0.5)
    w2 = torch.nn.Parameter(torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16, generator=gen) / I**0.5)
    weights = [w1, w2]
    splits = skewed_splits(T, E, DRAWS, seed=E + H)
    lens = [torch.tensor(s, device="cuda", dtype=torch.int64) for s in splits]
    offs = [torch.cumsum(n, 0, dtype=torch.int32) for n in lens]  # torch's and torchao's: group ends
    starts = [group_offsets(n) for n in lens]  # ours: [E + 1] group starts, as permute hands them over

    def mlp(gemm: Callable[[torch.Tensor, int, torch.Tensor], torch.Tensor]) -> Layer:
        """GateUP -> SwiGLU (torch ops) -> Down, gemm(tokens, weight index, the router outcome's tensor)."""
        def layer(t: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
            gate, up = gemm(t, 0, groups).chunk(2, dim=-1)
            return gemm(F.silu(gate) * up, 1, groups)
        return layer

    def ours_bf16(t: torch.Tensor, n: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """Our bf16 experts: grouped_gemm, our SwiGLU kernels, grouped_gemm."""
        return grouped_gemm(swiglu(grouped_gemm(t, w1, n, o)), w2, n, o)

    def ours_fp8(c: Float8Config, acc: Accumulation) -> Layer:
        """Our FP8 experts, as kernels/moe runs them: the SwiGLU computed inside the Down GEMM's quantization, the
        groups' token layout mapped once for both GEMMs."""
        def layer(t: torch.Tensor, n: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
            layout = group_layout(o, t.shape[0])
            h = grouped_gemm_fp8(t, w1, n, o, config=c, layout=layout, **acc.op_args(0))
            down = acc.op_args(1)
            return swiglu_down_fp8(h, w2, o, c, w_fp8=down["b_fp8"], main_grad=down["main_grad"], layout=layout)
        return layer

    layers = {"bf16 torch": (mlp(lambda a, j, o: torch._grouped_mm(a, weights[j].transpose(-2, -1), offs=o)),
                             Accumulation(accumulate, weights)),
              "bf16 ours": (ours_bf16, Accumulation(accumulate, weights))}
    for name in variants:
        c = VARIANTS[name]
        acc = Accumulation(accumulate, weights, lambda w, c=c: prequantize_experts(w, config=c), fused=True)
        layers[f"ours {name}"] = (ours_fp8(c, acc), acc)
    if torchao:
        from torchao.prototype.moe_training.fp8_grouped_mm import _to_fp8_rowwise_then_scaled_grouped_mm

        layers["torchao rowwise"] = (mlp(lambda a, j, o: _to_fp8_rowwise_then_scaled_grouped_mm(
            a, weights[j].transpose(-2, -1), o, pad_token_groups_for_grouped_mm=False)),
            Accumulation(accumulate, weights))
    return steps_of(layers, x, grad, lambda impl, k: (lens[k], starts[k]) if impl.startswith(("ours", "bf16 ours"))
                    else (offs[k],), ["dw1", "dw2"], graph)


def run_suite(
    cases: dict[str, tuple[Callable[[], dict[str, Step]], float]], steps: int, accumulate: int
) -> list[dict[str, object]]:
    """Every implementation on every case; each one's results (router outcome 0) checked against bf16
    torch's by SNR (a sanity check of what is timed, not the referee: that is `turbo-opt bench`)."""
    rows = []
    for label, (build, flops) in cases.items():
        impls = build()
        reference = {k: v.detach().clone() for k, v in impls["bf16 torch"](0).items()}
        bf16_ms = math.nan
        for impl in list(impls):
            step = impls.pop(impl)  # measured, then let go: graphed steps hold their graphs' memory
            try:
                row = measure(label, impl, step, flops, steps, accumulate)
                row |= {f"{name}_snr": snr_db(value, reference[name]) for name, value in step(0).items()}
            except Exception as exc:  # one implementation that cannot run a shape must not end the run
                print(f"{label} {impl}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
                continue
            bf16_ms = row["step_ms"] if impl == "bf16 torch" else bf16_ms
            row["ratio"] = bf16_ms / row["step_ms"]
            rows.append(row)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
            del step
            torch.cuda.empty_cache()
        del reference
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=("dense", "moe"), required=True)
    parser.add_argument("--shapes", default="llama3", help="dense: a dense GEMM preset or YAML file")
    parser.add_argument("--models", nargs="+", default=list(MOE_CASES), help="moe: " + ", ".join(MOE_CASES))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--only", default="", help="keep shapes whose label contains this")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per timed loop")
    parser.add_argument("--accumulate", type=int, default=1,
                        help="microbatches per optimizer step (gradient accumulation; our FP8 ops then "
                             "quantize the weights once per optimizer step)")
    parser.add_argument("--graph", action="store_true",
                        help="capture each implementation's whole microbatch in CUDA graphs and replay it (a loop "
                             "with full-iteration graphs: no per-kernel host work)")
    parser.add_argument("--no-torchao", dest="torchao", action="store_false", help="leave torchao out")
    parser.add_argument("--csv", default=None)
    args = parser.parse_args()
    if args.accumulate < 1 or args.steps < 1:
        parser.error("--accumulate and --steps must be at least 1")
    if args.suite == "dense":
        cases = {
            s.label: (lambda d=s.dims: dense_steps(d["M"], d["N"], d["K"], args.variants, args.torchao,
                                                     args.accumulate, args.graph),
                      6.0 * s.dims["M"] * s.dims["N"] * s.dims["K"])
            for s in load_shapes("dense_gemm", args.shapes) if args.only in s.label
        }
    else:
        cases = {
            name: (lambda c=MOE_CASES[name]: moe_steps(c, args.variants, args.torchao, args.accumulate, args.graph),
                   6.0 * 3 * MOE_CASES[name].routed * MOE_CASES[name].hidden * MOE_CASES[name].inter)
            for name in args.models
        }
    rows = run_suite(cases, args.steps, args.accumulate)
    columns = ["label", "impl", "step_ms", "tflops", "ratio", "host_ms", "gpu_ms", "launches"]
    per = f"microbatch of {args.accumulate}" if args.accumulate > 1 else "step"
    mode = "CUDA graphs" if args.graph else "eager"
    report(rows, f"training {per} ({args.suite}, {mode}; ratio = bf16 ms / ms)", columns, args.csv, group="impl")


if __name__ == "__main__":
    main()
