"""gate: compare a candidate summary CSV with a baseline one of the same schema and shapes.

Per shape, the ratio candidate / baseline of the chosen metric (forward, backward, or the combined
step); the geomean over shapes that PASS in both. Any FAIL row in the candidate fails the gate (an
unlabeled "?" one too, and the baseline's shapes it leaves unmatched), and so does any shape slower
than the baseline by more than the allowed regression. CI and a campaign's VALIDATE use this same
function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.errors import UserError
from harness.schema import FAIL, Summary
from harness.stats import geomean

METRICS: tuple[str, ...] = ("forward", "backward", "step")


@dataclass(frozen=True)
class ShapeComparison:
    label: str
    base: float
    cand: float
    base_check: str
    cand_check: str

    @property
    def ratio(self) -> float:
        return self.cand / self.base if self.base > 0 else math.nan

    @property
    def comparable(self) -> bool:
        return self.base_check != FAIL and self.cand_check != FAIL


@dataclass(frozen=True)
class GateResult:
    metric: str
    max_regression_pct: float
    shapes: tuple[ShapeComparison, ...]
    failures: tuple[str, ...]
    # Why the metric compared is not the one asked for (a kernel without backward is gated on its forward).
    note: str = ""

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def geomean(self) -> float:
        return geomean(s.ratio for s in self.shapes if s.comparable)


def _match(base: Summary, cand: Summary) -> tuple[list[str], list[str]]:
    """The base's shapes the candidate holds too, and the failures for those it lacks when it has
    unlabeled ("?") FAIL rows: those rows are shapes that failed before they had a label, so the
    missing ones count as failed, not as a file of other shapes. Raises a UserError when the files
    hold different shapes otherwise."""
    if base.schema.columns != cand.schema.columns:
        raise UserError(f"{base.path} is schema '{base.schema.name}' but {cand.path} is '{cand.schema.name}'"
                        if base.schema.name != cand.schema.name else
                        f"{base.path} and {cand.path} have different columns")
    base_labels, cand_labels = set(base.labels), set(cand.labels)
    shared = [x for x in base.labels if x in cand_labels]
    only_base = [x for x in base.labels if x not in cand_labels]
    only_cand = [x for x in cand.labels if x not in base_labels]
    if only_cand or (only_base and not cand.unlabeled_failures):
        raise UserError(
            f"the CSVs hold different shapes: only in {base.path.name}: {only_base[:3]}, "
            f"only in {cand.path.name}: {only_cand[:3]}"
        )
    dims = list(base.schema.dims)
    base_dims = base.frame.set_index("label")[dims].loc[shared]
    cand_dims = cand.frame.set_index("label")[dims].loc[shared]
    differ = base_dims.index[(base_dims != cand_dims).any(axis=1)]
    if len(differ):
        raise UserError(f"shape '{differ[0]}' has different dims in the two CSVs")
    failures = [f"{label}: missing from the candidate, which has unlabeled FAIL rows" for label in only_base]
    if cand.unlabeled_failures:
        failures.append(f"{cand.unlabeled_failures} candidate row(s) FAIL without a label ('?')")
    return shared, failures


def compare(base: Summary, cand: Summary, metric: str = "step", max_regression_pct: float = 5.0) -> GateResult:
    """The gate's verdict on `cand` against `base` (pure: no I/O, no GPU)."""
    if metric not in METRICS:
        raise UserError(f"unknown metric '{metric}' (use {', '.join(METRICS)})")
    if max_regression_pct < 0:
        raise UserError(f"--max-regression must be >= 0, got {max_regression_pct}")
    shared, failures = _match(base, cand)
    note = ""
    if metric != "forward" and not any(s.frame[s.schema.bwd_ms].notna().any() for s in (base, cand)):
        note = f"no backward is timed in either CSV: gated on forward, not {metric}"
        metric = "forward"
    base_values, cand_values = base.metric(metric), cand.metric(metric)
    base_checks, cand_checks = base.checks(), cand.checks()
    floor = 1.0 - max_regression_pct / 100.0
    shapes = []
    for label in shared:
        s = ShapeComparison(label, float(base_values[label]), float(cand_values[label]),
                            base_checks[label], cand_checks[label])
        shapes.append(s)
        if s.cand_check == FAIL:
            failures.append(f"{label}: candidate is FAIL")
        elif not s.comparable:
            continue
        elif math.isnan(s.ratio):
            failures.append(f"{label}: no {metric} measurement to compare")
        elif s.ratio < floor:
            slower = (1 - s.ratio) * 100
            failures.append(f"{label}: {s.ratio:.3f}x, {slower:.1f}% slower (limit {max_regression_pct:g}%)")
    return GateResult(metric, max_regression_pct, tuple(shapes), tuple(failures), note)
