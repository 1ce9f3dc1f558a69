"""Trials: many configs of one tuned-table bucket measured quickly in one process, the search's cheap
first look before a round's full VALIDATE (which only the winner gets).

`python -m agent.trials` serves jobs, one a line on stdin ("JOB.json SCORES.json"), answering each
with "done" on stdout once SCORES.json holds its scores: a worker lives across the batches of a
search (agent/trial_pool.py), so it starts Python, torch and the CUDA context once, and makes each
shape's inputs and float64 reference once (harness `Screen`; a later job on some of those shapes
measures those only). A job sets the op's TUNED_TABLE[bucket] to each config in turn (in memory:
the op reads its table at every call) and checks and times our runner on the job's shapes with the
job's repeats (a config that computes wrong scores NaN). The score is the geomean over the shapes
of the primary metric; SCORES.json is rewritten after every config, so a worker that is killed or
dies still hands back the scores it finished. A job's first config is the one the others are compared
with (agent/trial_pool.py); a config far behind it on its first call is scored from that call alone
(HOPELESS_BELOW).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import sys
import time
from pathlib import Path
from typing import TextIO

from pydantic import BaseModel, ConfigDict, Field

from agent.manifest import Metric
from harness.files import atomic_write_text
from harness.quick_test_bench import Screen, ShapeResult, prepare_bench
from harness.registry import get_spec
from harness.schema import PASS
from harness.shapes import Shape
from harness.stats import geomean
from kernels.common.device import interpreter_mode

DONE = "done"
# Timed calls per config at a search's lowest fidelity on a GPU (the interpreter gets one: its timings decide
# nothing).
GPU_REPEATS = 10
# Untimed calls before each config's timed ones: its check call has compiled and run it already, and the GPU
# is kept busy from one config to the next (the harness's default of 10 was half of a low-fidelity trial).
TRIAL_WARMUP = 2
# A config whose first (unscored) call rates below this fraction of the job's first config is scored from that call
# alone: the first call of a config read as low as 0.79x its own later timing (a GPU that idled while it compiled,
# docs/performance.md HL), so such a config is at best 0.63x the reference and cannot win. Timed in full, such
# configs took a search up to 42 s each on llama3-70b's lm_head (8192 x 128256 x 8192) where the reference took 3 s,
# and one rung of 17 configs most of a 7.5-minute campaign (IF).
HOPELESS_BELOW = 0.5


class TrialJob(BaseModel):
    model_config = ConfigDict(extra="forbid")

    op: str
    variant: str
    dtype: str = "auto"
    metric: Metric = "step"
    shapes: list[Shape]
    bucket: str
    configs: list[dict[str, int]]
    # timed calls per config at the lowest fidelity (the search multiplies it)
    repeats: int = Field(ge=1)

    def screen_key(self) -> str:
        """What a worker's Screen is made for besides its shapes: jobs alike in this, on some of its shapes,
        share its inputs and references."""
        return self.model_dump_json(include={"op", "variant", "dtype"})


class TrialScores(BaseModel):
    """One score per config of the job, in order, for the configs measured so far (NaN: it failed), the
    seconds each took (its compile, check and timing) and the timed calls its score stands on (1 for a config
    cut after its first call: HOPELESS_BELOW)."""

    model_config = ConfigDict(ser_json_inf_nan="constants")

    scores: list[float] = []
    errors: list[str | None] = []
    seconds: list[float] = []
    repeats: list[int] = []


def rate(result: ShapeResult, metric: Metric) -> float:
    """The shape's primary metric in work per millisecond (the unit cancels in every ratio)."""
    fwd_ms, bwd_ms = result.fwd.median_ms, result.bwd.median_ms
    work = {"forward": (result.work[0], fwd_ms), "backward": (result.work[1], bwd_ms),
            "step": (sum(result.work), fwd_ms + bwd_ms)}[metric]
    return work[0] / work[1] if work[1] > 0 else math.nan


def trial_repeats() -> int:
    return 1 if interpreter_mode() else GPU_REPEATS


