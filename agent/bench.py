"""A benchmark of the campaign's tree: quick_test_bench in a subprocess, on the campaign repo's own code.

A subprocess imports the candidate's files fresh (a tuned table edited this round is read, not a
stale module), and a hang or a crash ends it, not the runner.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agent.manifest import Manifest
from agent.processes import ChildRegistry, TimeLimit, run_child
from harness.meta import read_meta


class BenchError(RuntimeError):
    """A benchmark that produced no usable CSV (timeout, crash, harness changed)."""


@dataclass(frozen=True)
class BenchRequest:
    shapes_file: Path
    summary_csv: Path
    log: Path
    compare_baselines: bool = False
    # Seed of the unannounced shapes checked next to the campaign's (None: none are checked).
    probe_seed: int | None = None
    # Which shapes `shapes_file` holds: an external target measures the representative ones with its quick command.
    scope: Literal["all", "representative"] = "all"


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
    if request.probe_seed is not None:
        cmd += ["--probe-seed", str(request.probe_seed)]
    return cmd


def checkout_environment(root: Path) -> dict[str, str]:
    """This process's environment with `root` first on PYTHONPATH: a subprocess imports that checkout's code."""
    return os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}


def run_bench(root: Path, manifest: Manifest, request: BenchRequest, harness_hash: str,
              registry: ChildRegistry) -> None:
    """Run the benchmark; raise BenchError unless it wrote a summary CSV made by the expected harness.

    The subprocess must finish its first shape (imports, compiles, checks, times) within the
    manifest's compile limit and everything within compile + run limits; past either, its whole
    process group is killed.
    """
    env = checkout_environment(root)
    request.log.parent.mkdir(parents=True, exist_ok=True)
    request.summary_csv.unlink(missing_ok=True)
    progress = request.summary_csv.with_suffix(".progress")
    progress.unlink(missing_ok=True)
    command = [*bench_command(manifest, request), "--progress-file", str(progress)]
    started = time.monotonic()

    def compiling_too_long() -> str | None:
        if time.monotonic() - started > manifest.compile_timeout_s and not progress.exists():
            return f"finished no shape within the compile limit of {manifest.compile_timeout_s} s"
        return None

    with request.log.open("w") as log:
        try:
            returncode = run_child(command, cwd=root, env=env, log=log, registry=registry,
                                   limit_s=manifest.compile_timeout_s + manifest.run_timeout_s,
                                   still_ok=compiling_too_long)
        except TimeLimit as exc:
            raise BenchError(f"benchmark {exc}") from None
    # Exit 1 means FAIL rows, which is a result; anything else produced no trustworthy CSV.
    if returncode not in (0, 1) or not request.summary_csv.exists():
        tail = request.log.read_text().strip().splitlines()[-1:] or ["no output"]
        raise BenchError(f"benchmark exited {returncode}: {tail[0][:200]}")
    if read_meta(request.summary_csv).harness_hash != harness_hash:
        raise BenchError("harness/ changed since the campaign started (hash mismatch)")
