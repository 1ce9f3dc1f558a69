"""quick_test_bench: OpSpec x shapes -> checked and timed rows -> the frozen summary CSV + sidecar.

For every shape: fresh seeded inputs, the float64 reference, then for our runner (and each baseline,
on the same inputs) the outputs are NaN-poisoned, forward and backward run once and every output
is checked by SNR; then every runner's forward and backward are timed separately, in interleaved
rounds of shuffled order (ours and the baselines see the same GPU state). A shape that raises is a
FAIL row with NaN metrics, and the run goes on.

Our runner is also checked the way training calls it (`--checks full`, the default): through the
autograd API twice in a row, with grad disabled, on the outputs of its timed calls, with no thread
left running; and, with a probe seed, on unannounced shapes and value ranges (harness/probes.py),
which are not CSV rows: their labels and failures go to the sidecar.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import re
import threading
import zlib
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch

from harness.errors import UserError
from harness.meta import BenchMeta, TimingInfo, environment, write_meta
from harness.probes import Probe, accumulation_format, draw_probes
from harness.rules import load_rules
from harness.schema import FAIL, PASS, CsvSchema, get_schema, write_summary
from harness.shapes import Shape, split_tokens
from harness.snr import norm, snr_db, snr_passes, snr_threshold
from harness.timing import CallFailed, Timer, Timing, timing_note
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
    # (fwd, bwd) work in what the schema's metric counts: FLOPs (TFLOPS) or bytes moved (GB/s).
    work: tuple[float, float]
    error: str | None = None
    # Timings with fresh input tensors on every call (NAN_TIMING when not measured).
    fresh_fwd: Timing = NAN_TIMING
    fresh_bwd: Timing = NAN_TIMING

    @property
    def host_bound(self) -> list[str]:
        """The passes ("fwd", "bwd") whose time was mostly the runner's host time (Timing.host_bound)."""
        return [name for name, t in (("fwd", self.fwd), ("bwd", self.bwd)) if t.host_bound > 0.5]

    def row(self, schema: CsvSchema) -> dict[str, object]:
        def rate(work: float, t: Timing) -> float:
            return work / (t.median_ms * 1e-3) / schema.unit if t.median_ms > 0 else math.nan

        def rate_std(work: float, t: Timing) -> float:
            # First-order propagation of the time's spread into the rate's.
            return rate(work, t) * t.stddev_ms / t.median_ms if t.median_ms > 0 else math.nan

        (f_work, b_work), fwd, bwd = self.work, self.fwd, self.bwd
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
    # Input sets of the fresh-input timing (rules' fresh_input_sets); 0: not timed with fresh inputs.
    fresh_sets: int = 0
    checks: str = "full"
    probe_seed: int | None = None
    probes: list[Probe] = field(default_factory=list)
    # runner name -> one result per shape, in shape order; ours first
    results: dict[str, list[ShapeResult]] = field(default_factory=dict)
    # probe label -> why our runner failed it
    probe_errors: dict[str, str] = field(default_factory=dict)

    @property
    def ours(self) -> list[ShapeResult]:
        return self.results[self.spec.runner.name]

    @property
    def all_pass(self) -> bool:
        return all(r.check == PASS for r in self.ours) and not self.probe_errors


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


def _failed(shape: Shape, dims: dict[str, int], error: str, work: tuple[float, float]) -> ShapeResult:
    return ShapeResult(shape, dims, FAIL, {}, NAN_TIMING, NAN_TIMING, work, error)


def work_of(spec: OpSpec, problem: Problem) -> tuple[float, float]:
    """(fwd, bwd) work of a problem in what its schema's metric counts: bytes moved or FLOPs."""
    return spec.bytes_moved(problem) if get_schema(spec.schema).counts_bytes else spec.flops(problem)


# Seed offsets of the other input sets of a shape: the re-check after timing, the fresh-input timing
# and the training check each get their own values.
RECHECK_SEED_OFFSET = 7919
FRESH_SEED_OFFSET = 1
TRAINING_SEED_OFFSET = 104729
# An output whose norm is this small next to the reference's has not computed anything.
NEAR_ZERO_NORM = 1e-3
CHECK_LEVELS: tuple[str, ...] = ("full", "basic")

T = TypeVar("T")


class CheckFailed(Exception):
    """A correctness check failed for a reason SNR alone would not name."""


