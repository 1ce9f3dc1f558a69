"""`turbo-opt`: the command line. Each command is thin over a library function."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markdown import Markdown
from rich.table import Table

from agent import campaign_cli, knowledge_cli
from agent import ci as ci_gate
from agent.lineage import repo_root
from harness.cli import METRIC_HELP, REGRESSION_HELP, console, exit_on_user_error, register
from harness.errors import UserError
from harness.registry import all_specs
from harness.rules import load_rules
from harness.shapes import preset_names

app = typer.Typer(
    help="turbo-opt: production Triton training kernels and the campaigns that make them faster.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
register(app)
campaign_cli.register(app)
knowledge_cli.register(app)


@app.command()
@exit_on_user_error
def ops() -> None:
    """List the registered ops, their shape presets, dtypes and baselines."""
    table = Table(title="registered ops")
    for column in ("op", "description", "dtypes", "variants", "presets", "baselines", "mutable files"):
        table.add_column(column, overflow="fold")
    for spec in all_specs():
        table.add_row(
            spec.name, spec.description, ", ".join(spec.dtypes), "\n".join(spec.variants),
            ", ".join(preset_names(spec.shape_family)),
            ", ".join(b.name for b in spec.baselines) or "-", "\n".join(spec.mutable_files),
        )
    console.print(table)


@app.command()
@exit_on_user_error
def ci(
    baselines: Annotated[Path, typer.Option(help="The baselines folder: <device>/<op>[@<variant>].csv + sidecars.")],
    update: Annotated[bool, typer.Option(help="Rewrite this device's baselines (or take --op's) from a fresh bench.")
                      ] = False,
    op: Annotated[str | None, typer.Option(help="With --update: the op whose baseline to take.")] = None,
    variant: Annotated[str | None, typer.Option(help="With --update --op: its variant (default: the first).")] = None,
    shapes: Annotated[str | None, typer.Option(help="With --update --op: a preset or .yaml (default: the op's; "
                                                    "smoke on the CPU).")] = None,
    metric: Annotated[str, typer.Option(help=METRIC_HELP)] = "step",
    max_regression: Annotated[float | None, typer.Option(help=REGRESSION_HELP)] = None,
    summary: Annotated[Path | None, typer.Option(help="Also append the markdown here (e.g. $GITHUB_STEP_SUMMARY).")
                       ] = None,
) -> None:
    """Bench every baseline of this device now and gate it; exit 1 on any regression or FAIL."""
    root = repo_root()
    if update:
        for path in ci_gate.update(root, baselines, op, variant, shapes):
            console.print(f"wrote {path}", highlight=False)
        return
    if op or variant or shapes:
        raise UserError("--op, --variant and --shapes choose what --update takes; a check benches every baseline")
    limit = load_rules().per_shape_regression_pct if max_regression is None else max_regression
    outcomes = ci_gate.check(root, baselines, metric, limit)
    text = ci_gate.markdown(outcomes, ci_gate.device_slug(), metric, limit)
    console.print(Markdown(text))
    if summary is not None:
        with summary.open("a") as f:
            f.write(text)
    raise typer.Exit(0 if all(o.passed for o in outcomes) else 1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
