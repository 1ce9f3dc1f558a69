"""The direction a closed round leaves to the next: the representative shape furthest below a vendor,
and whether its host time, not its kernels, holds it there (a pure function: no GPU, no git)."""

from agent.report import next_direction
from agent.standings import ShapeStanding
from agent.state import RoundRecord


def standing(label: str, ratio: float, host_bound: list[str] | None = None) -> ShapeStanding:
    return ShapeStanding(label=label, baseline=1.0, best=1.0, vs_vendor={"cuBLAS": ratio}, host_bound=host_bound or [])


def test_the_largest_gap_is_named_and_said_host_bound_where_the_host_sets_it():
    accepted = RoundRecord(number=3, status="ACCEPT")
    shapes = [standing("big", 0.97), standing("small", 0.55, ["fwd", "bwd"])]
    direction = next_direction(accepted, shapes)
    assert direction.startswith("build on this commit; the largest gap left is small at 0.550x cuBLAS")
    assert "fwd/bwd host-bound" in direction
    assert "host-bound" not in next_direction(accepted, [standing("big", 0.97), standing("small", 0.55)])