def _returned_done(call: Callable[[], T], watch: bool) -> T:
    """Run one call of the op; watched, a Python thread it started and left running fails the check:
    a result must be complete when the call returns, not finished later behind the checker's back."""
    if not watch:
        return call()
    before = set(threading.enumerate())
    result = call()
    # Threads Python did not start (the autograd engine's device threads) show up as dummies once they
    # run Python code: they are not the op's.
    left = [t for t in threading.enumerate()
            if t not in before and t.is_alive() and not isinstance(t, threading._DummyThread)]
    if left:
        names = ", ".join(t.name for t in left)
        raise CheckFailed(f"thread: left {len(left)} thread(s) running after returning ({names})")
    return result


def _check_outputs(
    spec: OpSpec, runner: Runner, problem: Problem, inputs: Tensors, ref: Tensors, outputs: Tensors,
    names: tuple[str, ...], watch_threads: bool = False,
) -> dict[str, float]:
    """Poison the outputs, run, and return the SNR of each output; raise CheckFailed on an input
    written by the runner, an output of near-zero norm, or (watch_threads) a thread left running."""
    before = {k: v.clone() for k, v in inputs.items()}
    for t in outputs.values():
        t.fill_(math.nan)
    produced = _returned_done(lambda: runner.forward(problem, inputs, outputs), watch_threads) or {}
    if runner.backward:
        produced |= _returned_done(lambda: runner.backward(problem, inputs, outputs), watch_threads) or {}
    _synchronize(problem.device)
    written = [k for k, v in inputs.items() if not torch.equal(v, before[k])]
    if written:
        raise CheckFailed(f"wrote into its input(s) {', '.join(written)}")
    results = outputs | produced
    for name in names:
        out_norm, ref_norm = norm(results[name]), norm(ref[name])
        if ref_norm > 0 and out_norm < NEAR_ZERO_NORM * ref_norm:
            raise CheckFailed(f"output {name} is ~zero (norm {out_norm:.3g} vs reference {ref_norm:.3g})")
    return {name: snr_db(results[name], ref[name]) for name in names}


def _failing(snrs: dict[str, float], formats: dict[str, str]) -> list[str]:
    """"<output> <SNR> dB < <threshold> dB (<format>)" for each output under its format's threshold."""
    return [f"{name} {snr:.1f} dB < {snr_threshold(formats[name]):g} dB ({formats[name]})"
            for name, snr in snrs.items() if not snr_passes(snr, formats[name])]


def _expect_right(results: Tensors, ref: Tensors, names: tuple[str, ...], formats: dict[str, str],
                  what: str) -> None:
    """Raise CheckFailed("<what>: <outputs and dB>") unless every output clears its SNR threshold."""
    wrong = _failing({name: snr_db(results[name], ref[name]) for name in names}, formats)
    if wrong:
        raise CheckFailed(f"{what}: {', '.join(wrong)}")


def _other_inputs(spec: OpSpec, problem: Problem, offset: int) -> Tensors:
    """Another input set of the same shape (new tensors, new values)."""
    return spec.make_inputs(dataclasses.replace(problem, seed=problem.seed + offset))


def _refill_in_place(spec: OpSpec, problem: Problem, inputs: Tensors, offset: int = RECHECK_SEED_OFFSET) -> None:
    """New values in the same tensors (same id and data_ptr): what a training step does to its buffers.
    Offset 0 puts back the values make_inputs gave them."""
    fresh = _other_inputs(spec, problem, offset)
    for name, tensor in inputs.items():
        if tensor.is_floating_point():
            tensor.copy_(fresh[name])


def _fill_garbage(outputs: Tensors, seed: int) -> None:
    """Finite random values in every output buffer: a kernel that skips work when its buffer already
    holds something other than NaN leaves them there, for the timed-output check to find."""
    for t in outputs.values():
        t.normal_(generator=torch.Generator(device=t.device).manual_seed(seed))


