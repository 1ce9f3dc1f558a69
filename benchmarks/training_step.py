"""The training step as a training loop sees it (issue 15): forward and backward through autograd, steps
timed back to back with the host's time in them, bf16 torch, our FP8 ops and torchao's FP8 training ops
side by side in one run; with each step's host time (its launches enqueued from an idle GPU), GPU kernel
time and kernel launches (torch.profiler), and the FP8 results' SNR against the bf16 step's.

- dense: a Linear layer, y = x @ W^T, on the llama3 presets (QKV / O / gate_up / down / lm_head).
- moe: an expert MLP, GateUP -> SwiGLU -> Down as grouped GEMMs, the routed tokens split over the local
  experts by a skewed router drawn anew every step (group sizes in multiples of 16, which torchao needs;
  drawn before timing, kept on the GPU: no host sync).

    python3 benchmarks/training_step.py --suite dense --shapes llama3 --csv dense.csv
    python3 benchmarks/training_step.py --suite moe --csv moe.csv
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
from kernels.grouped_gemm_fp8 import grouped_gemm_fp8

# One step of one implementation; its argument picks the router's outcome (MoE; a Linear has none).
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


def timed_steps(step: Step, steps: int, repeats: int = 3) -> float:
    """Milliseconds per step, `steps` run back to back between two events (the GPU waits for the host
    whenever the host is slower), a new router outcome each step, median over `repeats` loops."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for i in range(steps):
            step(i % DRAWS)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / steps)
    return statistics.median(times)


def host_ms(step: Step, samples: int = 10) -> float:
    """The host's time to enqueue one step from an idle GPU (its launch queue empty, so it never blocks)."""
    times = []
    for i in range(samples):
        torch.cuda.synchronize()
        started = time.perf_counter()
        step(i % DRAWS)
        times.append((time.perf_counter() - started) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def kernels_per_step(step: Step, steps: int = 3) -> tuple[float, float]:
    """GPU kernel time (ms) and launches per step, from torch.profiler's device events."""
    activity = torch.profiler.ProfilerActivity.CUDA
    with torch.profiler.profile(activities=[activity]) as prof:
        for i in range(steps):
            step(i % DRAWS)
        torch.cuda.synchronize()
    device = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in device) / 1e3 / steps, len(device) / steps


def measure(label: str, impl: str, step: Step, flops: float, steps: int) -> dict[str, object]:
    for i in range(DRAWS):  # the warm-up: compiles, autotunes, lazy imports, every router outcome once
        step(i)
    ms = timed_steps(step, steps)
    gpu_ms, launches = kernels_per_step(step)
    return {"label": label, "impl": impl, "step_ms": ms, "tflops": flops / ms / 1e9, "host_ms": host_ms(step),
            "gpu_ms": gpu_ms, "launches": launches}


def dense_steps(M: int, N: int, K: int, variants: list[str], torchao: bool) -> dict[str, Step]:
    """One Linear layer's step per implementation, on the same x, W and upstream gradient."""
    gen = torch.Generator(device="cuda").manual_seed(M * 7 + N * 3 + K)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    grad = torch.randn(M, N, device="cuda", dtype=torch.bfloat16, generator=gen)
    weight = torch.nn.Parameter(torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=gen) / K**0.5)

    def step_of(forward: Callable[[torch.Tensor], torch.Tensor], w: torch.Tensor) -> Step:
        def step(draw: int) -> dict[str, torch.Tensor]:
            x.grad = w.grad = None  # zero_grad(set_to_none=True)
            y = forward(x)
            y.backward(grad)
            return {"out": y, "dx": x.grad, "dw": w.grad}
        return step

    steps = {"bf16 torch": step_of(lambda t: F.linear(t, weight), weight)}
    for name in variants:
        steps[f"ours {name}"] = step_of(lambda t, c=VARIANTS[name]: gemm_fp8(t, weight, trans_b=True, config=c),
                                        weight)
    if torchao:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        for recipe in ("rowwise", "tensorwise"):
            linear = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
            linear.weight = torch.nn.Parameter(weight.detach().clone())
            module = convert_to_float8_training(linear, config=Float8LinearConfig.from_recipe_name(recipe))
            steps[f"torchao {recipe}"] = step_of(module, module.weight)
    return steps


