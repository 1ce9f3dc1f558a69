"""VALIDATE: the target's focused test where it has one, the candidate benchmarked in a subprocess with
every check of the referee (on unannounced shapes too), and the best commit benchmarked next to it on
the representative shapes (before it on every other repeat): the A/B pair every comparison of DECIDE is
made within, so that a machine whose speed drifts between rounds cannot decide. A candidate that broke
the test, raised, or failed only where the campaign did not look gets its verdict here, before any
timing is compared."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.bench import BenchError, BenchRequest
from agent.manifest import Manifest
from agent.scoring import score
from agent.state import Measurement, RoundRecord, RoundStatus
from harness.meta import read_meta
from harness.schema import Summary


class Bench(Protocol):
    def __call__(self, request: BenchRequest, what: str) -> Summary: ...


class Tree(Protocol):
    """Puts the working tree where a benchmark needs it."""

    def at_best(self) -> None: ...

    def at_candidate(self, number: int) -> None: ...

    def focused_test(self, log: Path) -> str | None:
        """Run the target's focused test on the tree as it is: None if it passes (or there is none), else why not."""


@dataclass(frozen=True)
class Validation:
    """The candidate's measurement and the best's next to it, or a verdict reached without comparing timings."""

    candidate: Measurement | None = None
    reference: Measurement | None = None
    status: RoundStatus | None = None
    reason: str = ""


def probe_seed() -> int:
    """Drawn afresh for every measurement, after the candidate is frozen: nothing can anticipate it."""
    return random.SystemRandom().randrange(2**31)


def validate(record: RoundRecord, run_dir: Path, manifest: Manifest, bench: Bench, tree: Tree) -> Validation:
    """One A/B pair: the candidate and the best, alternating which goes first from one repeat to the next
    (A B, B A, ...), so that a machine whose speed drifts during a round favours neither side."""
    if not manifest.paired_reference:
        return _candidate(record, run_dir, manifest, bench, tree)
    metric, labels = manifest.primary_metric, manifest.representative_shapes
    best_first = len(record.measurements) % 2 == 1
    reference = _reference(record, run_dir, metric, labels, bench, tree) if best_first else None
    if isinstance(reference, Validation):
        return reference
    found = _candidate(record, run_dir, manifest, bench, tree)
    if found.status is not None or found.candidate is None or not found.candidate.all_pass:
        return found
    reference = reference or _reference(record, run_dir, metric, labels, bench, tree)
    return reference if isinstance(reference, Validation) else Validation(found.candidate, reference)


def _csv(record: RoundRecord, run_dir: Path) -> Path:
    n = len(record.measurements)
    return run_dir / "rounds" / f"round-{record.number}" / "artifacts" / (
        "benchmark.csv" if n == 0 else f"benchmark.remeasure-{n}.csv")


def _candidate(record: RoundRecord, run_dir: Path, manifest: Manifest, bench: Bench, tree: Tree) -> Validation:
    """The candidate measured with every check; a verdict where it raised or failed only on probes."""
    csv = _csv(record, run_dir)
    which = "all" if record.full_validation else "representative"
    tree.at_candidate(record.number)
    if not record.measurements:  # the target's own tests first: a candidate that breaks them is wrong, however fast
        failure = tree.focused_test(csv.with_name("test.log"))
        if failure is not None:
            return Validation(status="ROLLBACK", reason=failure)
    try:
        summary = bench(BenchRequest(run_dir / "shapes.yaml" if record.full_validation
                                     else run_dir / "representative.yaml", csv,
                                     csv.with_suffix(".log"), probe_seed=probe_seed(),
                                     scope="all" if record.full_validation else "representative"),
                        f"round {record.number} ({which} shapes)")
    except BenchError as exc:
        return Validation(status="ERROR", reason=str(exc))
    meta = read_meta(csv)
    crashes = {label: e for label, e in meta.errors.items() if not e.startswith("check:")}
    if crashes:  # the candidate did not run (it raised), as opposed to running and being wrong
        label, error = next(iter(crashes.items()))
        return Validation(status="ERROR", reason=f"raised on {label}: {error}")
    rel = csv.relative_to(run_dir).as_posix()
    candidate = score(summary, manifest.primary_metric, rel, manifest.representative_shapes, meta.fresh_ms)
    if meta.probe_errors and candidate.all_pass:  # wrong only where the campaign did not look
        label, error = next(iter(meta.probe_errors.items()))
        return Validation(candidate=candidate, status="ROLLBACK", reason=f"unannounced shape {label}: {error}")
    return Validation(candidate=candidate)


def _reference(record: RoundRecord, run_dir: Path, metric: str, labels: list[str], bench: Bench,
               tree: Tree) -> Measurement | Validation:
    """The best re-measured on the representative shapes (the ones the decision reads), or an ERROR."""
    csv = _csv(record, run_dir)
    reference_csv = csv.with_name(csv.name.replace("benchmark", "reference"))
    tree.at_best()
    try:
        reference = bench(BenchRequest(run_dir / "representative.yaml", reference_csv,
                                       reference_csv.with_suffix(".log"), scope="representative"),
                          "the best next to it")
    except BenchError as exc:
        return Validation(status="ERROR", reason=f"re-measuring the best failed: {exc}")
    return score(reference, metric, reference_csv.relative_to(run_dir).as_posix(), labels,
                 read_meta(reference_csv).fresh_ms)