def _check_grad_disabled(spec: OpSpec, runner: Runner, problem: Problem, inputs: Tensors, ref: Tensors,
                         outputs: Tensors, names: tuple[str, ...], formats: dict[str, str]) -> None:
    """The direct check again with grad disabled, as autograd runs a Function's forward and backward."""
    with torch.no_grad():
        wrong = _failing(_check_outputs(spec, runner, problem, inputs, ref, outputs, names, watch_threads=True),
                         formats)
    if wrong:
        raise CheckFailed(f"autograd: wrong with grad disabled: {', '.join(wrong)}")


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.numel() > 0 and b.numel() > 0 and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _check_training(spec: OpSpec, problem: Problem, formats: dict[str, str]) -> None:
    """Two training steps in a row through the op's autograd API (`spec.train_step`), on two input sets
    of the same shape, both results kept alive, as two layers of one shape are: each right, the second
    sharing no storage with the first, and the first unchanged by the second call."""
    names = spec.outputs
    first_set, second_set = (_other_inputs(spec, problem, TRAINING_SEED_OFFSET + i) for i in range(2))
    first = _returned_done(functools.partial(spec.train_step, problem, first_set), watch=True)
    _expect_right(first, spec.reference(first_set), names, formats, "autograd")
    # A copy in host memory, not the float64 reference, to compare with after the second call: beside the
    # run's own reference and buffers, an lm_head's copies and float64 references fill an 80 GB GPU.
    kept = {name: first[name].to("cpu", copy=True) for name in names}
    second = _returned_done(functools.partial(spec.train_step, problem, second_set), watch=True)
    shared = [name for name in names if _shares_storage(first[name], second[name])]
    if shared:
        raise CheckFailed(f"aliasing: the second call's {', '.join(shared)} shares storage with the first's")
    changed = [name for name in names if not torch.equal(first[name].cpu(), kept[name])]
    if changed:
        raise CheckFailed(f"aliasing: the first call's {', '.join(changed)} changed when the op was called again")
    del first, kept, first_set  # the first layer is done with: its memory, before the second's reference
    _expect_right(second, spec.reference(second_set), names, formats, "autograd")


def _time_fresh(spec: OpSpec, runner: Runner, problem: Problem, inputs: Tensors, outputs: Tensors, timer: Timer,
                count: int) -> tuple[Timing, Timing, Tensors]:
    """Time with `count` input sets (new tensors, new values), each timed once per pass after one warm-up
    call on the reused inputs: what a training step sees, and what a cache keyed on its inputs misses on
    every timed call, whatever the repeats. Returns the timings and the set the last calls used."""
    sets = [_other_inputs(spec, problem, FRESH_SEED_OFFSET + i) for i in range(count)]
    runner.forward(problem, inputs, outputs)
    fwd = timer.time_each([functools.partial(runner.forward, problem, s, outputs) for s in sets])
    if not runner.backward:
        return fwd, NAN_TIMING, sets[-1]
    runner.backward(problem, inputs, outputs)
    return fwd, timer.time_each([functools.partial(runner.backward, problem, s, outputs) for s in sets]), sets[-1]


# Rounds the runners of a shape are timed in (Timer.time_interleaved), the repeats spread over them.
TIMING_ROUNDS = 5


@dataclass(eq=False)
class _Trial:
    """One runner on one shape while run_runners checks and times it: its output buffers, what its checks
    found, its timings, or (`error`) why it failed."""

    runner: Runner
    ours: bool
    outputs: Tensors = field(default_factory=dict)
    snrs: dict[str, float] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)  # outputs under their SNR threshold
    checking: bool = False  # the full checks go on (ours under `--checks full`, right so far)
    fwd: Timing = NAN_TIMING
    bwd: Timing = NAN_TIMING
    fresh_fwd: Timing = NAN_TIMING
    fresh_bwd: Timing = NAN_TIMING
    error: str | None = None

    def result(self, shape: Shape, dims: dict[str, int], work: tuple[float, float]) -> ShapeResult:
        if self.error is not None:
            return _failed(shape, dims, self.error, work)
        return ShapeResult(shape, dims, FAIL if self.wrong else PASS, self.snrs, self.fwd, self.bwd, work,
                           fresh_fwd=self.fresh_fwd, fresh_bwd=self.fresh_bwd)


@contextlib.contextmanager
def _failure_of(trial: _Trial) -> Iterator[None]:
    """Run a phase of a trial: an exception ends the trial (its error), not the shape or the other runners."""
    try:
        yield
    except CheckFailed as exc:
        trial.error = f"check: {exc}"
    except Exception as exc:  # one bad runner must not end the run: it becomes a FAIL row
        trial.error = _describe(exc)


