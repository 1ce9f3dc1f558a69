"""`turbo-opt start | resume | status | stop | request | submit | finish`: thin commands over agent.runner."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.table import Table

from agent.decision import DecisionRecord
from agent.learn import learn as merge_learned
from agent.lineage import repo_root
from agent.manifest import default_campaign_name, load_manifest, parse_manifest
from agent.request import Request
from agent.runner import Campaign, runs_dir
from agent.state import Proposal, Risk
from agent.status import campaign_names, campaign_status
from harness.cli import console, err_console, exit_on_user_error
from harness.errors import UserError
from harness.registry import get_spec
from harness.rules import first_error
from kernels.common.device import interpreter_mode

JSON_HELP = "Print JSON (the models in docs/schemas/) and nothing else."
WAIT_HELP = "Block while a manual campaign waits for candidates, printing each verdict, until it is done."


def _announce(campaign: Campaign) -> None:
    """Where the campaign stopped and who acts next, in `turbo-opt status`'s words."""
    s = campaign_status(campaign.root, campaign.manifest.name)
    console.print(f"campaign {s.campaign}: {s.phase}, round {s.round}; next: {s.expected_actor}: {s.next_action}",
                  highlight=False)


def _follow(root: Path, name: str) -> None:
    """Watch a campaign others drive (submit, the MCP server) and print each verdict until it is done."""
    seen = len(Campaign.open(root, name).state.closed_rounds())
    while True:
        campaign = Campaign.open(root, name)
        closed = campaign.state.closed_rounds()
        for record in closed[seen:]:
            console.print(f"round {record.number}: {record.status}: {record.reason}", highlight=False)
        seen = len(closed)
        if campaign.state.phase == "DONE":
            _announce(campaign)
            return
        time.sleep(1.0)


def _drive(campaign: Campaign, wait: bool) -> None:
    try:
        state = campaign.run()
    except KeyboardInterrupt:
        s = campaign.state
        typer.echo(f"interrupted in {s.phase} of round {s.round}; state is saved: "
                   f"turbo-opt resume {campaign.manifest.campaign}", err=True)
        raise typer.Exit(130) from None
    _announce(campaign)
    if wait and state.phase == "AWAITING_CANDIDATE":
        _follow(campaign.root, campaign.manifest.name)


@exit_on_user_error
def start(
    op: Annotated[str | None, typer.Option(help="Op to optimize with a default manifest.")] = None,
    manifest: Annotated[Path | None, typer.Option(help="A manifest.yaml (e.g. a preset in campaigns/).")] = None,
    shapes: Annotated[str | None, typer.Option(help="Shape preset or .yaml file (default: the op's).")] = None,
    max_iterations: Annotated[int | None, typer.Option(help="Optimization rounds at most.")] = None,
    name: Annotated[str | None, typer.Option(help="Campaign name (default <op>-<date>-<time>).")] = None,
    variant: Annotated[str | None, typer.Option(help="The op's variant, e.g. e4m3-rowwise.")] = None,
    repeats: Annotated[int | None, typer.Option(help="Timed calls per measurement.")] = None,
    proposer: Annotated[str | None, typer.Option(help="search or manual (a command agent needs a manifest).")] = None,
    repo: Annotated[Path | None, typer.Option(help="An external target's checkout (overrides the manifest's).")] = None,
    wait: Annotated[bool, typer.Option(help=WAIT_HELP)] = False,
) -> None:
    """Start a campaign: baseline, then rounds of one change each, accepted as commits or rolled back."""
    root = repo_root()
    overrides = {k: v for k, v in {"shapes": shapes, "max_iterations": max_iterations, "campaign": name,
                                   "variant": variant, "repeats": repeats, "proposer": proposer,
                                   "repo": str(repo.resolve()) if repo else None}.items()
                 if v is not None}
    if manifest is not None:
        data = load_manifest(manifest, warn=lambda note: err_console.print(f"note: {note}", highlight=False)
                             ).model_dump(mode="json") | overrides
        source = str(manifest)
    elif op is not None:
        preset = "smoke" if interpreter_mode() else get_spec(op).default_preset
        data = {"op": op, "shapes": preset} | overrides
        source = "command line"
    else:
        raise UserError("give --op OP (a default manifest) or --manifest FILE")
    data["campaign"] = data.get("campaign") or default_campaign_name(data["op"])
    _drive(Campaign.create(root, parse_manifest(data, source)), wait)


@exit_on_user_error
def resume(
    name: Annotated[str, typer.Argument(help="The campaign to go on with.")],
    wait: Annotated[bool, typer.Option(help=WAIT_HELP)] = False,
) -> None:
    """Go on from the last finished step of a killed or interrupted campaign (any phase)."""
    _drive(Campaign.open(repo_root(), name), wait)


@exit_on_user_error
def stop(name: Annotated[str, typer.Argument(help="The campaign to stop.")]) -> None:
    """Ask a running campaign to stop after its current round (it then writes its report)."""
    run_dir = runs_dir(repo_root()) / name
    if not (run_dir / "state.json").exists():
        raise UserError(f"no campaign '{name}'")
    (run_dir / "STOP").touch()
    console.print(f"{name} will stop before its next round")


