"""Stop conditions: pure, on numbers (agent/termination.py)."""

import math

import pytest

from agent.termination import Progress, stop_conditions, stop_reason

BASE = Progress(rounds_done=3, elapsed_s=60.0, speedup=1.1, best={"forward": 500.0, "step": 450.0}, vs_vendor=0.95,
                efficiency=0.7, stop_requested=False)


@pytest.mark.parametrize(
    ("progress", "limits", "expected"),
    [
        ({}, {}, None),
        ({"stop_requested": True}, {}, "stopped by the user"),
        ({"speedup": 1.3}, {"target_speedup": 1.25}, "target speedup over the baseline reached (1.3x)"),
        ({}, {"target_speedup": 1.25}, None),
        ({}, {"target": {"step": 400.0}}, "target step geomean reached (step 450)"),
        ({}, {"target": {"step": 400.0, "forward": 600.0}}, None),  # every metric's target, not any
        ({"vs_vendor": 1.06}, {"target_vs_vendor": 1.05}, "target ratio to the vendor baseline reached"),
        ({}, {"hardware_efficiency": 0.7}, "hardware efficiency"),
        ({"efficiency": math.nan}, {"hardware_efficiency": 0.5}, None),  # no ceilings (CPU): never met
        ({"rounds_done": 10}, {}, "max iterations reached (10)"),
        ({"elapsed_s": 3600.0}, {}, "max duration reached"),
    ],
)
def test_each_condition_stops_the_campaign_when_met(progress, limits, expected):
    checks = stop_conditions(Progress(**(BASE.__dict__ | progress)), max_iterations=10, max_duration_min=60.0,
                             **limits)
    reason = stop_reason(checks)
    assert (reason is None) if expected is None else reason.startswith(expected), reason


def test_every_condition_set_is_listed_with_its_value():
    checks = stop_conditions(BASE, max_iterations=10, max_duration_min=60.0, target={"step": 500.0},
                             target_vs_vendor=1.0)
    assert [c.condition for c in checks] == ["stopped by the user", "target step geomean",
                                             "target ratio to the vendor baseline", "max iterations", "max duration"]
    assert [(c.value, c.met) for c in checks[1:3]] == [("step 450", False), ("0.95x", False)]
