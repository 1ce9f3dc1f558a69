"""Scores and decisions: pure functions over summary CSVs and the rules (no GPU, no git, no I/O).

A benchmark's summary is scored per shape on each metric (forward, backward, and the combined step
= all work over all time) and aggregated by geomean over PASS rows into a Measurement. `decide`
applies rules/iteration_rules.yaml to a candidate's measurements against the best so far.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from agent.state import Measurement
from harness.rules import IterationRules
from harness.schema import PASS, Summary
from harness.stats import geomean

METRICS = ("forward", "backward", "step")
Verdict = Literal["ACCEPT", "ROLLBACK", "REMEASURE"]


def fresh_metric(summary: Summary, metric: str, fresh_ms: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """The primary metric per shape recomputed with fresh-input times: the same work over other times."""
    f = summary.frame.set_index("label")
    s = summary.schema
    out = {}
    for label, (fwd_ms, bwd_ms) in fresh_ms.items():
        work_f = f.at[label, s.fwd_metric] * f.at[label, s.fwd_ms]
        work_b = f.at[label, s.bwd_metric] * f.at[label, s.bwd_ms]
        out[label] = {"forward": work_f / fwd_ms, "backward": work_b / bwd_ms,
                      "step": (work_f + work_b) / (fwd_ms + bwd_ms)}[metric]
    return out


def score(
    summary: Summary, metric: str, csv: str, labels: Sequence[str] | None = None,
    fresh_ms: Mapping[str, tuple[float, float]] | None = None,
) -> Measurement:
    """Score a summary CSV on the given shapes (all when None), with its fresh-input timings if given."""
    labels = list(labels) if labels else summary.labels
    missing = [label for label in labels if label not in summary.labels]
    if missing:
        raise ValueError(f"{summary.path}: shapes missing from the measurement: {missing}")
    checks = summary.checks()
    passing = [label for label in labels if checks[label] == PASS]
    primary = summary.metric(metric)
    fresh = fresh_metric(summary, metric, fresh_ms or {})
    fresh_passing = [fresh[label] for label in passing if label in fresh]
    return Measurement(
        fresh_geomean=geomean(fresh_passing) if fresh_passing and len(fresh_passing) == len(passing) else None,
        csv=csv,
        all_pass=len(passing) == len(labels),
        geomeans={m: geomean(summary.metric(m)[passing]) for m in METRICS},
        per_shape={label: float(primary[label]) for label in labels},
        failed=[label for label in labels if label not in passing],
    )


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str
    gain_pct: float
    fresh_gain_pct: float = math.nan
    # Highest minus lowest of the A/B pairs' own gains (%): how far the repeats disagreed (nan with one pair).
    spread_pct: float = math.nan


def _drift(reference: Measurement, recorded: Measurement, labels: Sequence[str]) -> float:
    """How fast the machine ran a re-measurement of the best: the median over the shapes of it over the
    recorded numbers (a slow machine moves every shape alike; an outlier moves one)."""
    ratios = [r for label in labels if math.isfinite(r := reference.per_shape[label] / recorded.per_shape[label])]
    return statistics.median(ratios) if ratios else 1.0


def reference_outliers(references: Sequence[Measurement], recorded: Measurement, shapes: Sequence[str],
                       rules: IterationRules) -> dict[str, dict[int, float]]:
    """The re-measurements of the best that are far from what it should have measured, per shape: {label:
    {index: the value expected there}}. Each one's drift (`_drift`) is divided out; what a shape should
    measure is its recorded number, or, once the best was re-measured twice or more, the median of that
    and the re-measurements (so that when they agree against a fluke recorded number, they win). Off
    by more than `reference_outlier_pct` is an outlier."""
    labels = [label for label in shapes if recorded.per_shape.get(label, math.nan) > 0]
    drifts = [_drift(ref, recorded, labels) for ref in references]
    outliers: dict[str, dict[int, float]] = {}
    for label in labels:
        seen = [ref.per_shape[label] / drift for ref, drift in zip(references, drifts, strict=True)]
        finite = [v for v in seen if math.isfinite(v)]
        expected = statistics.median([recorded.per_shape[label], *finite]) if len(finite) > 1 \
            else recorded.per_shape[label]
        for i, (value, drift) in enumerate(zip(seen, drifts, strict=True)):
            if not abs(value / expected - 1.0) * 100.0 <= rules.reference_outlier_pct:
                outliers.setdefault(label, {})[i] = expected * drift
    return outliers


def recorded_best(best: Measurement, remeasured: Sequence[Measurement]) -> Measurement:
    """The best's recorded numbers: per shape, the median over the measurement it was accepted with and
    every re-measurement of it next to a later candidate, so that an outlier in any one does not stick."""
    every = [best, *remeasured]
    return best.model_copy(update={"per_shape": {
        label: statistics.median(m.per_shape[label] for m in every if label in m.per_shape)
        for label in best.per_shape}})


def decide(
    candidate: Sequence[Measurement], references: Sequence[Measurement], metric: str, rules: IterationRules,
    shapes: Sequence[str], recorded: Measurement | None = None,
) -> Decision:
    """ACCEPT, ROLLBACK or REMEASURE a candidate measured `len(candidate)` times against the best.

    `references` are the best commit's measurements: one per candidate measurement, taken next to
    it (A/B pairs, so that a machine whose speed drifts between rounds cannot decide), or the single
    recorded best. `recorded` is the best's recorded measurement: where a re-measurement is far from
    what the best should measure on a shape (`reference_outliers`), that pair's ratio on that shape
    is taken against the expected value instead; and if the outlier as measured would have changed
    the verdict, both are re-measured first (up to the rules' count). The basis of everything below
    is, per shape, the median over the pairs of candidate over best, and the gain is their geomean:
    the step geomean ratio of one pair, and one outlying pair cannot carry it.

    Any FAIL rejects. A shape more than `implausible_speedup` times the best is re-measured (a new
    process) and rejected unless reproduced. The gain must beat the best and no shape may regress
    past the per-shape limit; a gain inside the noise floor is re-measured up to the rules' count
    and then accepted only if every pair beat the best. An accepted gain must survive fresh input
    tensors (`fresh_gain_fraction` of it), or it is overfit; and a candidate that is faster with
    reused tensors than with fresh ones by more than `cache_gap_pct`, and by that much more than the
    best is, in every pair (a single pair that shows it is re-measured), keeps results between calls
    (a cache), whatever its gain.
    """
    last = candidate[-1]
    if not last.all_pass:
        return Decision("ROLLBACK", f"FAIL on {', '.join(last.failed)}", math.nan)
    if len(references) not in (1, len(candidate)):
        raise ValueError(f"{len(references)} reference measurements for {len(candidate)} candidate measurements")
    pairs = list(zip(candidate, references if len(references) > 1 else references * len(candidate), strict=True))
    fresh = [m.fresh_geomean / ref.fresh_geomean - 1.0 for m, ref in pairs
             if m.fresh_geomean is not None and ref.fresh_geomean is not None]
    fresh_pct = 100.0 * statistics.median(fresh) if fresh else math.nan
    cache = _cache_gap(pairs, metric, rules)
    if cache and len(pairs) < 2:
        return Decision("REMEASURE", f"{cache}: re-measuring both before calling it a cache", math.nan, fresh_pct)
    if cache:
        return Decision("ROLLBACK", cache, math.nan, fresh_pct)
    raw = {label: [m.per_shape[label] / ref.per_shape[label] for m, ref in pairs] for label in shapes}
    outliers = reference_outliers([ref for _, ref in pairs], recorded, shapes, rules) if recorded else {}
    robust = {label: [m.per_shape[label] / outliers[label][i] if i in outliers.get(label, {}) else r
                      for i, ((m, _), r) in enumerate(zip(pairs, rs, strict=True))] for label, rs in raw.items()}
    verdict = _on_ratios(robust, metric, rules)
    if outliers and len(candidate) < 1 + rules.remeasure_count and _on_ratios(raw, metric, rules).verdict != \
            verdict.verdict:
        label, i = next((label, max(found)) for label, found in outliers.items())
        off = pairs[i][1].per_shape[label] / outliers[label][i]
        return Decision("REMEASURE", f"the best re-measured at {off:.2f}x what it measures on {label}, an outlier "
                        "that would change the verdict: re-measuring both", math.nan)
    verdict = dataclasses.replace(verdict, fresh_gain_pct=fresh_pct)
    if verdict.verdict != "ACCEPT" or not fresh:
        return verdict
    if fresh_pct < rules.fresh_gain_fraction * verdict.gain_pct:
        return dataclasses.replace(verdict, verdict="ROLLBACK", reason=f"overfit: {verdict.gain_pct:+.2f}% with "
                                   f"reused tensors, {fresh_pct:+.2f}% with fresh ones")
    return dataclasses.replace(verdict, reason=f"{verdict.reason} ({fresh_pct:+.2f}% with fresh tensors)")


def _on_ratios(ratios: Mapping[str, Sequence[float]], metric: str, rules: IterationRules) -> Decision:
    """The verdict of `decide` on per-shape ratios of candidate over best, one per A/B pair: a shape
    implausibly faster is re-measured until reproduced; then the gain (the geomean over the shapes of
    their median over the pairs) and the per-shape regressions decide (`_decide_gain`)."""
    wild = {label: rs[0] for label, rs in ratios.items() if rs[0] > rules.implausible_speedup}
    if wild:
        shown = ", ".join(f"{label} {r:.1f}x" for label, r in wild.items())
        if any(len(ratios[label]) == 1 for label in wild):
            return Decision("REMEASURE", f"implausible ({shown} the best): re-measuring in isolation", math.nan)
        if any(abs(ratios[label][-1] / r - 1) * 100 > 2 * rules.noise_floor_pct for label, r in wild.items()):
            return Decision("ROLLBACK", f"implausible and not reproducible: {shown}", math.nan)
    per_shape = {label: statistics.median(rs) for label, rs in ratios.items()}
    pairs = len(next(iter(ratios.values())))
    pair_gains = [geomean(rs[i] for rs in ratios.values()) - 1.0 for i in range(pairs)]
    verdict = _decide_gain(100.0 * (geomean(per_shape.values()) - 1.0), pair_gains, per_shape, metric, rules)
    spread = 100.0 * (max(pair_gains) - min(pair_gains)) if pairs > 1 else math.nan
    return dataclasses.replace(verdict, spread_pct=spread)


def _cache_gap(pairs: Sequence[tuple[Measurement, Measurement]], metric: str, rules: IterationRules) -> str | None:
    """A candidate that is faster with reused input tensors than with fresh ones (new tensors every call,
    never repeated) by more than `cache_gap_pct`, and by that much more than the best is, keeps results
    between calls: the fresh-tensor timing shows its real speed. Both, so that timing noise on the best's
    side (a best that happened to time faster with fresh tensors) cannot make an honest candidate a cache;
    and in every A/B pair, because a cache hits on every call with reused tensors while a stall on a
    shared machine tilts one pair (`decide` re-measures a gap seen in a single pair)."""
    gaps = [(m.geomeans[metric] / m.fresh_geomean, ref.geomeans[metric] / ref.fresh_geomean) for m, ref in pairs
            if m.fresh_geomean and ref.fresh_geomean]
    if not gaps or min(min(cand, cand / ref) - 1.0 for cand, ref in gaps) * 100.0 <= rules.cache_gap_pct:
        return None
    cand, ref = gaps[-1]
    return (f"result cache: {(cand - 1) * 100:+.1f}% faster with reused input tensors than with fresh ones "
            f"(the best: {(ref - 1) * 100:+.1f}%; limit {rules.cache_gap_pct:g}%)")


def _decide_gain(
    gain_pct: float, pair_gains: Sequence[float], ratios: Mapping[str, float], metric: str, rules: IterationRules,
) -> Decision:
    """The aggregate-gain and per-shape-regression part of `decide`: `gain_pct` the geomean of `ratios` (per
    shape, candidate over best, median over the pairs), `pair_gains` each pair's own."""
    worst = min(ratios, key=ratios.__getitem__)
    limit = rules.per_shape_regression_pct
    if ratios[worst] < 1.0 - limit / 100.0:
        slower = (1.0 - ratios[worst]) * 100.0
        return Decision("ROLLBACK", f"{worst} regressed {slower:.1f}% (limit {limit:g}%)", gain_pct)
    floor = rules.noise_floor_pct
    if gain_pct >= floor:
        return Decision("ACCEPT", f"{metric} geomean {gain_pct:+.2f}% over the best", gain_pct)
    if gain_pct <= -floor:
        return Decision("ROLLBACK", f"{metric} geomean {gain_pct:+.2f}%: slower than the best", gain_pct)
    if len(pair_gains) < 1 + rules.remeasure_count:
        return Decision("REMEASURE", f"{gain_pct:+.2f}% is inside the {floor:g}% noise floor", gain_pct)
    if all(g > 0 for g in pair_gains):
        return Decision("ACCEPT", f"{gain_pct:+.2f}%, ahead in all {len(pair_gains)} measurements", gain_pct)
    return Decision("ROLLBACK", f"ineffective: {gain_pct:+.2f}% is noise over {len(pair_gains)} measurements",
                    gain_pct)


def stagnated(consecutive_rollbacks: int, rules: IterationRules) -> bool:
    """Enough consecutive rollbacks to abandon the current direction."""
    return consecutive_rollbacks >= rules.stagnation_rollbacks


def reproduction(accepted_gains_pct: Sequence[float], measured_pct: float, rules: IterationRules) -> tuple[bool, str]:
    """Did a campaign's gain hold in its final bench (the best next to the start commit)? The claim is its
    accepted rounds' paired gains compounded, the basis every decision was made on; at least
    `reproduction_fraction` of it must remain, and clear the noise floor."""
    if not accepted_gains_pct:
        return True, "no round was accepted: nothing to reproduce"
    claimed = 100.0 * (math.prod(1.0 + g / 100.0 for g in accepted_gains_pct) - 1.0)
    needed = max(rules.noise_floor_pct, rules.reproduction_fraction * claimed)
    return measured_pct >= needed, (f"the accepted rounds claimed {claimed:+.2f}% on the representative shapes; the "
                                    f"final bench of the best next to the start commit measured {measured_pct:+.2f}% "
                                    f"(needed {needed:+.2f}%)")
