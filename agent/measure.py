"""Measurement: quick_test_bench in a subprocess, on the campaign repo's own code.

A subprocess imports the candidate's files fresh (a tuned table edited this round is read, not a
stale module), and a hang or a crash ends it, not the runner.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from agent.manifest import Manifest
from harness.meta import read_meta


class MeasureError(RuntimeError):
    """A measurement that produced no usable CSV (timeout, crash, harness changed)."""


@dataclass(frozen=True)
class BenchRequest:
    shapes_file: Path
    summary_csv: Path
    log: Path
    compare_baselines: bool = False


def bench_command(manifest: Manifest, request: BenchRequest) -> list[str]:
    cmd = [
        sys.executable, "-m", "harness", "bench", "--op", manifest.op, "--shapes", str(request.shapes_file),
        "--summary-csv", str(request.summary_csv), "--dtype", manifest.dtype, "--variant", manifest.resolved_variant,
    ]
    if manifest.repeats:
        cmd += ["--repeats", str(manifest.repeats)]
    if manifest.timing != "auto":
        cmd += ["--timing", manifest.timing]
    if request.compare_baselines:
        cmd.append("--compare-baselines")
    if manifest.fresh_inputs and manifest.timing != "cuda-graph":
        cmd.append("--fresh-inputs")
    return cmd


def run_bench(root: Path, manifest: Manifest, request: BenchRequest, harness_hash: str) -> None:
    """Run the benchmark; raise MeasureError unless it wrote a summary CSV made by the expected harness.

    The subprocess must finish its first shape (imports, compiles, checks, times) within the
    manifest's compile limit and everything within compile + run limits; past either, its whole
    process group is killed.
    """
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    request.log.parent.mkdir(parents=True, exist_ok=True)
    request.summary_csv.unlink(missing_ok=True)
    progress = request.summary_csv.with_suffix(".progress")
    progress.unlink(missing_ok=True)
    command = [*bench_command(manifest, request), "--progress-file", str(progress)]
    total_limit = manifest.compile_timeout_s + manifest.run_timeout_s
    with request.log.open("w") as log:
        proc = subprocess.Popen(
            command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        started = time.monotonic()
        try:
            while proc.poll() is None:
                elapsed = time.monotonic() - started
                if elapsed > manifest.compile_timeout_s and not progress.exists():
                    raise MeasureError(f"no shape finished within the compile limit of {manifest.compile_timeout_s} s")
                if elapsed > total_limit:
                    raise MeasureError(f"benchmark exceeded its limit of {total_limit} s (compile + run)")
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    # Exit 1 means FAIL rows, which is a result; anything else produced no trustworthy CSV.
    if proc.returncode not in (0, 1) or not request.summary_csv.exists():
        tail = request.log.read_text().strip().splitlines()[-1:] or ["no output"]
        raise MeasureError(f"benchmark exited {proc.returncode}: {tail[0][:200]}")
    meta = read_meta(request.summary_csv)
    if meta.harness_hash != harness_hash:
        raise MeasureError("harness/ changed since the campaign started (hash mismatch)")