def trial_timing() -> str | None:
    """Trials time a config's kernels alone, as CUDA-graph replays, whatever the campaign's benches do: a
    tuned-table config changes kernels only, and the host time of a call is the same for every config. Timed as
    a loop pays it (host time included), the same config read 0.74-1.23x the base across the rungs of one
    search, and the base itself 720-894 TFLOPS from batch to batch (H200, docs/performance.md IA): the screen
    ranked configs by the host's noise. As replays, four batches of the base agreed within 0.3-2.5% and each
    candidate's ratio to it within 0.1-4.4%, against 6-33% with host time in (IB). The interpreter keeps its wall
    clock."""
    return None if interpreter_mode() else "cuda-graph"


def make_screen(job: TrialJob) -> Screen:
    return Screen(prepare_bench(get_spec(job.op), job.shapes, shapes_source=f"trials of {job.bucket}",
                                dtype=job.dtype, variant=job.variant, warmup=TRIAL_WARMUP, checks="basic",
                                timing_mode=trial_timing()))


def run_trials(job: TrialJob, out: Path, screen: Screen | None = None) -> TrialScores:
    table = importlib.import_module(f"kernels.{job.op}.tuning").TUNED_TABLE
    screen = screen or make_screen(job)
    labels = {s.label for s in job.shapes}
    found = TrialScores()
    original = table[job.bucket]
    reference = math.nan
    for index, cfg in enumerate(job.configs):
        started = time.monotonic()
        table[job.bucket] = original | cfg
        try:
            # Each config runs once unscored (one timed call), then is scored: a GPU that idled, while a new
            # config compiled on the CPU or between two batches, times the next calls cold. On the H100 a batch's
            # first config, the one every other is scored against, read 0.79x its own second measurement, so the
            # search screened candidates 20-25% ahead of the config they were to replace (docs/performance.md
            # HL). A config that raises here raises again below, where its error is recorded.
            first = math.nan
            with contextlib.suppress(Exception):
                first = _score(screen.measure(1, labels), job.metric)
            if index and first < HOPELESS_BELOW * reference:  # False while either is NaN
                score, error, repeats = first, None, 1
            else:
                results = screen.measure(job.repeats, labels)
                failed = [r for r in results if r.check != PASS]
                error = f"{failed[0].shape.label}: {failed[0].error or 'check FAIL'}" if failed else None
                score, repeats = _score(results, job.metric), job.repeats
        except Exception as exc:  # a config the compiler or the launcher refuses: this config fails, not the job
            score, error, repeats = math.nan, f"{type(exc).__name__}: {str(exc)[:200]}", 0
        finally:
            table[job.bucket] = original
        reference = score if index == 0 else reference
        found.scores.append(score)
        found.errors.append(error)
        found.seconds.append(round(time.monotonic() - started, 3))
        found.repeats.append(repeats)
        atomic_write_text(out, found.model_dump_json())
    return found


def _score(results: list[ShapeResult], metric: Metric) -> float:
    """The geomean of the shapes' rates, NaN where any shape's check did not pass."""
    if any(r.check != PASS for r in results):
        return math.nan
    return geomean(rate(r, metric) for r in results)


def serve(requests: TextIO, answers: TextIO) -> None:
    """Run each job named on `requests` until it closes, answering DONE for each on `answers`."""
    screen, key = None, ""
    for line in requests:
        job_path, out = (Path(p) for p in line.split())
        job = TrialJob.model_validate_json(job_path.read_text())
        if screen is None or key != job.screen_key() or not {s.label for s in job.shapes} <= set(screen.run.dims):
            screen = None  # the old inputs and references freed before the new ones are made
            screen, key = make_screen(job), job.screen_key()
        run_trials(job, out, screen)
        answers.write(DONE + "\n")
        answers.flush()


def main() -> int:
    # The answers get a stdout of their own; whatever the kernels, the compiler or the harness print goes to
    # stderr (the worker's log) and cannot be taken for an answer.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
