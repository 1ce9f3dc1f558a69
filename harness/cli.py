"""The harness's commands, thin over quick_test_bench and gate; `turbo-opt` mounts them too."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harness.errors import UserError
from harness.gate import METRICS, GateResult, compare
from harness.quick_test_bench import BenchRun, execute_bench, prepare_bench, write_bench
from harness.registry import get_spec
from harness.rules import load_rules
from harness.schema import PASS, read_summary
from harness.shapes import Shape, load_shapes
from harness.stats import geomean
from harness.timing import INTERPRETER_NOTE, TIMING_MODES

F = TypeVar("F", bound=Callable[..., object])

# Wide enough for the tables when output goes to a file or a CI log.
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True)


def exit_on_user_error(fn: F) -> F:
    """Turn a UserError into one plain line on stderr and exit status 2, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> object:
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def _fmt(value: float, digits: int = 4) -> str:
    """`digits` significant digits; CPU-interpreter rates are tiny and must not print as 0.0."""
    return "nan" if math.isnan(value) else ("inf" if math.isinf(value) else f"{value:.{digits}g}")


HOST_MARK = "†"  # after our metric where the pass was host-bound (ShapeResult.host_bound)


def render_bench(run: BenchRun) -> Table:
    schema, ours = run.schema, run.ours
    baselines = [name for name in run.results if name != run.spec.runner.name]
    unit = schema.metric
    variant = "" if run.variant == "default" else f", {run.variant}"
    table = Table(title=f"{run.spec.name}{variant} ({run.shapes_source}, {run.timer.mode})")
    table.add_column("label", no_wrap=True)
    for dim in schema.dims:
        table.add_column(dim, justify="right")
    table.add_column("Check")
    table.add_column(f"fwd {unit}", justify="right")
    table.add_column(f"bwd {unit}", justify="right")
    for name in schema.snr_columns:
        table.add_column(name, justify="right")
    for name in baselines:  # ratios only: the baselines' own numbers are in their CSVs
        table.add_column(f"vs {name}\nfwd", justify="right")
        table.add_column("\nbwd", justify="right")

    ratios: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in baselines}
    for i, result in enumerate(ours):
        row = result.row(schema)
        fwd, bwd = row[schema.fwd_metric], row[schema.bwd_metric]
        check = f"[green]{PASS}[/green]" if result.check == PASS else f"[red]{result.check}[/red]"
        bound = result.host_bound
        cells = [result.shape.label, *(str(v) for v in result.dims.values()), check,
                 _fmt(fwd) + HOST_MARK * ("fwd" in bound), _fmt(bwd) + HOST_MARK * ("bwd" in bound)]
        cells += [_fmt(row[c], 3) for c in schema.snr_columns]
        for name in baselines:
            base_row = run.results[name][i].row(schema)
            bf, bb = base_row[schema.fwd_metric], base_row[schema.bwd_metric]
            rf, rb = fwd / bf if bf else math.nan, bwd / bb if bb else math.nan
            if result.check == PASS:
                ratios[name][0].append(rf)
                ratios[name][1].append(rb)
            cells += [f"{rf:.3f}x", f"{rb:.3f}x"]
        table.add_row(*cells)
    if baselines:
        cells = ["geomean (PASS rows)", *[""] * (len(schema.dims) + 3 + len(schema.snr_columns))]
        for name in baselines:
            cells += [f"{geomean(ratios[name][0]):.3f}x", f"{geomean(ratios[name][1]):.3f}x"]
        table.add_row(*cells, style="bold")
    if any(result.host_bound for result in ours):
        table.caption = (f"{HOST_MARK} host-bound: our host time set most samples, not the kernels "
                         "(scripts/host_time.py shows each runner's host and GPU time)")
    return table


SHAPES_HELP = "A preset of the op (see `turbo-opt ops`) or a .yaml shape file."
CSV_HELP = "Write the frozen-schema summary CSV (and its .meta.json sidecar) here."
BASELINES_HELP = "Also check and time the op's baselines, with ratio columns."
DTYPE_HELP = "Input dtype; auto = bf16 on a GPU, fp16 under the CPU interpreter."
FRESH_HELP = ("Also time on new input sets, each once per pass, as many as the rules' fresh_input_sets (sidecar "
              "fresh_ms): a gain must survive it.")
VARIANT_HELP = "The op's variant, e.g. e4m3-rowwise for grouped_gemm_fp8 (see `turbo-opt ops`)."
PROBE_HELP = ("Also check (not time) our kernel on unannounced ragged shapes and a value-range probe drawn from "
              "this seed (sidecar probes, probe_errors); a failed probe fails the bench.")
CHECKS_HELP = ("full: also the training, timed-output, thread and probe checks (what campaigns run); basic: "
               "without them, to measure what they cost.")


