"""What the harness's timing holds of each runner's host time, on a GPU: for every shape of an op's preset,
ours and each baseline (the bench's runners, on the same inputs) timed three ways: host time a call (the GPU
kept busy ahead of it, so that only Python and the launches are counted), GPU time (CUDA-graph replays: the
kernels alone) and the harness's own timing (CUDA events, every call from an idle GPU, so host time shows),
with ours' speed over each baseline by the last two (the baseline's time over ours).

    PYTHONPATH=. python3 scripts/host_time.py --op attention --shapes headline --only d128
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from harness.quick_test_bench import prepare_bench, shape_problem
from harness.registry import get_spec
from harness.shapes import load_shapes
from harness.timing import Timer

# Keeps the GPU busy while the host times a call: far longer than any call's host time.
BUSY_CYCLES = 20_000_000


def host_us(fn, calls: int) -> float:
    """Median host time of a call, in us, each issued behind a busy GPU, back to back as a training loop issues
    them (waiting for the GPU between samples idles the CPU, whose next call then read 2-3x slower: H100 host,
    2026-11-27)."""
    samples = []
    for _ in range(calls):
        torch.cuda._sleep(BUSY_CYCLES)
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", required=True)
    parser.add_argument("--shapes", default=None, help="the op's preset or a YAML file (default: its default preset)")
    parser.add_argument("--only", default="", help="keep shapes whose label contains this")
    parser.add_argument("--variant", default=None)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    spec = get_spec(args.op)
    shapes = [s for s in load_shapes(spec.shape_family, args.shapes or spec.default_preset) if args.only in s.label]
    run = prepare_bench(spec, shapes, shapes_source=args.shapes or spec.default_preset, variant=args.variant,
                        repeats=args.repeats, warmup=3, compare_baselines=True)
    events = run.timer  # the bench's own: CUDA events, every call from an idle GPU
    graphs = Timer(events.device, mode="cuda-graph", repeats=args.repeats, warmup=3)
    for shape in shapes:
        problem = shape_problem(run, shape)
        inputs = spec.make_inputs(problem)
        timed: dict[tuple[str, str], tuple[float, float, float]] = {}
        for runner in run.runners:
            outputs = spec.make_outputs(problem, inputs)
            for pass_ in ("forward", "backward"):
                call = getattr(runner, pass_)
                if call is None:
                    continue
                fn = functools.partial(call, problem, inputs, outputs)
                try:
                    fn()
                    timed[runner.name, pass_] = (host_us(fn, args.repeats), graphs.time(fn).median_ms,
                                                 events.time(fn).median_ms)
                except Exception as exc:  # a call that cannot be captured (cuDNN's backward): said, and skipped
                    print(f"{shape.label} {runner.name} {pass_}: {type(exc).__name__}: {str(exc)[:100]}")
        print(f"== {shape.label}")
        for (name, pass_), (host, graph_ms, events_ms) in timed.items():
            ours = timed.get((spec.runner.name, pass_))
            ratios = (f"  ours over it: GPU {graph_ms / ours[1]:.3f}x, harness {events_ms / ours[2]:.3f}x"
                      if ours and name != spec.runner.name else "")
            print(f"  {name:24s} {pass_:8s} host {host:7.1f} us  GPU {graph_ms:.4f} ms  harness {events_ms:.4f} ms"
                  f"{ratios}")


if __name__ == "__main__":
    main()
