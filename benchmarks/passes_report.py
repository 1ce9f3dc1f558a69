"""What the per-pass benchmarks share: timing calls in interleaved rounds, timing one tile config of a sweep, and
reporting the rows (CSV, a table, the geomean ratio to the anchor by pass)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence

import pandas as pd
import torch
from rich.console import Console
from rich.table import Table

from harness.stats import geomean
from harness.timing import Timer


def add_common_arguments(parser: argparse.ArgumentParser, family: str, default_shapes: str) -> None:
    """The options every per-pass script takes: which shapes of `family`, how long to time, where the CSV goes."""
    parser.add_argument("--shapes", default=default_shapes, help=f"{family} shape preset or YAML file")
    parser.add_argument("--only", default="", help="keep shapes whose label contains this")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--csv", default=None, help="write all rows here")


def interleaved_rounds(calls: Mapping[str, Callable[[], object]], timer: Timer, rounds: int,
                       seed: int = 0) -> dict[str, list[float]]:
    """Each call's median ms in each of `rounds` rounds of `timer.repeats` calls, every round in an order of its
    own (Timer.time_interleaved)."""
    timed = timer.time_interleaved(calls, rounds, timer.repeats, seed)
    return {name: got.medians() for name, got in timed.items()}


def with_switch(module: object, name: str, value: object, fn: Callable[[], object]) -> Callable[[], None]:
    """fn, called with `module.name` set to `value` first (an A/B of one switch of the kernels, timed in one
    process: each call sets its own side)."""
    def call() -> None:
        setattr(module, name, value)
        fn()
    return call


def sweep_row(timer: Timer, run: Callable[[], object], label: str, pass_name: str, flops: float) -> dict | None:
    """One sweep row for `run`, or None (printed) if the config does not fit (shared memory, registers)."""
    try:
        ms = timer.time(run).median_ms
    except Exception as exc:
        print(f"{pass_name}: {type(exc).__name__}: {str(exc)[:120]}")
        return None
    return {"label": label, "pass": pass_name, "ours_ms": ms, "ours_tflops": flops / ms / 1e9}


def report(rows: list[dict], title: str, columns: Sequence[str], csv: str | None, group: str = "pass") -> None:
    """Write the rows to `csv` (if given), print them, then the geomean ratio of each `group` (pass, impl...)."""
    frame = pd.DataFrame(rows)
    if csv:
        frame.to_csv(csv, index=False)
    console = Console(width=220)
    table = Table(title=f"{title} on {torch.cuda.get_device_name()}")
    for col in columns:
        table.add_column(col, justify="left" if col in ("label", group, "anchor") else "right")
    for row in rows:
        table.add_row(*(f"{row[c]:.4g}" if isinstance(row.get(c), float) else str(row.get(c, "")) for c in columns))
    console.print(table)
    if "ratio" in frame:
        ratios = frame.dropna(subset=["ratio"]).groupby(group)["ratio"]
        geomeans = ratios.apply(geomean)
        console.print(f"geomean ratio by {group}:\n" + geomeans.to_string())