def moe_steps(case: MoECase, variants: list[str], torchao: bool) -> dict[str, Step]:
    """One expert MLP's step per implementation, under the router outcome it is given."""
    E, H, I, T = case.experts, case.hidden, case.inter, case.routed
    gen = torch.Generator(device="cuda").manual_seed(E * 31 + H)
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    grad = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=gen)
    w1 = torch.nn.Parameter(torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16, generator=gen) / H**0.5)
    w2 = torch.nn.Parameter(torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16, generator=gen) / I**0.5)
    splits = skewed_splits(T, E, DRAWS, seed=E + H)
    lens = [torch.tensor(s, device="cuda", dtype=torch.int64) for s in splits]
    offs = [torch.cumsum(n, 0, dtype=torch.int32) for n in lens]

    def swiglu(h: torch.Tensor) -> torch.Tensor:
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up

    def step_of(gemm: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]) -> Step:
        def step(draw: int) -> dict[str, torch.Tensor]:
            x.grad = w1.grad = w2.grad = None
            y = gemm(swiglu(gemm(x, w1, draw)), w2, draw)
            y.backward(grad)
            return {"out": y, "dx": x.grad, "dw1": w1.grad, "dw2": w2.grad}
        return step

    steps = {"bf16 torch": step_of(lambda a, w, k: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs[k]))}
    for name in variants:
        steps[f"ours {name}"] = step_of(
            lambda a, w, k, c=VARIANTS[name]: grouped_gemm_fp8(a, w, lens[k], config=c))
    if torchao:
        from torchao.prototype.moe_training.fp8_grouped_mm import _to_fp8_rowwise_then_scaled_grouped_mm

        steps["torchao rowwise"] = step_of(lambda a, w, k: _to_fp8_rowwise_then_scaled_grouped_mm(
            a, w.transpose(-2, -1), offs[k], pad_token_groups_for_grouped_mm=False))
    return steps


def run_suite(cases: dict[str, tuple[Callable[[], dict[str, Step]], float]], steps: int) -> list[dict[str, object]]:
    """Every implementation on every case; each one's results (router outcome 0) checked against bf16
    torch's by SNR (a sanity check of what is timed, not the referee: that is `turbo-opt bench`)."""
    rows = []
    for label, (build, flops) in cases.items():
        impls = build()
        reference = {k: v.detach().clone() for k, v in impls["bf16 torch"](0).items()}
        bf16_ms = math.nan
        for impl, step in impls.items():
            try:
                row = measure(label, impl, step, flops, steps)
                row |= {f"{name}_snr": snr_db(value, reference[name]) for name, value in step(0).items()}
            except Exception as exc:  # one implementation that cannot run a shape must not end the run
                print(f"{label} {impl}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
                continue
            bf16_ms = row["step_ms"] if impl == "bf16 torch" else bf16_ms
            row["ratio"] = bf16_ms / row["step_ms"]
            rows.append(row)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        del impls, reference
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=("dense", "moe"), required=True)
    parser.add_argument("--shapes", default="llama3", help="dense: a dense GEMM preset or YAML file")
    parser.add_argument("--models", nargs="+", default=list(MOE_CASES), help="moe: " + ", ".join(MOE_CASES))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--only", default="", help="keep shapes whose label contains this")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed loop")
    parser.add_argument("--no-torchao", dest="torchao", action="store_false", help="leave torchao out")
    parser.add_argument("--csv", default=None)
    args = parser.parse_args()
    if args.suite == "dense":
        cases = {
            s.label: (lambda d=s.dims: dense_steps(d["M"], d["N"], d["K"], args.variants, args.torchao),
                      6.0 * s.dims["M"] * s.dims["N"] * s.dims["K"])
            for s in load_shapes("dense_gemm", args.shapes) if args.only in s.label
        }
    else:
        cases = {
            name: (lambda c=MOE_CASES[name]: moe_steps(c, args.variants, args.torchao),
                   6.0 * 3 * MOE_CASES[name].routed * MOE_CASES[name].hidden * MOE_CASES[name].inter)
            for name in args.models
        }
    rows = run_suite(cases, args.steps)
    columns = ["label", "impl", "step_ms", "tflops", "ratio", "host_ms", "gpu_ms", "launches"]
    report(rows, f"training step ({args.suite}; ratio = bf16 step ms / step ms)", columns, args.csv, group="impl")


if __name__ == "__main__":
    main()