def _time_in_rounds(trials: Sequence[_Trial], problem: Problem, inputs: Tensors, timer: Timer) -> None:
    """Every trial's forward and backward timed in interleaved rounds, each round in an order of its own
    (Timer.time_interleaved): ours and the baselines see the same GPU state, none a fixed place (timed one
    after the other, the runners timed later read up to 8% faster or slower than in a shuffled order). A
    runner that raises fails, and the others are timed again without it."""
    live = list(trials)
    while live:
        calls: dict[tuple[int, str], Callable[[], object]] = {}
        for i, trial in enumerate(live):
            calls[i, "fwd"] = functools.partial(trial.runner.forward, problem, inputs, trial.outputs)
            if trial.runner.backward:
                calls[i, "bwd"] = functools.partial(trial.runner.backward, problem, inputs, trial.outputs)
        try:
            timed = timer.time_interleaved(calls, min(TIMING_ROUNDS, timer.repeats))
        except CallFailed as exc:
            failed = live.pop(exc.key[0])
            failed.error = _describe(exc.__cause__ or exc)
            continue
        for (i, pass_), rounds in timed.items():
            setattr(live[i], pass_, rounds.pooled())
        return


def run_runners(
    spec: OpSpec, runners: Sequence[Runner], problem: Problem, inputs: Tensors, ref: Tensors, shape: Shape,
    dims: dict[str, int], timer: Timer, extra_checks: Sequence[Problem] = (), fresh_sets: int = 0,
    full_checks: bool = False, recheck: bool = True,
) -> dict[str, ShapeResult]:
    """Check each runner on one shape, time their forward and backward passes together in interleaved
    rounds (_time_in_rounds), then check each again. Returns a result per runner name.

    Checks: outputs NaN-poisoned first, inputs unchanged, no near-zero output, SNR per output; then
    every problem of `extra_checks` (other splits of a grouped shape); after timing, the same input
    tensors refilled with new values must give correct results again (a cache keyed on tensor
    identity or results that go wrong after some calls fail here). With `fresh_sets`, also timed on
    that many fresh input sets. A forward-only baseline is checked and timed on the forward alone
    (backward columns NaN).

    `full_checks` adds the checks that follow what training does: no thread left running by a checked
    call; the direct check again with grad disabled; the outputs of the timed calls (into buffers of
    finite garbage, and of the last fresh set); and two training steps through the autograd API
    (`_check_training`), after timing so that a verdict on the timed calls does not depend on what the
    allocator handed the training step. `extra_checks`, `fresh_sets` and `full_checks` are for our
    runner (spec.runner) only: baselines are the vendor's, trusted.

    `recheck` False skips the check on refilled inputs (a `Screen`'s inputs must keep the values its
    reference is of).
    """
    work = work_of(spec, problem)
    formats = spec.snr_formats(problem)
    trials = [_Trial(r, r is spec.runner) for r in runners]

    def checked(trial: _Trial) -> tuple[str, ...]:
        return spec.outputs if trial.runner.backward else spec.forward_outputs

    for trial in trials:
        with _failure_of(trial):
            runner, watch = trial.runner, trial.ours and full_checks
            trial.outputs = spec.make_outputs(problem, inputs)
            trial.snrs = _check_outputs(spec, runner, problem, inputs, ref, trial.outputs, checked(trial), watch)
            trial.wrong = _failing(trial.snrs, formats)
            for extra in extra_checks if trial.ours else ():
                extra_inputs = spec.make_inputs(extra)
                wrong = _failing(_check_outputs(spec, runner, extra, extra_inputs, spec.reference(extra_inputs),
                                                spec.make_outputs(extra, extra_inputs), checked(trial), watch),
                                 formats)
                if wrong:
                    raise CheckFailed(f"wrong on split {list(extra.group_lens)}: {', '.join(wrong)}")
            trial.checking = watch and not trial.wrong
            if trial.checking:
                _check_grad_disabled(spec, runner, problem, inputs, ref, trial.outputs, checked(trial), formats)
                _fill_garbage(trial.outputs, problem.seed)
    _time_in_rounds([t for t in trials if t.error is None], problem, inputs, timer)
    for trial in (t for t in trials if t.error is None):
        with _failure_of(trial):
            runner, watch = trial.runner, trial.ours and full_checks
            # CUDA-graph replays run the captured kernels and none of the op's Python, so no per-call
            # decision (the skipped work this check looks for) can differ between the captured call and
            # the timed ones; the audit refuses code that behaves differently under capture.
            if trial.checking and timer.mode != "cuda-graph":
                _expect_right(trial.outputs, ref, checked(trial), formats, "timed output")
            if trial.ours and fresh_sets:
                trial.fresh_fwd, trial.fresh_bwd, last = _time_fresh(spec, runner, problem, inputs, trial.outputs,
                                                                     timer, fresh_sets)
                if trial.checking:
                    _expect_right(trial.outputs, spec.reference(last), checked(trial), formats,
                                  "timed output (last fresh input set)")
                del last  # an input set's memory, before the references below
            if recheck and not trial.wrong:
                _refill_in_place(spec, problem, inputs)
                wrong = _failing(_check_outputs(spec, runner, problem, inputs, spec.reference(inputs), trial.outputs,
                                                checked(trial), watch), formats)
                if wrong:
                    raise CheckFailed(f"wrong after timing on refilled inputs: {', '.join(wrong)}")
            if trial.checking and spec.train_step:
                _check_training(spec, problem, formats)
        trial.outputs = {}  # its memory, before the next runner's references
    return {trial.runner.name: trial.result(shape, dims, work) for trial in trials}


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


