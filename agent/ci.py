"""`turbo-opt ci`: the regression gate as a CI job, over committed baseline summary CSVs.

A baselines directory holds, per device and op, what the op measured when the baseline was taken:

    <baselines>/<device>/<op>[@<variant>].csv          the frozen summary CSV
    <baselines>/<device>/<op>[@<variant>].meta.json    its sidecar (dtype, variant, timing mode...)
    <baselines>/<device>/<op>[@<variant>].shapes.yaml  the shapes it was measured on (group splits too)

`check` benches every baseline of this device now (the same op, variant, dtype, timing and shapes, in
a subprocess on the checkout's own kernels, as a campaign does) and gates it against the baseline
with harness/gate.py; `update` rewrites baselines after an intended change (a temp file, then a
rename: a failed bench leaves the old baseline). `markdown` renders the verdicts for a CI job summary.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from agent.bench import checkout_environment
from harness.errors import UserError
from harness.gate import GateResult, compare
from harness.meta import BenchMeta, read_meta, sidecar_path
from harness.registry import get_spec
from harness.schema import FAIL, PASS, Summary, read_summary
from harness.shapes import load_shapes, write_shape_file
from harness.timing import TIMING_MODES
from kernels.common.device import default_device


def device_slug() -> str:
    """This machine's folder name under the baselines: its GPU (nvidia-h100-80gb-hbm3) or cpu-interpreter."""
    device = default_device()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu interpreter"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


@dataclass(frozen=True)
class Baseline:
    csv: Path

    @property
    def name(self) -> str:
        return self.csv.stem

    @property
    def shapes_file(self) -> Path:
        return self.csv.with_suffix(".shapes.yaml")

    def meta(self) -> BenchMeta:
        try:
            return read_meta(self.csv)
        except (OSError, ValueError) as exc:
            raise UserError(f"{self.csv}: no readable sidecar {sidecar_path(self.csv).name}: {exc}") from None


def baselines(directory: Path, device: str) -> list[Baseline]:
    folder = directory / device
    found = [Baseline(csv) for csv in sorted(folder.glob("*.csv"))]
    if not found:
        others = sorted(p.name for p in directory.glob("*") if p.is_dir()) if directory.is_dir() else []
        raise UserError(f"no baselines for {device} in {directory} (devices there: {', '.join(others) or 'none'}): "
                        "`turbo-opt ci --baselines DIR --update --op OP` takes one")
    return found


def bench(root: Path, op: str, variant: str, dtype: str, timing: str | None, shapes_file: Path, csv: Path) -> None:
    """The op benched in a subprocess on `root`'s kernels; raises UserError unless it wrote a summary CSV."""
    command = [sys.executable, "-m", "harness", "bench", "--op", op, "--variant", variant, "--dtype", dtype,
               "--shapes", str(shapes_file), "--summary-csv", str(csv)]
    if timing in TIMING_MODES:
        command += ["--timing", timing]
    done = subprocess.run(command, cwd=root, env=checkout_environment(root), capture_output=True, text=True)
    # Exit 1 is FAIL rows, which the gate reports; anything else wrote no trustworthy CSV.
    if done.returncode not in (0, 1) or not csv.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UserError(f"bench of {op} ({variant}) exited {done.returncode}: {tail[0][:200]}")


@dataclass(frozen=True)
class Outcome:
    baseline: Baseline
    result: GateResult | None
    error: str = ""

    @property
    def passed(self) -> bool:
        return self.result is not None and self.result.passed


def best_of(first: Summary, second: Summary, metric: str) -> Summary:
    """Two runs of the same shapes as one: per shape the faster row where both PASS; a FAIL in either stays
    a FAIL (wrong is never noise)."""
    a, b = first.frame.set_index("label"), second.frame.set_index("label").loc[first.labels]
    faster = (b["Check"] == PASS) & (a["Check"] == PASS) & (second.metric(metric) > first.metric(metric))
    failed_second = (b["Check"] == FAIL) & (a["Check"] == PASS)
    merged = a.copy()
    take = faster | failed_second
    merged.loc[take] = b.loc[take]
    return dataclasses.replace(first, frame=merged.reset_index())