@exit_on_user_error
def bench(
    op: Annotated[str, typer.Option(help="Registered op to benchmark (see `turbo-opt ops`).")],
    shapes: Annotated[str, typer.Option(help=SHAPES_HELP)] = "smoke",
    summary_csv: Annotated[Path | None, typer.Option(help=CSV_HELP)] = None,
    repeats: Annotated[int | None, typer.Option(help="Timed calls per measurement (default by timing mode).")] = None,
    warmup: Annotated[int | None, typer.Option(help="Untimed calls before timing (default by timing mode).")] = None,
    compare_baselines: Annotated[bool, typer.Option(help=BASELINES_HELP)] = False,
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "auto",
    variant: Annotated[str | None, typer.Option(help=VARIANT_HELP)] = None,
    timing: Annotated[str | None, typer.Option(help=f"One of {', '.join(TIMING_MODES)} (default by device).")] = None,
    seed: Annotated[int, typer.Option(help="Base seed of the random inputs.")] = 0,
    fresh_inputs: Annotated[bool, typer.Option(help=FRESH_HELP)] = False,
    probe_seed: Annotated[int | None, typer.Option(help=PROBE_HELP)] = None,
    checks: Annotated[str, typer.Option(help=CHECKS_HELP)] = "full",
    progress_file: Annotated[Path | None, typer.Option(help="Append each finished shape's label here.")] = None,
) -> None:
    """Check every shape against the float64 reference by SNR and time forward and backward."""
    spec = get_spec(op)
    plan = prepare_bench(
        spec, load_shapes(spec.shape_family, shapes), shapes_source=shapes, dtype=dtype, variant=variant,
        timing_mode=timing,
        repeats=repeats, warmup=warmup, seed=seed, compare_baselines=compare_baselines, fresh_inputs=fresh_inputs,
        checks=checks, probe_seed=probe_seed,
    )
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err_console, transient=True,
    ) as progress:
        task = progress.add_task(f"bench {op}", total=len(plan.shapes))
        def on_shape(shape: Shape) -> None:
            progress.advance(task)
            if progress_file is not None:  # a campaign's measurement watches this to tell compiling from hung
                with progress_file.open("a") as f:
                    f.write(shape.label + "\n")

        run = execute_bench(plan, on_shape=on_shape)
    console.print(render_bench(run))
    if run.timer.mode == "interpreter-wallclock":
        console.print(f"[yellow]note:[/yellow] {INTERPRETER_NOTE}")
    errors = {r.shape.label: r.error for r in run.ours if r.error} | run.probe_errors
    for label, error in errors.items():
        console.print(f"[red]{escape(label)}[/red]: {escape(error)}", highlight=False)
    if summary_csv is not None:
        for path in write_bench(run, summary_csv):
            console.print(f"wrote {path}", highlight=False)
    failed = sum(r.check != PASS for r in run.ours)
    probes_failed = len(run.probe_errors)
    probes = f"; probes: {len(run.probes) - probes_failed} PASS, {probes_failed} FAIL" if run.probes else ""
    console.print(f"{len(run.ours) - failed} PASS, {failed} FAIL{probes}")
    raise typer.Exit(0 if run.all_pass else 1)


def render_gate(result: GateResult, base_name: str, cand_name: str) -> Table:
    table = Table(title=f"gate: {result.metric} metric, max regression {result.max_regression_pct:g}%")
    table.add_column("label", overflow="fold")
    table.add_column(base_name, justify="right")
    table.add_column(cand_name, justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("checks")
    floor = 1.0 - result.max_regression_pct / 100.0
    for s in result.shapes:
        ratio = f"{s.ratio:.3f}x"
        if s.comparable and s.ratio < floor:
            ratio = f"[red]{ratio}[/red]"
        table.add_row(s.label, _fmt(s.base), _fmt(s.cand), ratio, f"{s.base_check} -> {s.cand_check}")
    return table


METRIC_HELP = f"One of {', '.join(METRICS)} (step = fwd+bwd work over fwd+bwd time)."
REGRESSION_HELP = "Largest allowed per-shape slowdown, in percent (default: rules/iteration_rules.yaml)."


@exit_on_user_error
def gate(
    base_csv: Annotated[Path, typer.Argument(help="The baseline summary CSV.")],
    cand_csv: Annotated[Path, typer.Argument(help="The candidate summary CSV (same schema and shapes).")],
    metric: Annotated[str, typer.Option(help=METRIC_HELP)] = "step",
    max_regression: Annotated[float | None, typer.Option(help=REGRESSION_HELP)] = None,
) -> None:
    """Fail (exit 1) if the candidate has a FAIL row or a shape regresses past the limit."""
    if max_regression is None:
        max_regression = load_rules().per_shape_regression_pct
    base, cand = read_summary(base_csv, infer=True), read_summary(cand_csv, infer=True)
    for summary in (base, cand):
        if summary.extra_columns:
            console.print(f"note: {summary.path.name}: columns beside the '{summary.schema.name}' schema's, "
                          f"ignored: {', '.join(summary.extra_columns)}", highlight=False)
    result = compare(base, cand, metric=metric, max_regression_pct=max_regression)
    if result.note:
        console.print(f"note: {result.note}", highlight=False)
    console.print(render_gate(result, base_csv.name, cand_csv.name))
    console.print(f"geomean ({result.metric}, PASS rows): {result.geomean:.3f}x")
    for failure in result.failures:
        console.print(f"[red]fail[/red] {failure}", highlight=False)
    console.print("[green]gate PASS[/green]" if result.passed else "[red]gate FAIL[/red]")
    raise typer.Exit(0 if result.passed else 1)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
    app.command("gate")(gate)