def shape_problem(run: BenchRun, shape: Shape) -> Problem:
    """The problem the bench checks and times for `shape`: its dims, dtype, device, seed, split and variant."""
    return Problem(dims=run.dims[shape.label], dtype=run.dtype, device=run.timer.device,
                   seed=shape_seed(run.seed, shape.label), group_lens=shape.group_lens, variant=run.variant)


def run_shape(run: BenchRun, shape: Shape) -> dict[str, ShapeResult]:
    """Every runner on one shape, all on the same inputs and reference."""
    spec, dims = run.spec, run.dims[shape.label]
    problem = shape_problem(run, shape)
    try:
        inputs = spec.make_inputs(problem)
        ref = spec.reference(inputs)
    except Exception as exc:
        error = _describe(exc)
        return {r.name: _failed(shape, dims, error, (math.nan, math.nan)) for r in run.runners}
    results = run_runners(spec, run.runners, problem, inputs, ref, shape, dims, run.timer, skew_checks(problem),
                          run.fresh_sets, run.checks == "full")
    del inputs, ref
    return results


def check_probe(run: BenchRun, probe: Probe) -> str | None:
    """Check our runner on one probe (never timed): None if right, else why not ("check: ..." or the
    exception). A ragged shape gets the full checks, forward and backward, the training check included;
    the accumulation probe runs the forward alone, scaled inputs into an fp32 output buffer."""
    spec, problem = run.spec, probe.problem(run.dtype, run.timer.device, run.variant)
    runner, formats = spec.runner, spec.snr_formats(problem)
    try:
        inputs = spec.make_inputs(problem)
        outputs = spec.make_outputs(problem, inputs)
        if probe.accumulation:
            for t in inputs.values():
                if t.is_floating_point():
                    t.mul_(probe.scale)
            outputs["out"] = torch.empty_like(outputs["out"], dtype=torch.float32)
            runner = dataclasses.replace(runner, backward=None)
            formats = {"out": accumulation_format(formats["out"])}
        names = spec.outputs if runner.backward else spec.forward_outputs
        ref = spec.reference(inputs)
        wrong = _failing(_check_outputs(spec, runner, problem, inputs, ref, outputs, names, watch_threads=True),
                         formats)
        if wrong:
            raise CheckFailed(f"wrong: {', '.join(wrong)}")
        if not probe.accumulation:
            _check_grad_disabled(spec, runner, problem, inputs, ref, outputs, names, formats)
            if spec.train_step:
                _check_training(spec, problem, formats)
    except CheckFailed as exc:
        return f"check: {exc}"
    except Exception as exc:  # a probe that raises fails like a shape, and the run goes on
        return _describe(exc)
    return None


