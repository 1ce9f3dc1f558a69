"""DECIDE: the verdict on a validated candidate, and what is written down about it.

`scoring.decide` weighs the timings; the overrides here add what the campaign knows besides them:
a full validation that found a FAIL or a shape slower than the baseline, and a forward rate above
the measured roofline, which cannot be real. `attribution` says which passes and shapes moved;
`DecisionRecord` is the round's decision.json.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from pydantic import BaseModel

from agent.analysis import ShapeAnalysis
from agent.manifest import Manifest
from agent.scoring import Decision, decide, score
from agent.state import Candidate, Measurement, RoundRecord, RoundStatus
from harness.meta import read_meta
from harness.rules import IterationRules
from harness.schema import Summary, read_summary

PASSES = ("forward", "backward", "step")


def full_validation_problem(summary: Summary, metric: str, baseline: Measurement, rules: IterationRules) -> str | None:
    """On every shape: all PASS and none slower than the baseline past the regression limit."""
    everything = score(summary, metric, "", None)
    if not everything.all_pass:
        return f"full validation: FAIL on {', '.join(everything.failed)}"
    limit = 1.0 - rules.per_shape_regression_pct / 100.0
    worse = [label for label, v in everything.per_shape.items() if v < limit * baseline.per_shape[label]]
    return f"full validation: slower than the baseline on {', '.join(worse)}" if worse else None


def above_roofline(analyses: list[ShapeAnalysis], rules: IterationRules) -> str | None:
    """A forward rate above `roofline_margin` times the shape's measured roofline cannot be real."""
    margin = rules.roofline_margin
    over = [f"{a.label} {a.achieved_tflops:.0f} > {margin:g} x {a.roofline_tflops:.0f} TFLOPS" for a in analyses
            if math.isfinite(a.roofline_tflops) and a.achieved_tflops > margin * a.roofline_tflops]
    return f"above the roofline (a measurement that cannot be real): {', '.join(over)}" if over else None


def with_overrides(verdict: Decision, full_validation: str | None, roofline: str | None) -> Decision:
    """The timing verdict, unless the full validation or the roofline says otherwise."""
    problem = full_validation or (roofline if verdict.verdict == "ACCEPT" else None)
    if problem and verdict.verdict != "REMEASURE":
        return dataclasses.replace(verdict, verdict="ROLLBACK", reason=problem)
    return verdict


def judge(record: RoundRecord, best: Measurement, baseline: Measurement, run_dir: Path, manifest: Manifest,
          rules: IterationRules, analyses: list[ShapeAnalysis] | None) -> Decision:
    """The verdict on a validated round: the timings against the best (paired where measured so), then the
    full validation and the roofline (`analyses` of the last measurement, None without measured ceilings);
    a FAIL names each failing shape's reason."""
    last = record.measurements[-1]
    last_csv = run_dir / last.csv
    metric = manifest.primary_metric
    verdict = decide(record.measurements, record.references or [best], metric, rules, manifest.representative_shapes,
                     recorded=best if record.references else None)
    full = (full_validation_problem(read_summary(last_csv), metric, baseline, rules)
            if record.full_validation else None)
    verdict = with_overrides(verdict, full, above_roofline(analyses, rules) if analyses else None)
    if not last.all_pass and verdict.verdict != "REMEASURE":
        verdict = dataclasses.replace(verdict, reason=verdict.reason + fail_details(last_csv, last.failed))
    return verdict


def fail_details(csv: Path, failed: list[str]) -> str:
    """Why rows FAILed: the harness's check message (an input written, a stale re-check...) or the SNRs."""
    errors = read_meta(csv).errors
    summary = read_summary(csv)
    snrs = summary.frame.set_index("label")[list(summary.schema.snr_columns)]
    details = []
    for label in failed:
        snr_text = ", ".join(f"{c.removesuffix('_snr')} {v:.1f} dB" for c, v in snrs.loc[label].items())
        details.append(f"; {label}: {errors.get(label) or snr_text}")
    return "".join(details)


def attribution(candidate_csv: Path, reference_csv: Path) -> dict[str, dict[str, float]]:
    """Per shape, candidate over reference on each pass (forward, backward, step): which moved. A pass that
    has no number on either side (a forward-only op's backward) is left out."""
    cand, ref = read_summary(candidate_csv), read_summary(reference_csv)
    ratios: dict[str, dict[str, float]] = {}
    for metric in PASSES:
        mine, theirs = cand.metric(metric), ref.metric(metric)
        for label in cand.labels:
            value = float(mine[label] / theirs[label]) if label in theirs.index and theirs[label] > 0 else math.nan
            if math.isfinite(value):
                ratios.setdefault(label, {})[metric] = value
    return ratios


class DecisionRecord(BaseModel):
    """rounds/round-N/decision.json: the verdict and everything it rests on."""

    campaign: str
    round: int
    status: RoundStatus
    reason: str
    gain_pct: float | None
    fresh_gain_pct: float | None
    spread_pct: float | None = None
    commit: str | None
    best_commit: str
    candidate: Candidate | None
    measurements: list[str]
    references: list[str]
    # shape -> pass -> candidate over the best measured next to it
    attribution: dict[str, dict[str, float]]
    next: str

    @classmethod
    def of(cls, campaign: str, record: RoundRecord, best_commit: str, attribution: dict[str, dict[str, float]],
           next_action: str) -> DecisionRecord:
        return cls(campaign=campaign, round=record.number, status=record.status, reason=record.reason,
                   gain_pct=record.gain_pct, fresh_gain_pct=record.fresh_gain_pct, spread_pct=record.spread_pct,
                   commit=record.commit,
                   best_commit=best_commit, candidate=record.candidate,
                   measurements=[m.csv for m in record.measurements], references=[m.csv for m in record.references],
                   attribution=attribution, next=next_action)
