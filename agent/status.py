"""Where a campaign is and who is expected to act next: the runner, the agent (or person) it handed a
round to, or nobody. `turbo-opt status` and the MCP server's status tool print this model."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from agent import lock
from agent.request import RoundSummary
from agent.runner import Campaign, runs_dir

Actor = Literal["runner", "agent", "nobody"]


class CampaignStatus(BaseModel):
    campaign: str
    op: str
    variant: str
    proposer: str
    phase: str
    round: int
    branch: str
    device: str
    primary_metric: str
    best_commit: str
    best_round: int
    # Best over baseline on the primary metric, representative shapes (None before BASELINE).
    speedup: float | None
    stop_reason: str | None
    expected_actor: Actor
    next_action: str
    # The open round's request (repo-relative), when one is out.
    request: str | None
    report: str | None
    rounds: list[RoundSummary]


def campaign_names(root: Path) -> list[str]:
    return sorted(p.parent.name for p in runs_dir(root).glob("*/state.json"))


def campaign_status(root: Path, name: str) -> CampaignStatus:
    campaign = Campaign.open(root, name)
    s, m = campaign.state, campaign.manifest
    request = campaign.round_dir(s.round) / "request.md"
    report = campaign.run_dir / "report.md"
    actor, action = _who_acts(campaign)
    speedup = campaign.speedup()
    return CampaignStatus(
        campaign=name, op=m.op, variant=m.resolved_variant, proposer=m.proposer.kind, phase=s.phase, round=s.round,
        branch=s.branch, device=s.device, primary_metric=m.primary_metric, best_commit=s.best_commit,
        best_round=s.best_round, speedup=None if math.isnan(speedup) else speedup, stop_reason=s.stop_reason,
        expected_actor=actor, next_action=action,
        request=campaign.repo_path(request) if s.phase == "AWAITING_CANDIDATE" and request.exists() else None,
        report=campaign.repo_path(report) if report.exists() else None,
        rounds=[RoundSummary.of(r) for r in s.rounds],
    )


def _who_acts(campaign: Campaign) -> tuple[Actor, str]:
    s, name = campaign.state, campaign.manifest.name
    if s.phase == "DONE":
        return "nobody", f"done ({s.stop_reason}): read {campaign.repo_path(campaign.run_dir / 'report.md')}"
    if s.phase == "AWAITING_CANDIDATE":
        request = campaign.repo_path(campaign.round_dir(s.round) / "request.md")
        return "agent", (f"edit the mutable files as {request} asks, then `turbo-opt submit {name} --hypothesis "
                         f"\"...\" --summary \"...\"`; or `turbo-opt finish {name}` to end the campaign")
    pid = lock.holder(campaign.run_dir)
    if pid is not None:
        return "runner", f"the runner (pid {pid}) is in {s.phase} of round {s.round}"
    return "runner", f"interrupted in {s.phase} of round {s.round}: `turbo-opt resume {name}`"
