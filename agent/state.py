"""state.json: where a campaign is, written atomically after every step so a killed run resumes.

The core is proposer-agnostic: a round's change is a `Candidate` (a hypothesis, a one-line summary,
a risk and the proposer's own structured params) whose diff lives in the round's candidate.diff.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent.manifest import Manifest
from harness.files import atomic_write_text

Phase = Literal[
    "DEFINE_TARGET", "PREPARE_ENVIRONMENT", "BASELINE", "ANALYZE", "OPTIMIZE", "AWAITING_CANDIDATE", "SCREEN",
    "VALIDATE", "DECIDE", "REPORT", "DONE",
]
RoundStatus = Literal["OPEN", "ACCEPT", "ROLLBACK", "ERROR"]
Risk = Literal["low", "high"]


class Proposal(BaseModel):
    """What a proposer says about the change it made to the working tree: proposal.json of a `command`
    agent, the options of `turbo-opt submit`, or the search proposer's move."""

    model_config = ConfigDict(extra="forbid")

    hypothesis: str = Field(min_length=1, description="why the change should be faster, in a sentence or two")
    summary: str = Field(min_length=1, max_length=200,
                         description="one line naming the change (the commit subject)")
    risk: Risk = Field(default="low", description="low, or high to have it validated on every shape")
    expected_gain_pct: float | None = Field(default=None, allow_inf_nan=False,
                                            description="the gain you expect on the primary metric, %")
    params: dict[str, Any] = Field(default_factory=dict,
                                   description="optional structured description of the change (kept in the tips)")


class Candidate(Proposal):
    """A proposal as the runner recorded it, with what the runner saw of the working tree."""

    proposer: str
    # Paths that differ from the best commit (tracked files) and new untracked files.
    changed: list[str] = []
    untracked: list[str] = []
    # Git history or branch moved by the candidate (a commit, reset, branch switch or stash), if any.
    lineage_problem: str | None = None


class Measurement(BaseModel):
    """One benchmark run scored: its CSV (relative to the campaign dir) and its geomeans over the measured shapes."""

    # A candidate that FAILs everywhere has NaN geomeans: state.json keeps them as NaN, not as null.
    model_config = ConfigDict(ser_json_inf_nan="constants")

    csv: str
    all_pass: bool
    geomeans: dict[str, float]  # forward, backward, step
    per_shape: dict[str, float]  # label -> primary metric
    failed: list[str] = []
    # Primary-metric geomean timed with fresh input tensors every call (None if not measured).
    fresh_geomean: float | None = None


class RoundRecord(BaseModel):
    number: int
    analysis: str = ""
    candidate: Candidate | None = None
    # The commit and stash HEAD the tree was handed to the proposer at (to detect an agent's git moves).
    handed_at: str = ""
    stash_at: str | None = None
    full_validation: bool = False
    # This round follows `stagnation_rollbacks` rollbacks in a row: the proposer is told to change course.
    after_stagnation: bool = False
    measurements: list[Measurement] = []
    # The best commit measured right after each candidate measurement (paired), when the manifest asks.
    references: list[Measurement] = []
    status: RoundStatus = "OPEN"
    reason: str = ""
    # The aggregate gain (%) over the best that the decision saw; None when nothing was measured.
    gain_pct: float | None = None
    fresh_gain_pct: float | None = None
    # Highest minus lowest of the A/B pairs' own gains (%); None with one pair.
    spread_pct: float | None = None
    commit: str | None = None
    elapsed_s: float = 0.0

    @property
    def ineffective(self) -> bool:
        """Correct, measured, and rolled back on its numbers: a direction that did not pay (as opposed to a
        wrong candidate, or one rejected unseen)."""
        return self.status == "ROLLBACK" and self.gain_pct is not None

    @property
    def summary(self) -> str:
        if self.number == 1:
            return "baseline"
        return self.candidate.summary if self.candidate else "-"


class Termination(BaseModel):
    """One stop condition of the campaign, as REPORT and `status` show it."""

    condition: str
    threshold: str
    value: str
    met: bool


class CampaignState(BaseModel):
    campaign: str
    # The authoritative manifest (the run dir's manifest.yaml is a copy for people; an edit of it is undone).
    manifest: Manifest
    phase: Phase = "DEFINE_TARGET"
    round: int = 1
    branch: str = ""
    start_commit: str = ""
    # The branch checked out in the target's checkout at the start (None: a detached HEAD).
    start_branch: str | None = None
    best_commit: str = ""
    best_round: int = 1
    harness_hash: str = ""
    device: str = ""
    ceilings: dict[str, float] = {}
    baseline: Measurement | None = None
    best: Measurement | None = None
    rounds: list[RoundRecord] = []
    consecutive_rollbacks: int = 0
    # The proposer's own persistent notes (the search: its current and exhausted knob families).
    proposer_state: dict[str, Any] = {}
    elapsed_s: float = 0.0
    stop_reason: str | None = None
    # Set at REPORT: the best commit measured on every shape, and whether it reproduced the accepted gains.
    final: Measurement | None = None
    final_representative: Measurement | None = None
    reproduced: bool | None = None
    reproduction: str = ""
    # What the campaign decided on its own that a reader must know (a forward-only kernel scored on forward,
    # the best files synced back into the target's checkout, ...): the report lists them.
    notes: list[str] = []
    # REPORT left the target as the manifest asked (branch, uncommitted best, workspace synced back).
    handed_back: bool = False

    @property
    def current(self) -> RoundRecord:
        return self.rounds[-1]

    def optimization_rounds(self) -> list[RoundRecord]:
        return [r for r in self.rounds if r.number > 1]

    def closed_rounds(self) -> list[RoundRecord]:
        return [r for r in self.optimization_rounds() if r.status != "OPEN"]


def save_state(state: CampaignState, path: Path) -> None:
    atomic_write_text(path, state.model_dump_json(indent=2) + "\n")


def load_state(path: Path) -> CampaignState:
    return CampaignState.model_validate_json(Path(path).read_text())
