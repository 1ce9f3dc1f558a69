"""`python -m harness bench|gate ...`: the referee's commands without the campaign CLI."""

import typer

from harness.cli import register

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
register(app)

if __name__ == "__main__":
    app()