@exit_on_user_error
def status(
    name: Annotated[str | None, typer.Argument(help="A campaign (default: list them all).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Phase, round, best against baseline, who is expected to act, and the history of one or all campaigns."""
    root = repo_root()
    statuses = [campaign_status(root, n) for n in ([name] if name else campaign_names(root))]
    if json_output:
        payload = statuses[0].model_dump(mode="json") if name else [s.model_dump(mode="json") for s in statuses]
        typer.echo(json.dumps(payload, indent=2))
        return
    if name is None:
        table = Table(title="campaigns")
        for column in ("campaign", "proposer", "phase", "round", "best vs baseline", "next"):
            table.add_column(column, overflow="fold")
        for s in statuses:
            table.add_row(s.campaign, s.proposer, s.phase, str(s.round), _speedup(s.speedup, s.primary_metric),
                          f"{s.expected_actor}: {s.next_action}")
        console.print(table)
        return
    s = statuses[0]
    console.print(f"[bold]{s.campaign}[/]: {s.op} ({s.variant}), proposer {s.proposer}; {s.phase}, round {s.round}, "
                  f"branch {s.branch}, device {s.device}")
    console.print(f"best vs baseline: {_speedup(s.speedup, s.primary_metric)}; best commit {s.best_commit[:10]} "
                  f"(round {s.best_round}); stop: {s.stop_reason or '-'}")
    console.print(f"next: [bold]{s.expected_actor}[/]: {s.next_action}", highlight=False)
    table = Table(title="rounds")
    for column in ("round", "status", "proposer", "change", "gain", "reason", "commit"):
        table.add_column(column, overflow="fold")
    for r in s.rounds:
        gain = f"{r.gain_pct:+.2f}%" if r.gain_pct is not None else "-"
        table.add_row(str(r.number), r.status, r.proposer or "-", r.summary, gain, r.reason, (r.commit or "")[:10])
    console.print(table)


def _speedup(speedup: float | None, metric: str) -> str:
    return "-" if speedup is None else f"{speedup:.3f}x {metric}, representative shapes"


@exit_on_user_error
def request(
    name: Annotated[str, typer.Argument(help="The campaign.")],
    json_output: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
    schema: Annotated[bool, typer.Option(help="Print the request's JSON schema instead.")] = False,
) -> None:
    """Print the open round's request (what the agent is asked to do), as markdown or JSON."""
    if schema:
        typer.echo(json.dumps(Request.model_json_schema(), indent=2))
        return
    campaign = Campaign.open(repo_root(), name)
    s = campaign.state
    if s.phase != "AWAITING_CANDIDATE":
        raise UserError(f"campaign {name} has no open request (phase {s.phase}, round {s.round})")
    path = campaign.round_dir(s.round) / ("request.json" if json_output else "request.md")
    typer.echo(path.read_text(), nl=False)


@exit_on_user_error
def submit(
    name: Annotated[str, typer.Argument(help="The campaign whose open round the working tree's change is for.")],
    hypothesis: Annotated[str, typer.Option(help="Why the change should be faster.")],
    summary: Annotated[str | None, typer.Option(help="One line naming the change (default: the hypothesis).")] = None,
    risk: Annotated[str, typer.Option(help="low, or high to validate on every shape.")] = "low",
    expected_gain: Annotated[float | None, typer.Option(help="Expected gain on the primary metric, %.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Hand in the working tree's change: screened, validated and decided; the next request is written."""
    try:
        proposal = Proposal(hypothesis=hypothesis, summary=summary or hypothesis.splitlines()[0][:200],
                            risk=_risk(risk), expected_gain_pct=expected_gain)
    except ValidationError as exc:
        raise UserError(first_error(exc, "submit")) from None
    root = repo_root()
    campaign = Campaign.open(root, name, console=err_console if json_output else console)  # stdout: JSON only
    record = campaign.submit(proposal)
    decision = DecisionRecord.model_validate_json(
        (campaign.round_dir(record.number) / "decision.json").read_text())
    after = campaign_status(root, name)
    if json_output:
        typer.echo(json.dumps({"decision": decision.model_dump(mode="json"), "status": after.model_dump(mode="json")},
                              indent=2))
        return
    console.print(f"round {record.number}: [bold]{record.status}[/]: {record.reason}", highlight=False)
    console.print(f"next: {after.expected_actor}: {after.next_action}", highlight=False)


def _risk(value: str) -> Risk:
    if value not in ("low", "high"):
        raise UserError(f"--risk must be low or high, got '{value}'")
    return value  # type: ignore[return-value]


@exit_on_user_error
def finish(
    name: Annotated[str, typer.Argument(help="The manual campaign to end.")],
    discard: Annotated[bool, typer.Option(help="Drop uncommitted changes in the working tree.")] = False,
) -> None:
    """End a campaign that waits for candidates: the best commit is measured on every shape and reported."""
    campaign = Campaign.open(repo_root(), name)
    campaign.finish(discard=discard)
    _announce(campaign)


@exit_on_user_error
def learn(name: Annotated[str, typer.Argument(help="A finished campaign whose final bench reproduced its gains.")]
          ) -> None:
    """Merge a finished campaign's tips and findings into knowledge/ (in the working tree, to review and commit)."""
    learned = merge_learned(repo_root(), name)
    if not learned.new_tips:
        console.print(f"nothing new from {name}: its tips are already in {learned.tips_file}")
        return
    console.print(f"{len(learned.new_tips)} tip(s) into {learned.tips_file}; findings into "
                  f"{learned.directions_file}: review them, then commit", highlight=False)


@exit_on_user_error
def mcp() -> None:
    """Serve this repository's campaigns over MCP (stdio): status, request, submit, trend, knowledge."""
    from agent.mcp_server import serve  # the `mcp` SDK is needed only here, not on a bare GPU machine

    serve(repo_root())


def register(app: typer.Typer) -> None:
    for command in (start, resume, status, stop, request, submit, finish, learn, mcp):
        app.command()(command)
