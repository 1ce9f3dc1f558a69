"""`turbo-opt mcp`: the campaign's machine interface as an MCP server (stdio, the official `mcp` SDK).

The tools are the CLI's library functions: an agent reads the status and the open request, submits
the change it made to the working tree (screened, validated and decided by the runner, exactly as
`turbo-opt submit`), and reads the trend, the ineffective directions and the knowledge that applies.
Everything the runner prints goes to stderr: stdout carries the protocol.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, ValidationError
from rich.console import Console

from agent.decision import DecisionRecord
from agent.knowledge import KnowledgeFile, Tip, applicable, load_tips
from agent.request import Request, RoundSummary
from agent.runner import Campaign
from agent.state import Proposal
from agent.status import CampaignStatus, campaign_names, campaign_status
from harness.errors import UserError
from harness.rules import first_error

T = TypeVar("T")

INSTRUCTIONS = """turbo-opt runs kernel-optimization campaigns. For a campaign whose phase is AWAITING_CANDIDATE:
read_request tells you the target, the numbers, the history, the rules and the mutable files; edit only those
files in the repository; then submit_candidate with your hypothesis and a one-line summary. The runner
measures and decides (ACCEPT commits the change, ROLLBACK undoes it) and writes the next request."""


class TrendRow(BaseModel):
    round: int
    status: str
    summary: str
    # The primary-metric geomean over the representative shapes of the round's last measurement.
    geomean: float | None
    gain_pct: float | None
    fresh_gain_pct: float | None


class Submitted(BaseModel):
    decision: DecisionRecord
    status: CampaignStatus


class Knowledge(BaseModel):
    files: list[KnowledgeFile]
    tips: list[Tip]


def _tool_errors(fn: Callable[..., T]) -> Callable[..., T]:
    """A UserError (bad campaign name, nothing to submit...) is the tool's answer, not a crash."""

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> T:
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            raise ToolError(str(exc)) from None

    return wrapper


def build_server(root: Path) -> MCPServer:
    server = MCPServer("turbo-opt", instructions=INSTRUCTIONS)
    quiet = Console(stderr=True)

    @server.tool()
    @_tool_errors
    def list_campaigns() -> list[CampaignStatus]:
        """Every campaign of this repository: phase, round, best vs baseline, who is expected to act."""
        return [campaign_status(root, name) for name in campaign_names(root)]

    @server.tool()
    @_tool_errors
    def status(campaign: str) -> CampaignStatus:
        """One campaign's phase and round, its best against the baseline, its rounds, and who acts next."""
        return campaign_status(root, campaign)

    @server.tool()
    @_tool_errors
    def read_request(campaign: str) -> Request:
        """The open round's request: target, per-shape standing, roofline, history, rules, knowledge, how to submit."""
        c = Campaign.open(root, campaign, console=quiet)
        if c.state.phase != "AWAITING_CANDIDATE":
            raise UserError(f"campaign {campaign} has no open request (phase {c.state.phase})")
        return Request.model_validate_json((c.round_dir(c.state.round) / "request.json").read_text())

    @server.tool()
    @_tool_errors
    def submit_candidate(campaign: str, hypothesis: str, summary: str, risk: Literal["low", "high"] = "low",
                         expected_gain_pct: float | None = None) -> Submitted:
        """Hand in the change now in the working tree: screened, benchmarked and decided by the runner (minutes
        on a GPU); returns the decision and the campaign's status (the next request, if any)."""
        try:
            proposal = Proposal(hypothesis=hypothesis, summary=summary, risk=risk, expected_gain_pct=expected_gain_pct)
        except ValidationError as exc:
            raise UserError(first_error(exc, "submit_candidate")) from None
        c = Campaign.open(root, campaign, console=quiet)
        record = c.submit(proposal)
        decision = DecisionRecord.model_validate_json((c.round_dir(record.number) / "decision.json").read_text())
        return Submitted(decision=decision, status=campaign_status(root, campaign))

    @server.tool()
    @_tool_errors
    def performance_trend(campaign: str) -> list[TrendRow]:
        """Every closed round with its primary-metric geomean and its measured gain over the best."""
        c = Campaign.open(root, campaign, console=quiet)
        metric = c.manifest.primary_metric
        return [TrendRow(round=r.number, status=r.status, summary=r.summary,
                         geomean=r.measurements[-1].geomeans[metric] if r.measurements else None,
                         gain_pct=r.gain_pct, fresh_gain_pct=r.fresh_gain_pct)
                for r in c.state.rounds if r.status != "OPEN"]

    @server.tool()
    @_tool_errors
    def ineffective_directions(campaign: str) -> list[RoundSummary]:
        """The rounds that were measured and rolled back, with their reasons: what not to repeat as is."""
        c = Campaign.open(root, campaign, console=quiet)
        return [RoundSummary.of(r) for r in c.state.closed_rounds() if r.ineffective]

    @server.tool()
    @_tool_errors
    def knowledge(op: str, device: str | None = None, backend: str | None = None,
                  variant: str | None = None) -> Knowledge:
        """The knowledge files that apply to an op on a device and backend, and the tips of that context."""
        return Knowledge(files=applicable(root, op, device, backend), tips=load_tips(root, op, device, variant))

    return server


def serve(root: Path) -> None:
    build_server(root).run("stdio")
