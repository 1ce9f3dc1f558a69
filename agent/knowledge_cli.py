"""`turbo-opt knowledge [--op ...]` and `turbo-opt knowledge check`: thin commands over agent.knowledge."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from agent.knowledge import applicable, check_knowledge, curated_tips, knowledge_files, load_tips
from agent.lineage import repo_root
from harness.cli import console, exit_on_user_error
from harness.errors import UserError

app = typer.Typer(help="What the knowledge base says about an op (--op), or `check` it.", add_completion=False)

# Hidden: tests and tools point the commands at another tree; users get the checkout they run in.
RootOption = Annotated[Path | None, typer.Option(hidden=True, help="The repository root to read.")]


def _root(root: Path | None) -> Path:
    """`root`, or the git checkout the command runs in: its knowledge, its history for the evidence commits."""
    return root or repo_root()


@app.callback(invoke_without_command=True)
@exit_on_user_error
def knowledge(
    ctx: typer.Context,
    op: Annotated[str | None, typer.Option(help="The op to list what applies to.")] = None,
    device: Annotated[str | None, typer.Option(help="GPU name as torch reports it (default: every arch).")] = None,
    backend: Annotated[str | None, typer.Option(help="triton or gluon (default: the op's backends).")] = None,
    variant: Annotated[str | None, typer.Option(help="Only tips of this variant, e.g. e4m3-rowwise.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print {files, tips} as JSON, nothing else.")] = False,
    root: RootOption = None,
) -> None:
    """List the knowledge files that apply to an op on a device, then the tips of the same context."""
    if ctx.invoked_subcommand is not None:
        return
    if op is None:
        raise UserError("give --op OP to list what applies to it, or run `turbo-opt knowledge check`")
    base = _root(root)
    files = applicable(base, op, device, backend)
    tips = load_tips(base, op, device, variant)
    if as_json:
        typer.echo(json.dumps({"files": [f.model_dump(mode="json") for f in files],
                               "tips": [t.model_dump(mode="json") for t in tips]}, indent=1))
        return
    table = Table(title=f"knowledge for {op}" + (f" on {device}" if device else ""))
    for column in ("kind", "path", "title", "summary"):
        table.add_column(column, overflow="fold")
    for f in files:
        table.add_row(f.kind, f.path, f.title, f.summary)
    console.print(table)
    tip_table = Table(title=f"tips ({len(tips)})")
    for column in ("outcome", "gain %", "backend", "variant", "shape class", "summary", "commit or campaign"):
        tip_table.add_column(column, overflow="fold")
    for t in tips:
        gain = "-" if t.gain_pct is None else f"{t.gain_pct:+.1f}"
        tip_table.add_row(t.outcome, gain, t.backend, t.variant, t.shape_class, t.summary, t.commit or t.campaign or "")
    console.print(tip_table)


@app.command()
@exit_on_user_error
def check(root: RootOption = None) -> None:
    """Validate every knowledge file and curated tip; exit 1 on any problem."""
    base = _root(root)
    problems = check_knowledge(base)
    for problem in problems:
        typer.echo(problem)
    if problems:
        raise typer.Exit(1)
    typer.echo(f"knowledge: {len(knowledge_files(base))} files, {len(curated_tips(base))} tips, all good")


def register(parent: typer.Typer) -> None:
    parent.add_typer(app, name="knowledge")
