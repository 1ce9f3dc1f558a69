"""What the harness's timing holds of each runner's host time, on a GPU: for every shape of an op's preset,
ours and each baseline (the bench's runners, on the same inputs) timed three ways: host time a call (the GPU
kept busy ahead of it, so that only Python and the launches are counted), GPU time (CUDA-graph replays: the
kernels alone) and the harness's own timing (the larger of a call's GPU and host times, harness/timing.py),
with ours' speed over each baseline by the last two (the baseline's time over ours).

    PYTHONPATH=. python3 scripts/host_time.py --op attention --shapes headline --only d128
    PYTHONPATH=. python3 scripts/host_time.py --op attention --shapes headline --only d128 --profile 25

`--profile N`: also a cProfile of ours' calls (issued the same way), its N costliest functions by own time
and by time inside them: where a call's host time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import pstats
import statistics
import time

import torch

from harness.quick_test_bench import prepare_bench, shape_problem
from harness.registry import get_spec
from harness.shapes import load_shapes
from harness.timing import Timer

# Keeps the GPU busy while the host times a call: far longer than any call's host time.
BUSY_CYCLES = 20_000_000


def host_us(fn, calls: int, profiler: cProfile.Profile | None = None) -> float:
    """Median host time of a call, in us, each issued behind a busy GPU, back to back as a training loop issues
    them (waiting for the GPU between samples idles the CPU, whose next call then read 2-3x slower: H100 host,
    2026-11-27); with a `profiler`, each call inside it (its cost then in the samples)."""
    samples = []
    for _ in range(calls):
        torch.cuda._sleep(BUSY_CYCLES)
        if profiler:
            profiler.enable()
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
        if profiler:
            profiler.disable()
    torch.cuda.synchronize()
    return statistics.median(samples)


def profile(fn, calls: int, top: int) -> str:
    """cProfile of `calls` calls issued as host_us issues them: the `top` functions by own time, then by time
    inside them, in us and calls per call of fn (cProfile's own cost inflates functions called often)."""
    profiler = cProfile.Profile()
    host_us(fn, calls, profiler)
    rows = [(own / calls * 1e6, inside / calls * 1e6, count / calls, f"{pstats.func_std_string(where)}")
            for where, (_, count, own, inside, _) in pstats.Stats(profiler).stats.items()]
    text = io.StringIO()
    for title, column in (("own", 0), ("inside", 1)):
        print(f"  by time {title}: own us, inside us, calls (per call of fn)", file=text)
        for own, inside, count, name in sorted(rows, key=lambda row: -row[column])[:top]:
            print(f"  {own:8.1f} {inside:8.1f} {count:6.1f}  {name}", file=text)
    return text.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", required=True)
    parser.add_argument("--shapes", default=None, help="the op's preset or a YAML file (default: its default preset)")
    parser.add_argument("--only", default="", help="keep shapes whose label contains this")
    parser.add_argument("--variant", default=None)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also print a cProfile of ours' calls: its N costliest functions")
    args = parser.parse_args()
    spec = get_spec(args.op)
    shapes = [s for s in load_shapes(spec.shape_family, args.shapes or spec.default_preset) if args.only in s.label]
    run = prepare_bench(spec, shapes, shapes_source=args.shapes or spec.default_preset, variant=args.variant,
                        repeats=args.repeats, warmup=3, compare_baselines=True)
    events = run.timer  # the bench's own: the larger of a call's GPU time (CUDA events) and host time
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
                    if args.profile and runner is spec.runner:
                        print(f"== {shape.label} {pass_}: cProfile of {args.repeats} calls\n"
                              f"{profile(fn, args.repeats, args.profile)}")
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