def check(root: Path, directory: Path, metric: str, max_regression_pct: float) -> list[Outcome]:
    """Every baseline of this device benched now and gated; a bench that fails to run is a failed outcome.
    A regression must reproduce: where only timings fail, the op is benched again and each shape is judged
    on the faster of its two runs (one noisy run of unchanged code moves a shape by several percent)."""
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="turbo-opt-ci-") as work:
        for baseline in baselines(directory, device_slug()):
            meta = baseline.meta()
            now, again = Path(work) / baseline.csv.name, Path(work) / f"again-{baseline.csv.name}"
            try:
                bench(root, meta.op, meta.variant, meta.dtype, meta.timing.mode, baseline.shapes_file, now)
                base, current = read_summary(baseline.csv), read_summary(now)
                result = compare(base, current, metric, max_regression_pct)
                if not result.passed and FAIL not in set(current.checks()) and not current.unlabeled_failures:
                    bench(root, meta.op, meta.variant, meta.dtype, meta.timing.mode, baseline.shapes_file, again)
                    result = compare(base, best_of(current, read_summary(again), metric), metric, max_regression_pct)
            except UserError as exc:
                outcomes.append(Outcome(baseline, None, str(exc)))
                continue
            outcomes.append(Outcome(baseline, result))
    return outcomes


def update(root: Path, directory: Path, op: str | None, variant: str | None, shapes: str | None) -> list[Path]:
    """Rewrite this device's baselines (or take the one of `op`), each from a fresh bench."""
    folder = directory / device_slug()
    folder.mkdir(parents=True, exist_ok=True)
    if op is None:
        wanted = [(m.op, m.variant, m.dtype, b.shapes_file) for b in baselines(directory, device_slug())
                  for m in [b.meta()]]
    else:
        spec = get_spec(op)
        variant = variant or spec.variants[0]
        if variant not in spec.variants:
            raise UserError(f"variant '{variant}' is not one of {', '.join(spec.variants)}")
        preset = shapes or ("smoke" if default_device().type == "cpu" else spec.default_preset)
        name = op if variant == spec.variants[0] else f"{op}@{variant}"
        shapes_file = write_shape_file(folder / f"{name}.shapes.yaml", load_shapes(spec.shape_family, preset))
        wanted = [(op, variant, "auto", shapes_file)]
    written = []
    with tempfile.TemporaryDirectory(prefix=".update-", dir=folder) as work:  # same filesystem: renames are atomic
        for op_name, op_variant, dtype, shapes_file in wanted:
            fresh = Path(work) / shapes_file.name.replace(".shapes.yaml", ".csv")
            bench(root, op_name, op_variant, dtype, None, shapes_file, fresh)
            failed = [label for label, check in read_summary(fresh).checks().items() if check != PASS]
            if failed:
                why = read_meta(fresh).errors.get(failed[0], "")[:160]
                raise UserError(f"{op_name} ({op_variant}) FAILs on {', '.join(failed[:3])} ({why}): a baseline must "
                                "pass every shape; this one was not written")
            target = folder / fresh.name
            os.replace(sidecar_path(fresh), sidecar_path(target))
            os.replace(fresh, target)
            written.append(target)
    return written


def markdown(outcomes: list[Outcome], device: str, metric: str, max_regression_pct: float) -> str:
    """The verdicts as a markdown table and the reasons of each failure, for a CI job summary."""
    lines = [f"## turbo-opt ci: {device}, {metric}, max regression {max_regression_pct:g}%", "",
             "| baseline | shapes | geomean vs baseline | slowest shape | verdict |", "|---|---|---|---|---|"]
    failures = []
    for o in outcomes:
        if o.result is None:
            lines.append(f"| {o.baseline.name} | - | - | - | ERROR |")
            failures.append(f"- {o.baseline.name}: {o.error}")
            continue
        compared = [s for s in o.result.shapes if s.comparable]
        slowest = min(compared, key=lambda s: s.ratio, default=None)
        worst = f"{slowest.label} {slowest.ratio:.3f}x" if slowest else "-"
        lines.append(f"| {o.baseline.name} | {len(o.result.shapes)} | {o.result.geomean:.3f}x | {worst} | "
                     f"{'PASS' if o.passed else 'FAIL'} |")
        failures += [f"- {o.baseline.name}: {f}" for f in o.result.failures]
        if o.result.note:
            failures.append(f"- {o.baseline.name}: note: {o.result.note}")
    verdict = "PASS" if all(o.passed for o in outcomes) else "FAIL"
    return "\n".join([*lines, "", *failures, *([""] if failures else []), f"**{verdict}**", ""])
