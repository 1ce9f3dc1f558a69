"""`turbo-opt`: the command line. Each command is thin over a library function."""

from __future__ import annotations

import typer
from rich.table import Table

from agent import campaign_cli, knowledge_cli
from harness.cli import console, exit_on_user_error, register
from harness.registry import all_specs
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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
