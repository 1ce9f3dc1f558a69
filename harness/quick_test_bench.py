"""quick_test_bench: OpSpec x shapes -> checked and timed rows -> the frozen summary CSV + sidecar.

For every shape: fresh seeded inputs, the float64 reference, then for our runner (and each baseline,
on the same inputs) the outputs are NaN-poisoned, forward and backward run once and every output
is checked by SNR; then forward and backward are timed separately. A shape that raises is a FAIL
row with NaN metrics, and the run goes on.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.errors import UserError
from harness.meta import BenchMeta, TimingInfo, environment, write_meta
from harness.schema import FAIL, PASS, CsvSchema, get_schema, write_summary
from harness.shapes import Shape, split_tokens
from harness.snr import snr_db, snr_passes
from harness.timing import INTERPRETER_NOTE, Timer, Timing
from kernels.common.device import default_device, interpreter_mode
from kernels.common.dtypes import dtype_from_name, dtype_name
from kernels.common.opspec import OpSpec, Problem, Runner, Tensors

NAN_TIMING = Timing(math.nan, math.nan, 0)


@dataclass(frozen=True)
class ShapeResult:
    shape: Shape
    dims: dict[str, int]
    check: str
    snrs: dict[str, float]
    fwd: Timing
    bwd: Timing
    flops: tuple[float, float]
    error: str | None = None
    # Timings with fresh input tensors on every call (NAN_TIMING when not measured).
    fresh_fwd: Timing = NAN_TIMING
    fresh_bwd: Timing = NAN_TIMING

    def row(self, schema: CsvSchema) -> dict[str, object]:
        def rate(work: float, t: Timing) -> float:
            return work / (t.median_ms * 1e-3) / 1e12 if t.median_ms > 0 else math.nan

        def rate_std(work: float, t: Timing) -> float:
            # First-order propagation of the time's spread into the rate's.
            return rate(work, t) * t.stddev_ms / t.median_ms if t.median_ms > 0 else math.nan

        (f_work, b_work), fwd, bwd = self.flops, self.fwd, self.bwd
        return {
            "label": self.shape.label,
            **self.dims,
            "Check": self.check,
            schema.fwd_metric: rate(f_work, fwd),
            f"{schema.fwd_metric}_stddev": rate_std(f_work, fwd),
            schema.bwd_metric: rate(b_work, bwd),
            f"{schema.bwd_metric}_stddev": rate_std(b_work, bwd),
            schema.fwd_ms: fwd.median_ms,
            schema.bwd_ms: bwd.median_ms,
            **{f"{name}_snr": self.snrs.get(name, math.nan) for name in schema.outputs},
        }


@dataclass
class BenchRun:
    """A validated benchmark plan (`prepare_bench`) and, once executed, its results."""

    spec: OpSpec
    schema: CsvSchema
    shapes: list[Shape]
    dims: dict[str, dict[str, int]]
    runners: list[Runner]
    dtype: torch.dtype
    variant: str
    shapes_source: str
    seed: int
    timer: Timer
    fresh_inputs: bool = False
    # runner name -> one result per shape, in shape order; ours first
    results: dict[str, list[ShapeResult]] = field(default_factory=dict)

    @property
    def ours(self) -> list[ShapeResult]:
        return self.results[self.spec.runner.name]

    @property
    def all_pass(self) -> bool:
        return all(r.check == PASS for r in self.ours)


def resolve_dtype(spec: OpSpec, name: str, device: torch.device) -> torch.dtype:
    """`auto` is bf16 on a GPU and fp16 under the interpreter, whose bf16 arithmetic is wrong."""
    if name == "auto":
        name = "fp16" if device.type == "cpu" and "fp16" in spec.dtypes else spec.dtypes[0]
    if name not in spec.dtypes:
        raise UserError(f"op {spec.name} does not support dtype '{name}' (supported: {', '.join(spec.dtypes)})")
    return dtype_from_name(name)


def shape_seed(seed: int, label: str) -> int:
    """A distinct, reproducible seed per shape, so no two shapes see the same data."""
    return (seed * 1_000_003 + zlib.crc32(label.encode())) % 2**31


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _failed(shape: Shape, dims: dict[str, int], error: str, flops: tuple[float, float]) -> ShapeResult:
    return ShapeResult(shape, dims, FAIL, {}, NAN_TIMING, NAN_TIMING, flops, error)


# A second, independent set of input values for the re-check after timing.
RECHECK_SEED_OFFSET = 7919
# An output whose norm is this small next to the reference's has not computed anything.
NEAR_ZERO_NORM = 1e-3


class CheckFailed(Exception):
    """A correctness check failed for a reason SNR alone would not name."""


def _check_outputs(
    spec: OpSpec, runner: Runner, problem: Problem, inputs: Tensors, ref: Tensors, outputs: Tensors,
    names: tuple[str, ...],
) -> dict[str, float]:
    """Poison the outputs, run, and return the SNR of each output; raise CheckFailed on an input
    written by the runner or an output of near-zero norm."""
    before = {k: v.clone() for k, v in inputs.items()}
    for t in outputs.values():
        t.fill_(math.nan)
    produced = runner.forward(problem, inputs, outputs) or {}
    if runner.backward:
        produced |= runner.backward(problem, inputs, outputs) or {}
    _synchronize(problem.device)
    written = [k for k, v in inputs.items() if not torch.equal(v, before[k])]
    if written:
        raise CheckFailed(f"wrote into its input(s) {', '.join(written)}")
    results = outputs | produced
    for name in names:
        out_norm = torch.linalg.vector_norm(results[name].double()).item()
        ref_norm = torch.linalg.vector_norm(ref[name].double()).item()
        if ref_norm > 0 and out_norm < NEAR_ZERO_NORM * ref_norm:
            raise CheckFailed(f"output {name} is ~zero (norm {out_norm:.3g} vs reference {ref_norm:.3g})")
    return {name: snr_db(results[name], ref[name]) for name in names}


def _failing(snrs: dict[str, float], formats: dict[str, str]) -> list[str]:
    return [f"{name} {snr:.1f} dB" for name, snr in snrs.items() if not snr_passes(snr, formats[name])]


def _refill_in_place(spec: OpSpec, problem: Problem, inputs: Tensors) -> None:
    """New values in the same tensors (same id and data_ptr): what a training step does to its buffers."""
    fresh = spec.make_inputs(dataclasses.replace(problem, seed=problem.seed + RECHECK_SEED_OFFSET))
    for name, tensor in inputs.items():
        if tensor.is_floating_point():
            tensor.copy_(fresh[name])


FRESH_INPUT_SETS = 3


def _time_fresh(spec: OpSpec, runner: Runner, problem: Problem, inputs: Tensors, outputs: Tensors,
                timer: Timer) -> tuple[Timing, Timing]:
    """Time with a different set of input tensors on every call (rotating through FRESH_INPUT_SETS):
    what a training step sees, and what defeats results kept from the previous call."""
    sets = [inputs] + [spec.make_inputs(dataclasses.replace(problem, seed=problem.seed + 1 + i))
                       for i in range(FRESH_INPUT_SETS - 1)]
    fwd_calls = itertools.cycle([(lambda s=s: runner.forward(problem, s, outputs)) for s in sets])
    fwd = timer.time(lambda: next(fwd_calls)())
    if not runner.backward:
        return fwd, NAN_TIMING
    bwd_calls = itertools.cycle([(lambda s=s: runner.backward(problem, s, outputs)) for s in sets])
    return fwd, timer.time(lambda: next(bwd_calls)())


def run_runner(
    spec: OpSpec, runner: Runner, problem: Problem, inputs: Tensors, ref: Tensors, shape: Shape,
    dims: dict[str, int], timer: Timer, extra_checks: list[Problem] = (), fresh_inputs: bool = False,
) -> ShapeResult:
    """Check one runner on one shape, time fwd and bwd, then check again.

    Checks: outputs NaN-poisoned first, inputs unchanged, no near-zero output, SNR per output; then
    every problem of `extra_checks` (other splits of a grouped shape); after timing, the same input
    tensors refilled with new values must give correct results again (a cache keyed on tensor
    identity or results that go wrong after some calls fail here). A forward-only baseline is checked
    and timed on the forward alone (backward columns NaN).
    """
    flops = spec.flops(problem)
    backward = runner.backward
    checked = spec.outputs if backward else spec.forward_outputs
    formats = spec.snr_formats(problem)
    try:
        outputs = spec.make_outputs(problem, inputs)
        snrs = _check_outputs(spec, runner, problem, inputs, ref, outputs, checked)
        failing = _failing(snrs, formats)
        for extra in extra_checks:
            extra_inputs = spec.make_inputs(extra)
            extra_snrs = _check_outputs(spec, runner, extra, extra_inputs, spec.reference(extra_inputs),
                                        spec.make_outputs(extra, extra_inputs), checked)
            wrong = _failing(extra_snrs, formats)
            if wrong:
                raise CheckFailed(f"wrong on split {list(extra.group_lens)}: {', '.join(wrong)}")
        fwd = timer.time(lambda: runner.forward(problem, inputs, outputs))
        bwd = timer.time(lambda: backward(problem, inputs, outputs)) if backward else NAN_TIMING
        fresh_fwd, fresh_bwd = (_time_fresh(spec, runner, problem, inputs, outputs, timer) if fresh_inputs
                                else (NAN_TIMING, NAN_TIMING))
        if not failing:
            _refill_in_place(spec, problem, inputs)
            recheck = _failing(_check_outputs(spec, runner, problem, inputs, spec.reference(inputs), outputs, checked),
                               formats)
            if recheck:
                raise CheckFailed(f"wrong after timing on refilled inputs: {', '.join(recheck)}")
    except CheckFailed as exc:
        return _failed(shape, dims, f"check: {exc}", flops)
    except Exception as exc:  # one bad shape must not end the run: it becomes a FAIL row
        return _failed(shape, dims, _describe(exc), flops)
    return ShapeResult(shape, dims, PASS if not failing else FAIL, snrs, fwd, bwd, flops,
                       fresh_fwd=fresh_fwd, fresh_bwd=fresh_bwd)


def skew_checks(problem: Problem) -> list[Problem]:
    """For a grouped problem: the same tokens split with one hot expert and with empty experts.

    Every grouped check covers skew and empty groups, even when the benchmark shapes are uniform.
    """
    lens = problem.group_lens
    if not lens or len(lens) < 2:
        return []
    total = sum(lens)
    splits = (split_tokens(total, len(lens), "hot", seed=problem.seed), split_tokens(total, len(lens), "empty",
                                                                                       seed=problem.seed))
    return [dataclasses.replace(problem, group_lens=tuple(s)) for s in splits if tuple(s) != tuple(lens)]


def run_shape(
    spec: OpSpec, runners: Sequence[Runner], shape: Shape, dims: dict[str, int], dtype: torch.dtype,
    device: torch.device, seed: int, timer: Timer, variant: str = "default", fresh_inputs: bool = False,
) -> dict[str, ShapeResult]:
    """Every runner on one shape, all on the same inputs and reference."""
    problem = Problem(dims=dims, dtype=dtype, device=device, seed=shape_seed(seed, shape.label),
                      group_lens=shape.group_lens, variant=variant)
    try:
        inputs = spec.make_inputs(problem)
        ref = spec.reference(inputs)
    except Exception as exc:
        error = _describe(exc)
        return {r.name: _failed(shape, dims, error, (math.nan, math.nan)) for r in runners}
    # Extra splits are checked for our kernel only: baselines are the vendor's, trusted.
    extra = skew_checks(problem)
    results = {r.name: run_runner(spec, r, problem, inputs, ref, shape, dims, timer,
                                  extra if r is spec.runner else [], fresh_inputs and r is spec.runner)
               for r in runners}
    del inputs, ref
    return results


def prepare_bench(
    spec: OpSpec,
    shapes: Sequence[Shape],
    *,
    shapes_source: str,
    dtype: str = "auto",
    variant: str | None = None,
    timing_mode: str | None = None,
    repeats: int | None = None,
    warmup: int | None = None,
    seed: int = 0,
    compare_baselines: bool = False,
    fresh_inputs: bool = False,
) -> BenchRun:
    """Validate everything about a benchmark (raising UserError) before any work starts."""
    schema = get_schema(spec.schema)
    if schema.outputs != spec.outputs:
        raise UserError(f"op {spec.name} checks outputs {spec.outputs}, schema '{schema.name}' has {schema.outputs}")
    device = default_device()
    torch_dtype = resolve_dtype(spec, dtype, device)
    variant = variant or spec.variants[0]
    if variant not in spec.variants:
        raise UserError(f"op {spec.name} has no variant '{variant}' (variants: {', '.join(spec.variants)})")
    try:
        timer = Timer(device, timing_mode, repeats, warmup)  # type: ignore[arg-type]
    except ValueError as exc:
        raise UserError(str(exc)) from None
    dims = {s.label: schema.resolve_dims(s.dims, f"shape '{s.label}'") for s in shapes}
    baselines = [b for b in spec.baselines if b.supports(variant)] if compare_baselines else []
    if fresh_inputs and timer.mode == "cuda-graph":
        raise UserError("fresh-input timing rotates input tensors: it needs cuda-events or wall-clock timing")
    return BenchRun(spec, schema, list(shapes), dims, [spec.runner, *baselines], torch_dtype, variant,
                    shapes_source, seed, timer, fresh_inputs)


def execute_bench(run: BenchRun, on_shape: Callable[[Shape], None] | None = None) -> BenchRun:
    """Check and time every runner on every shape; `on_shape` is called after each shape."""
    run.results = {r.name: [] for r in run.runners}
    for shape in run.shapes:
        results = run_shape(run.spec, run.runners, shape, run.dims[shape.label], run.dtype,
                            run.timer.device, run.seed, run.timer, run.variant, run.fresh_inputs)
        for name, result in results.items():
            run.results[name].append(result)
        if on_shape:
            on_shape(shape)
    return run


def run_bench(spec: OpSpec, shapes: Sequence[Shape], *, shapes_source: str, **options: object) -> BenchRun:
    """prepare_bench + execute_bench (options as for prepare_bench)."""
    return execute_bench(prepare_bench(spec, shapes, shapes_source=shapes_source, **options))  # type: ignore[arg-type]


def baseline_csv_path(summary_csv: Path, baseline: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_-]+", "_", baseline)
    return summary_csv.with_name(f"{summary_csv.stem}.baseline-{safe}.csv")


def write_bench(run: BenchRun, summary_csv: Path) -> list[Path]:
    """Write our summary CSV, one CSV per baseline (same schema and labels) and a sidecar for each."""
    env = environment(run.timer.device)
    timing = TimingInfo(
        mode=run.timer.mode, repeats=run.timer.repeats, warmup=run.timer.warmup,
        l2_flush=run.timer.flushes_l2, note=INTERPRETER_NOTE if interpreter_mode() else "",
    )
    csv_paths = {name: summary_csv if name == run.spec.runner.name else baseline_csv_path(summary_csv, name)
                 for name in run.results}
    written = []
    for name, results in run.results.items():
        path = csv_paths[name]
        write_summary(path, run.schema, [r.row(run.schema) for r in results])
        meta = BenchMeta(
            op=run.spec.name, runner=name, csv_schema=run.schema.name, dtype=dtype_name(run.dtype),
            variant=run.variant,
            shapes=run.shapes_source, seed=run.seed, timing=timing,
            errors={r.shape.label: r.error for r in results if r.error},
            fresh_ms={r.shape.label: (r.fresh_fwd.median_ms, r.fresh_bwd.median_ms) for r in results
                      if math.isfinite(r.fresh_fwd.median_ms)},
            baseline_csvs={n: p.name for n, p in csv_paths.items() if name == run.spec.runner.name and p != path},
            **env,
        )
        written += [path, write_meta(path, meta)]
    return written
