"""Where an FP8 training step's time goes (issue 15), on a GPU: each op's host cost per call, a
cProfile of a host-bound step, the quantization kernels' bandwidth, the kernels of MoE expert
steps (bf16 and ours, per kernel; `--accumulate 8`: microbatches of a gradient-accumulation loop, as
benchmarks/training_step.py times them), and (`launch`) the host cost of the cached launches of
kernels/common/launch.py against Triton's `kernel[grid]`, interleaved in one process, and (`anatomy`)
the host cost of each piece of one cached launch.

    PYTHONPATH=. python3 scripts/host_profile.py                          # all three parts
    PYTHONPATH=. python3 scripts/host_profile.py --parts moe --models gpt-oss-120b --accumulate 8
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import triton

import kernels.common.fp8 as fp8_module
import kernels.gemm.kernel as gemm_module
import kernels.grouped_gemm.kernel as grouped_module
from kernels.common.fp8 import Float8Config, Granularity, RowGroups, quantize_blocks_2d, quantize_both, quantize_rows
from kernels.common.launch import FastLaunch
from kernels.gemm.kernel import launch_tma
from kernels.gemm_fp8 import fp8_backward, fp8_forward, gemm_fp8
from kernels.grouped_gemm import group_offsets, grouped_forward
from kernels.grouped_gemm_fp8.kernel import QuantizedWeight

sys.path.insert(0, "benchmarks")
from training_step import MOE_CASES, moe_steps, skewed_splits, whole_cycles

E4M3 = torch.float8_e4m3fn


def host_us(fn, calls: int = 300) -> float:
    """Host microseconds per call, on shapes small enough that the GPU keeps up."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - started
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def linear_operands(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [n, n] bf16 (also the upstream gradient), a weight w and an input xg that take gradients, and an
    output buffer: what the host-cost parts time a Linear layer's ops on."""
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    return x, w, x.clone().requires_grad_(), torch.empty(n, n, device="cuda", dtype=torch.bfloat16)


def linear_step(x: torch.Tensor, w: torch.Tensor, xg: torch.Tensor, config: Float8Config):
    """One FP8 Linear training step (forward and backward through autograd) on linear_operands."""
    def run():
        xg.grad = w.grad = None
        gemm_fp8(xg, w, config=config).backward(x)
    return run


def op_host_costs(n: int = 512) -> None:
    x, w, xg, out = linear_operands(n)
    dense = RowGroups.equal(1, n)
    rowwise, blockwise = Float8Config(), Float8Config(granularity=Granularity.BLOCKWISE)
    saved = fp8_forward(x, w.detach(), True, rowwise, out, needs=(True, True))
    da, dw = torch.empty_like(x), torch.empty_like(x)

    def bf16_step():
        xg.grad = w.grad = None
        F.linear(xg, w).backward(x)

    costs = {
        "torch.empty": lambda: torch.empty(n, device="cuda"),
        "torch.zeros": lambda: torch.zeros(n, device="cuda"),
        "quantize_rows rowwise": lambda: quantize_rows(x, E4M3, Granularity.ROWWISE),
        "quantize_both rowwise": lambda: quantize_both(x, E4M3, Granularity.ROWWISE, dense),
        "quantize_both blockwise": lambda: quantize_both(x, E4M3, Granularity.BLOCKWISE, dense),
        "QuantizedWeight.pair rowwise": lambda: QuantizedWeight.pair(x[None], False, E4M3, Granularity.ROWWISE, True),
        "quantize_blocks_2d": lambda: quantize_blocks_2d(x[None], E4M3),
        "launch_tma bf16": lambda: launch_tma(x, x.t(), out, triton_cfg()),
        "fp8_forward rowwise (no grads)": lambda: fp8_forward(x, w.detach(), True, rowwise, out),
        "fp8_forward rowwise (both grads)": lambda: fp8_forward(x, w.detach(), True, rowwise, out, (True, True)),
        "fp8_backward rowwise": lambda: fp8_backward(x, saved, True, rowwise, da, dw),
        "fp8_forward blockwise (no grads)": lambda: fp8_forward(x, w.detach(), True, blockwise, out),
        "step bf16 F.linear": bf16_step,
        "step rowwise gemm_fp8": linear_step(x, w, xg, rowwise),
        "step blockwise gemm_fp8": linear_step(x, w, xg, blockwise),
    }
    print(f"host us per call ({n}^3, bf16):")
    for name, fn in costs.items():
        print(f"  {name:36s} {host_us(fn):8.1f}")
    prof = cProfile.Profile()
    run = linear_step(x, w, xg, rowwise)
    prof.enable()
    for _ in range(50):
        run()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(45)
    print(text.getvalue())


def launch_paths(n: int = 512, rounds: int = 7) -> None:
    """Host us per call with every kernel launched through its cache (direct) and through Triton's
    kernel[grid], alternating the two paths `rounds` times; medians and direct / triton."""
    launchers = [obj for module in (fp8_module, gemm_module, grouped_module) for obj in vars(module).values()
                 if isinstance(obj, FastLaunch)]
    x, w, xg, out = linear_operands(n)
    offs = group_offsets(torch.full((8,), n // 8, device="cuda", dtype=torch.int64))
    stack = torch.randn(8, n, n, device="cuda", dtype=torch.bfloat16)
    ops = {
        "quantize_rows rowwise (1 launch)": lambda: quantize_rows(x, E4M3, Granularity.ROWWISE),
        "quantize_both rowwise (2 launches)":
            lambda: quantize_both(x, E4M3, Granularity.ROWWISE, RowGroups.equal(1, n)),
        "launch_tma bf16 (1 launch)": lambda: launch_tma(x, x.t(), out, triton_cfg()),
        "grouped forward bf16, 8 groups (1 launch)": lambda: grouped_forward(x, stack, offs, True, out),
        "Linear step rowwise": linear_step(x, w, xg, Float8Config()),
        "Linear step blockwise": linear_step(x, w, xg, Float8Config(granularity=Granularity.BLOCKWISE)),
    }
    times: dict[str, dict[bool, list[float]]] = {name: {True: [], False: []} for name in ops}
    for _ in range(rounds):
        for direct in (True, False):
            for launcher in launchers:
                launcher.direct = direct
            for name, fn in ops.items():
                times[name][direct].append(host_us(fn, calls=100))
    for launcher in launchers:
        launcher.direct = True
    print(f"host us per call ({n}^3), median of {rounds} interleaved rounds: direct | triton | direct / triton")
    for name, by_path in times.items():
        direct, triton_path = statistics.median(by_path[True]), statistics.median(by_path[False])
        print(f"  {name:40s} {direct:8.1f} {triton_path:8.1f} {direct / triton_path:7.3f}")


def _launch_pieces(name: str, launcher: FastLaunch, grid, args: tuple, kwargs: dict) -> None:
    """Print the host us of each piece of one cached launch of `launcher`, on a captured call's arguments."""
    from triton.backends.nvidia import driver as nvidia_driver
    from triton.runtime import driver
    from triton.tools.tensor_descriptor import TensorDescriptor

    device = torch.cuda.current_device()
    binder = launcher.kernel.device_caches[device][4]
    bound, specialization, options = binder(*args, **kwargs)
    compiled = launcher.compiled[(device, tuple(specialization), tuple(options.items()))]
    grid = grid(bound) if callable(grid) else grid
    grid = tuple(grid) + (1,) * (3 - len(grid))
    stream = driver.active.get_current_stream(device)
    values = list(bound.values())
    descriptors = [v for v in values if isinstance(v, TensorDescriptor)]
    metas = list(getattr(compiled.metadata, "tensordesc_meta", None) or [None] * len(descriptors))
    expanded, index = [], 0
    for v in values:
        if isinstance(v, TensorDescriptor):
            expanded.extend(nvidia_driver.make_tensordesc_arg(v, metas[index]))
            index += 1
        else:
            expanded.append(v)
    launch = compiled.run.launch
    raw = next((c.cell_contents for c in (getattr(launch, "__closure__", None) or ())
                if type(c.cell_contents).__name__ == "builtin_function_or_method"), launch)
    head = (*grid, stream, compiled.function, compiled.run.launch_cooperative_grid, compiled.run.launch_pdl,
            None, None, compiled.packed_metadata, None, None, None)
    pieces = {
        "whole cached launch (FastLaunch.launch)": lambda: launcher.launch(grid, args, kwargs),
        "  Triton's binder": lambda: binder(*args, **kwargs),
        "  cache key + lookup": lambda: launcher.compiled.get((device, tuple(specialization), tuple(options.items()))),
        "  current device + stream": lambda: driver.active.get_current_stream(torch.cuda.current_device()),
        "  compiled.run (Triton's launcher, descriptors encoded)": lambda: compiled.run(
            *grid, stream, compiled.function, compiled.packed_metadata, None, None, None, *values),
        "  encode the host descriptors (make_tensordesc_arg)": lambda: [
            nvidia_driver.make_tensordesc_arg(d, m) for d, m in zip(descriptors, metas, strict=True)],
        "  the C launcher alone (descriptors pre-encoded)": lambda: raw(*head, *expanded),
    }
    print(f"=== {name}: {len(values)} bound arguments, {len(descriptors)} host descriptors")
    for piece, fn in pieces.items():
        print(f"  {piece:58s} {host_us(fn, calls=500):8.2f} us")


def launch_anatomy(n: int = 512) -> None:
    """Host us of each piece of one cached launch, each piece timed alone on the arguments of a real
    call: a TMA GEMM (three host descriptors) and the rowwise quantization kernel; and the torch calls
    around the launches of a step."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    x, _, _, out = linear_operands(n)
    captured = {}
    original = FastLaunch.launch

    def capture(self, grid, args, kwargs):
        captured[self.kernel.fn.__name__] = (self, grid, args, kwargs)
        original(self, grid, args, kwargs)

    FastLaunch.launch = capture
    try:
        for _ in range(2):  # the second call runs the cached binary
            launch_tma(x, x.t(), out, triton_cfg())
            quantize_rows(x, E4M3, Granularity.ROWWISE)
    finally:
        FastLaunch.launch = original
    torch.cuda.synchronize()
    for name, call in captured.items():
        _launch_pieces(name, *call)
    small = torch.empty(16, device="cuda")
    around = {
        "torch.empty 512x512 bf16": lambda: torch.empty(n, n, device="cuda", dtype=torch.bfloat16),
        "torch.zeros 128 fp32": lambda: torch.zeros(128, device="cuda"),
        "torch.cuda.set_device (bind_context)": lambda: torch.cuda.set_device(x.device),
        "TensorDescriptor(...) x3": lambda: [TensorDescriptor(x, list(x.shape), list(x.stride()), [128, 64])
                                             for _ in range(3)],
        "a tiny torch op (small.add_(1))": lambda: small.add_(1),
    }
    print("=== around the launches")
    for piece, fn in around.items():
        print(f"  {piece:58s} {host_us(fn, calls=500):8.2f} us")


def triton_cfg():
    from kernels.gemm.tuning import config_for
    return config_for(512, 512, 512)


def quantization_bandwidth() -> None:
    """TB/s of quantize_both on the DeepSeek-V3 routed tokens (32768 x 7168, 32 skewed groups) and on its
    GateUP weight stack, next to a copy of the tokens."""
    T, H = 32768, 7168
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(32 * 4096, H, device="cuda", dtype=torch.bfloat16)
    offs = group_offsets(torch.tensor(skewed_splits(T, 32, 1, seed=1)[0], device="cuda"))
    for name, t, groups in (("tokens", x, RowGroups.tokens(offs)), ("weights", w, RowGroups.equal(32, 4096))):
        for gran, reads in ((Granularity.ROWWISE, 2), (Granularity.BLOCKWISE, 1)):
            ms = triton.testing.do_bench(lambda t=t, g=gran, groups=groups: quantize_both(t, E4M3, g, groups))
            moved = t.numel() * 2 * (reads + 1)  # reads of the bf16 tensor, two fp8 copies written
            print(f"  quantize_both {name:8s} {gran.value:9s} {ms * 1e3:8.1f} us {moved / ms / 1e9:6.2f} TB/s")
    ms = triton.testing.do_bench(lambda: x.clone())
    print(f"  copy of the tokens {2 * x.numel() * 2 / ms / 1e9:6.2f} TB/s")


def moe_kernels(models: list[str], variants: list[str], accumulate: int) -> None:
    """The GPU kernels of each model's expert step (one microbatch of `accumulate`), bf16 and ours."""
    for model in models:
        moe = moe_steps(MOE_CASES[model], variants, torchao=False, accumulate=accumulate)
        cycle = whole_cycles(accumulate)
        for name, step in moe.items():
            for i in range(cycle):
                step(i)
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for i in range(cycle):
                    step(i)
                torch.cuda.synchronize()
            print(f"=== moe {model} {name}, {cycle} microbatches of {accumulate}")
            print(prof.key_averages().table(sort_by="device_time_total", row_limit=14, max_name_column_width=70))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=("host", "quant", "moe", "launch", "anatomy"),
                        default=["host", "quant", "moe"])
    parser.add_argument("--models", nargs="+", default=["deepseek-v3"], choices=list(MOE_CASES))
    parser.add_argument("--variants", nargs="+", default=["e4m3-rowwise", "e4m3-blockwise"])
    parser.add_argument("--accumulate", type=int, default=1)
    args = parser.parse_args()
    if args.accumulate < 1:
        parser.error("--accumulate must be at least 1")
    if "host" in args.parts:
        op_host_costs()
    if "quant" in args.parts:
        quantization_bandwidth()
    if "moe" in args.parts:
        moe_kernels(args.models, args.variants, args.accumulate)
    if "launch" in args.parts:
        launch_paths()
    if "anatomy" in args.parts:
        launch_anatomy()


if __name__ == "__main__":
    main()
