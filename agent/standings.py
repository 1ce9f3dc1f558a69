"""Where the kernel stands, per shape: the baseline, the best so far, and the vendor libraries measured
next to the baseline at BASELINE (one `benchmark.baseline-<name>.csv` per library)."""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel

from agent.state import CampaignState
from harness.meta import read_meta
from harness.schema import read_summary


class Vendor(BaseModel):
    """A vendor library's numbers on one metric (its own: a forward-only library has no step)."""

    name: str
    metric: str
    per_shape: dict[str, float]


class ShapeStanding(BaseModel):
    label: str
    baseline: float
    best: float
    # vendor name -> best / vendor on the vendor's metric (forward when it measures no step); None: not measured
    vs_vendor: dict[str, float | None]
    # the best's passes ("fwd", "bwd") timed mostly at its host time: a faster kernel would not show there
    host_bound: list[str] = []

    @property
    def speedup(self) -> float:
        return self.best / self.baseline if self.baseline > 0 else math.nan


def vendors(run_dir: Path, metric: str) -> list[Vendor]:
    """The vendor baselines measured at BASELINE, each on `metric` if it measures it, else on forward."""
    found = []
    for csv in sorted((run_dir / "rounds" / "round-1" / "artifacts").glob("benchmark.baseline-*.csv")):
        summary = read_summary(csv)
        values, used = summary.metric(metric), metric
        if values.isna().all():
            values, used = summary.metric("forward"), "forward"
        found.append(Vendor(name=csv.stem.removeprefix("benchmark.baseline-"), metric=used,
                            per_shape={k: float(v) for k, v in values.items()}))
    return found


def primary_vendor(run_dir: Path, metric: str) -> Vendor | None:
    """The first vendor that measures the primary metric itself: the one a target ratio is against."""
    return next((v for v in vendors(run_dir, metric) if v.metric == metric), None)


def best_per_metric(run_dir: Path, state: CampaignState) -> dict[str, dict[str, float]]:
    """The best measurement's per-shape rate on each metric (read from its CSV)."""
    assert state.best is not None
    summary = read_summary(run_dir / state.best.csv)
    return {m: {k: float(v) for k, v in summary.metric(m).items()} for m in ("forward", "backward", "step")}


def standings(run_dir: Path, state: CampaignState, metric: str) -> list[ShapeStanding]:
    """The representative shapes: baseline, best and the ratio of the best to each vendor."""
    assert state.best is not None
    base = state.rounds[0].measurements[0]
    best = best_per_metric(run_dir, state)
    measured = vendors(run_dir, metric)  # read once: one CSV per vendor
    host_bound = read_meta(run_dir / state.best.csv).host_bound
    rows = []
    for label, value in state.best.per_shape.items():
        ratios: dict[str, float | None] = {}
        for vendor in measured:
            theirs = vendor.per_shape.get(label, math.nan)
            ours = best[vendor.metric].get(label, math.nan)
            ratio = ours / theirs if theirs > 0 else math.nan
            ratios[vendor.name] = ratio if math.isfinite(ratio) else None
        rows.append(ShapeStanding(label=label, baseline=base.per_shape[label], best=value, vs_vendor=ratios,
                                  host_bound=host_bound.get(label, [])))
    return rows
