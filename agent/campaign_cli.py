"""`turbo-opt start | resume | status | stop`: thin commands over agent.runner."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import git
import typer
from rich.table import Table

from agent.manifest import default_campaign_name, load_manifest, parse_manifest
from agent.runner import Campaign, runs_dir
from harness.cli import console, exit_on_user_error
from harness.errors import UserError
from harness.registry import get_spec
from kernels.common.device import interpreter_mode


def repo_root() -> Path:
    """The git checkout the command runs in: campaigns change its kernels and commit there."""
    try:
        return Path(git.Repo(Path.cwd(), search_parent_directories=True).working_tree_dir)
    except git.InvalidGitRepositoryError:
        raise UserError(f"{Path.cwd()} is not inside a git checkout of turbo-opt") from None


def _run(campaign: Campaign) -> None:
    try:
        state = campaign.run()
    except KeyboardInterrupt:
        s = campaign.state
        typer.echo(f"interrupted in {s.phase} of round {s.round}; state is saved: "
                   f"turbo-opt resume {campaign.manifest.campaign}", err=True)
        raise typer.Exit(130) from None
    console.print(f"campaign {state.campaign} done ({state.stop_reason}): {campaign.run_dir / 'report.md'}")


@exit_on_user_error
def start(
    op: Annotated[str | None, typer.Option(help="Op to optimize with a default manifest.")] = None,
    manifest: Annotated[Path | None, typer.Option(help="A manifest.yaml (e.g. a preset in campaigns/).")] = None,
    shapes: Annotated[str | None, typer.Option(help="Shape preset or .yaml file (default: the op's).")] = None,
    max_iterations: Annotated[int | None, typer.Option(help="Optimization rounds at most.")] = None,
    name: Annotated[str | None, typer.Option(help="Campaign name (default <op>-<date>-<time>).")] = None,
    variant: Annotated[str | None, typer.Option(help="The op's variant, e.g. e4m3-rowwise.")] = None,
    repeats: Annotated[int | None, typer.Option(help="Timed calls per measurement.")] = None,
) -> None:
    """Start a campaign: baseline, then rounds of one change each, accepted as commits or rolled back."""
    root = repo_root()
    overrides = {k: v for k, v in {"shapes": shapes, "max_iterations": max_iterations, "campaign": name,
                                   "variant": variant, "repeats": repeats}.items() if v is not None}
    if manifest is not None:
        data = load_manifest(manifest).model_dump(mode="json") | overrides
        source = str(manifest)
    elif op is not None:
        preset = "smoke" if interpreter_mode() else get_spec(op).default_preset
        data = {"op": op, "shapes": preset} | overrides
        source = "command line"
    else:
        raise UserError("give --op OP (a default manifest) or --manifest FILE")
    data["campaign"] = data.get("campaign") or default_campaign_name(data["op"])
    _run(Campaign.create(root, parse_manifest(data, source)))


@exit_on_user_error
def resume(name: Annotated[str, typer.Argument(help="The campaign to go on with.")]) -> None:
    """Go on from the last finished step of a killed or interrupted campaign."""
    _run(Campaign.open(repo_root(), name))


@exit_on_user_error
def stop(name: Annotated[str, typer.Argument(help="The campaign to stop.")]) -> None:
    """Ask a running campaign to stop after its current round (it then writes its report)."""
    run_dir = runs_dir(repo_root()) / name
    if not (run_dir / "state.json").exists():
        raise UserError(f"no campaign '{name}'")
    (run_dir / "STOP").touch()
    console.print(f"{name} will stop before its next round")


@exit_on_user_error
def status(name: Annotated[str | None, typer.Argument(help="A campaign (default: list them all).")] = None) -> None:
    """Phase, round, best against baseline and the history of one campaign, or all campaigns."""
    root = repo_root()
    if name is None:
        table = Table(title="campaigns")
        for column in ("campaign", "phase", "round", "best vs baseline", "stop reason"):
            table.add_column(column)
        for path in sorted(runs_dir(root).glob("*/state.json")):
            c = Campaign.open(root, path.parent.name)
            table.add_row(c.state.campaign, c.state.phase, str(c.state.round), _speedup(c), c.state.stop_reason or "")
        console.print(table)
        return
    campaign = Campaign.open(root, name)
    s = campaign.state
    console.print(f"[bold]{s.campaign}[/]: {s.phase}, round {s.round}, branch {s.branch}, device {s.device}")
    console.print(f"best vs baseline: {_speedup(campaign)}; best commit "
                  f"{s.best_commit[:10]} (round {s.best_round}); stop: {s.stop_reason or '-'}")
    table = Table(title="rounds")
    for column in ("round", "status", "change", "measurements", "reason", "commit"):
        table.add_column(column)
    for r in s.rounds:
        table.add_row(str(r.number), r.status, r.change.describe() if r.change else "-", str(len(r.measurements)),
                      r.reason, (r.commit or "")[:10])
    console.print(table)


def _speedup(campaign: Campaign) -> str:
    speedup = campaign.speedup()
    return "-" if speedup != speedup else f"{speedup:.3f}x {campaign.manifest.primary_metric}, representative shapes"


def register(app: typer.Typer) -> None:
    for command in (start, resume, status, stop):
        app.command()(command)