class Screen:
    """Our runner measured again and again on the same shapes (the search's trials: one tuned-table config
    after another): each shape's inputs and float64 reference are made once, at its first `measure`; each
    `measure` checks the outputs (poisoned first, inputs unchanged, SNR) and times forward and backward.

    A first look, never a verdict: the skewed splits, the recheck on refilled inputs and the full checks
    are for the bench a campaign validates its candidate with.
    """

    def __init__(self, run: BenchRun) -> None:
        self.run = run
        self._prepared: dict[str, tuple[Problem, Tensors, Tensors]] = {}

    def _prepare(self, shape: Shape) -> tuple[Problem, Tensors, Tensors]:
        if shape.label not in self._prepared:
            problem = shape_problem(self.run, shape)
            inputs = self.run.spec.make_inputs(problem)
            self._prepared[shape.label] = problem, inputs, self.run.spec.reference(inputs)
        return self._prepared[shape.label]

    def measure(self, repeats: int, labels: Collection[str] | None = None) -> list[ShapeResult]:
        """One ShapeResult per shape (those of `labels` only, if given), each timed with `repeats` calls
        per pass."""
        run, results = self.run, []
        run.timer.repeats = repeats
        for shape in (s for s in run.shapes if labels is None or s.label in labels):
            dims = run.dims[shape.label]
            try:
                problem, inputs, ref = self._prepare(shape)
            except Exception as exc:  # as in run_shape: the shape fails, the others are measured
                results.append(_failed(shape, dims, _describe(exc), (math.nan, math.nan)))
                continue
            runner = run.spec.runner
            results.append(run_runners(run.spec, [runner], problem, inputs, ref, shape, dims, run.timer,
                                       recheck=False)[runner.name])
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
    checks: str = "full",
    probe_seed: int | None = None,
) -> BenchRun:
    """Validate everything about a benchmark (raising UserError) before any work starts.

    `checks`: "full" (what campaigns run) or "basic" (the checks before the training, timed-output,
    thread and probe checks: it exists to measure their cost). `probe_seed` draws the unannounced
    probes (full checks only; none without it).
    """
    schema = get_schema(spec.schema)
    if schema.outputs != spec.outputs:
        raise UserError(f"op {spec.name} checks outputs {spec.outputs}, schema '{schema.name}' has {schema.outputs}")
    if checks not in CHECK_LEVELS:
        raise UserError(f"unknown check level '{checks}' (use one of {', '.join(CHECK_LEVELS)})")
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
    rules = load_rules()
    probes = (draw_probes(spec.shape_family, spec.fp32_accumulation, probe_seed, rules.probe_shapes,
                          interpreter_mode()) if probe_seed is not None and checks == "full" else [])
    return BenchRun(spec, schema, list(shapes), dims, [spec.runner, *baselines], torch_dtype, variant,
                    shapes_source, seed, timer, rules.fresh_input_sets if fresh_inputs else 0, checks, probe_seed,
                    probes)


def execute_bench(run: BenchRun, on_shape: Callable[[Shape], None] | None = None) -> BenchRun:
    """Check and time every runner on every shape (`on_shape` is called after each), then check our
    runner on the probes."""
    run.results = {r.name: [] for r in run.runners}
    for shape in run.shapes:
        for name, result in run_shape(run, shape).items():
            run.results[name].append(result)
        if on_shape:
            on_shape(shape)
    run.probe_errors = {}
    for probe in run.probes:
        error = check_probe(run, probe)
        if error:
            run.probe_errors[probe.label] = error
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
        mode=run.timer.mode, repeats=run.timer.repeats, warmup=run.timer.warmup, l2_flush=run.timer.flushes_l2,
        rounds=min(TIMING_ROUNDS, run.timer.repeats), note=timing_note(run.timer.mode),
    )
    csv_paths = {name: summary_csv if name == run.spec.runner.name else baseline_csv_path(summary_csv, name)
                 for name in run.results}
    written = []
    for name, results in run.results.items():
        path, ours = csv_paths[name], name == run.spec.runner.name
        write_summary(path, run.schema, [r.row(run.schema) for r in results])
        meta = BenchMeta(
            op=run.spec.name, runner=name, csv_schema=run.schema.name, dtype=dtype_name(run.dtype),
            variant=run.variant,
            shapes=run.shapes_source, seed=run.seed, timing=timing,
            errors={r.shape.label: r.error for r in results if r.error},
            host_bound={r.shape.label: r.host_bound for r in results if r.host_bound},
            fresh_ms={r.shape.label: (r.fresh_fwd.median_ms, r.fresh_bwd.median_ms) for r in results
                      if math.isfinite(r.fresh_fwd.median_ms)},
            baseline_csvs={n: p.name for n, p in csv_paths.items() if ours and p != path},
            checks=run.checks,
            probes=[p.label for p in run.probes] if ours else [],
            probe_errors=run.probe_errors if ours else {},
            **env,
        )
        written += [path, write_meta(path, meta)]
    return written
