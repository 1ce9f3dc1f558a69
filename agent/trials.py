"""Trials: many configs of one tuned-table bucket measured quickly in one process, the search's cheap
first look before a round's full VALIDATE (which only the winner gets).

`python -m agent.trials JOB.json SCORES.json` sets the op's TUNED_TABLE[bucket] to each config in
turn (in memory: the op reads its table at every call) and runs the harness's bench on the job's
shapes with its basic checks (a config that computes wrong scores NaN) and few repeats. The score
is the geomean over the shapes of the primary metric; SCORES.json is rewritten after every config,
so a worker that is killed or dies still hands back the scores it finished.
"""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from agent.manifest import Metric
from harness.files import atomic_write_text
from harness.quick_test_bench import ShapeResult, run_bench
from harness.registry import get_spec
from harness.schema import PASS
from harness.shapes import Shape
from harness.stats import geomean


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


class TrialScores(BaseModel):
    """One score per config of the job, in order, for the configs measured so far (NaN: it failed)."""

    model_config = ConfigDict(ser_json_inf_nan="constants")

    scores: list[float] = []
    errors: list[str | None] = []


def rate(result: ShapeResult, metric: Metric) -> float:
    """The shape's primary metric in work per millisecond (the unit cancels in every ratio)."""
    fwd_ms, bwd_ms = result.fwd.median_ms, result.bwd.median_ms
    work = {"forward": (result.work[0], fwd_ms), "backward": (result.work[1], bwd_ms),
            "step": (sum(result.work), fwd_ms + bwd_ms)}[metric]
    return work[0] / work[1] if work[1] > 0 else math.nan


def run_trials(job: TrialJob, out: Path) -> TrialScores:
    table = importlib.import_module(f"kernels.{job.op}.tuning").TUNED_TABLE
    spec = get_spec(job.op)
    found = TrialScores()
    original = table[job.bucket]
    for cfg in job.configs:
        table[job.bucket] = original | cfg
        try:
            run = run_bench(spec, job.shapes, shapes_source=f"trial of {job.bucket}", dtype=job.dtype,
                            variant=job.variant, repeats=job.repeats, checks="basic")
            failed = [r for r in run.ours if r.check != PASS]
            error = f"{failed[0].shape.label}: {failed[0].error or 'check FAIL'}" if failed else None
            score = math.nan if failed else geomean(rate(r, job.metric) for r in run.ours)
        except Exception as exc:  # a config the compiler or the launcher refuses: this config fails, not the job
            score, error = math.nan, f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            table[job.bucket] = original
        found.scores.append(score)
        found.errors.append(error)
        atomic_write_text(out, found.model_dump_json())
    return found


def main(argv: list[str]) -> int:
    job_path, out = Path(argv[0]), Path(argv[1])
    run_trials(TrialJob.model_validate_json(job_path.read_text()), out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
