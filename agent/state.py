"""state.json: where a campaign is, written atomically after every step so a killed run resumes."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from harness.files import atomic_write_text

Phase = Literal[
    "DEFINE_TARGET", "PREPARE_ENVIRONMENT", "BASELINE", "ANALYZE", "OPTIMIZE", "VALIDATE", "DECIDE", "REPORT", "DONE"
]
RoundStatus = Literal["OPEN", "ACCEPT", "ROLLBACK", "ERROR"]


class Change(BaseModel):
    """One knob of one tuned-table bucket: the unit of change of the search proposer."""

    model_config = ConfigDict(frozen=True)

    file: str
    bucket: str
    knob: str
    old: int
    new: int
    direction: str

    def describe(self) -> str:
        return f"{self.bucket} {self.knob} {self.old} -> {self.new}"


class Measurement(BaseModel):
    """One benchmark run: its CSV (relative to the campaign dir) and its geomeans over the measured shapes."""

    csv: str
    all_pass: bool
    geomeans: dict[str, float]  # forward, backward, step
    per_shape: dict[str, float]  # label -> primary metric
    failed: list[str] = []
    # Primary-metric geomean timed with fresh input tensors every call (None if not measured).
    fresh_geomean: float | None = None


class RoundRecord(BaseModel):
    number: int
    direction: str = ""
    analysis: str = ""
    hypothesis: str = ""
    description: str = ""
    change: Change | None = None
    expected_gain_pct: float = 0.0
    full_validation: bool = False
    measurements: list[Measurement] = []
    # The best commit measured right after each candidate measurement (paired), when the manifest asks.
    references: list[Measurement] = []
    status: RoundStatus = "OPEN"
    reason: str = ""
    # The aggregate gain (%) over the best that the decision saw; None when nothing was measured.
    gain_pct: float | None = None
    commit: str | None = None


class CampaignState(BaseModel):
    campaign: str
    phase: Phase = "DEFINE_TARGET"
    round: int = 1
    branch: str = ""
    start_commit: str = ""
    best_commit: str = ""
    best_round: int = 1
    harness_hash: str = ""
    device: str = ""
    ceilings: dict[str, float] = {}
    baseline: Measurement | None = None
    best: Measurement | None = None
    rounds: list[RoundRecord] = []
    consecutive_rollbacks: int = 0
    exhausted_directions: list[str] = []
    elapsed_s: float = 0.0
    stop_reason: str | None = None

    @property
    def current(self) -> RoundRecord:
        return self.rounds[-1]

    def optimization_rounds(self) -> list[RoundRecord]:
        return [r for r in self.rounds if r.number > 1]


def save_state(state: CampaignState, path: Path) -> None:
    atomic_write_text(path, state.model_dump_json(indent=2) + "\n")


def load_state(path: Path) -> CampaignState:
    return CampaignState.model_validate_json(Path(path).read_text())
