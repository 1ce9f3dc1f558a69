"""When a campaign stops: every stop condition its manifest sets, checked before each round (pure).

The same list is the report's termination-check block and part of `status`, so what stopped a
campaign and how far it was from each other condition read the same everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from agent.state import Termination


@dataclass(frozen=True)
class Progress:
    """What the conditions are checked against."""

    rounds_done: int
    elapsed_s: float
    # Best over baseline on the primary metric (representative shapes); nan before BASELINE.
    speedup: float
    # The best's geomean per metric (representative shapes).
    best: Mapping[str, float]
    # Best over the primary vendor baseline (geomean of per-shape ratios); nan when none measures the metric.
    vs_vendor: float
    # Geomean of the forward rate over its measured roofline; nan without measured ceilings.
    efficiency: float
    stop_requested: bool


def _fmt(value: float, suffix: str = "") -> str:
    return f"{value:.4g}{suffix}" if math.isfinite(value) else "n/a"


def stop_conditions(
    progress: Progress, *, max_iterations: int, max_duration_min: float, target_speedup: float | None = None,
    target: Mapping[str, float] | None = None, target_vs_vendor: float | None = None,
    hardware_efficiency: float | None = None,
) -> list[Termination]:
    """Every condition that applies, with its threshold, the current value and whether it is met."""
    checks = [Termination(condition="stopped by the user", threshold="`turbo-opt stop`",
                          value="requested" if progress.stop_requested else "no", met=progress.stop_requested)]
    if target_speedup is not None:
        checks.append(Termination(condition="target speedup over the baseline", threshold=f"{target_speedup:g}x",
                                  value=_fmt(progress.speedup, "x"), met=progress.speedup >= target_speedup))
    if target:  # one condition: every metric named must reach its target
        have = {metric: progress.best.get(metric, math.nan) for metric in target}
        checks.append(Termination(condition=f"target {' and '.join(target)} geomean",
                                  threshold=", ".join(f"{m} {v:g}" for m, v in target.items()),
                                  value=", ".join(f"{m} {_fmt(v)}" for m, v in have.items()),
                                  met=all(have[m] >= v for m, v in target.items())))
    if target_vs_vendor is not None:
        checks.append(Termination(condition="target ratio to the vendor baseline", threshold=f"{target_vs_vendor:g}x",
                                  value=_fmt(progress.vs_vendor, "x"), met=progress.vs_vendor >= target_vs_vendor))
    if hardware_efficiency is not None:
        checks.append(Termination(condition="hardware efficiency (forward, of the measured roofline)",
                                  threshold=f"{hardware_efficiency:.0%}", value=_fmt(progress.efficiency),
                                  met=progress.efficiency >= hardware_efficiency))
    checks += [
        Termination(condition="max iterations", threshold=str(max_iterations), value=str(progress.rounds_done),
                    met=progress.rounds_done >= max_iterations),
        Termination(condition="max duration", threshold=f"{max_duration_min:g} min",
                    value=f"{progress.elapsed_s / 60:.1f} min", met=progress.elapsed_s >= max_duration_min * 60),
    ]
    return checks


def stop_reason(checks: list[Termination]) -> str | None:
    """The first condition met, in words, or None to go on."""
    met = next((c for c in checks if c.met), None)
    if met is None:
        return None
    return met.condition if met.condition == "stopped by the user" else f"{met.condition} reached ({met.value})"
