"""An external target: a kernel in another git repository, measured and tested by that repository's own
commands.

The manifest names the checkout (`repo`), the files a candidate may change (`kernel_source`), a
benchmark command that writes the frozen summary CSV to `{csv}` (for the shapes in the YAML file
`{shapes}`, if it takes one), optionally a quick command (the representative shapes), a focused test
command and a rebuild command. Commands run under bash in the checkout the campaign works in (the
repository itself, or its worktree in the campaign dir in `workspace` mode) with the Python import
roots of the kernel sources first on PYTHONPATH, so that the code measured is the checkout's even when
the package is installed (editable) from elsewhere. The referee stays turbo-opt's: the CSV must be the
declared schema, turbo-opt's harness must be unchanged, and turbo-opt writes the CSV's sidecar.
"""

from __future__ import annotations

import os
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton

from agent.bench import BenchError, BenchRequest
from agent.manifest import CSV_PLACEHOLDER, SHAPES_PLACEHOLDER, Manifest
from agent.processes import ChildRegistry, TimeLimit, run_child
from harness.errors import UserError
from harness.meta import BenchMeta, TimingInfo, git_state, harness_hash, write_meta
from harness.schema import FAIL, SCHEMAS, CsvSchema, read_summary, register_schema, schema_of_header
from harness.shapes import Shape

SHELL = shutil.which("bash") or "/bin/sh"


def _import_root(checkout: Path, rel: str) -> tuple[Path, str | None]:
    """Where `rel` imports from, and its top-level package: for a file inside a package (directories with
    __init__.py), the parent of the top package and its name; else the file's directory and None."""
    folder, top = (checkout / rel).parent, None
    while (folder / "__init__.py").exists() and folder != checkout:
        folder, top = folder.parent, folder.name
    return folder, top


def import_roots(checkout: Path, files: list[str]) -> list[Path]:
    """The directories to put on sys.path so that `files` import from `checkout` (src/ for src layouts)."""
    return list(dict.fromkeys(_import_root(checkout, rel)[0] for rel in files))


def own_packages(checkout: Path, files: list[str]) -> frozenset[str]:
    """The top-level packages the mutable files belong to (liger_kernel, kernels): theirs to import."""
    return frozenset(top for rel in files if (top := _import_root(checkout, rel)[1]) is not None)


def command_environment(checkout: Path, files: list[str]) -> dict[str, str]:
    path = [*map(str, import_roots(checkout, files)), str(checkout), os.environ.get("PYTHONPATH", "")]
    return os.environ | {"PYTHONPATH": os.pathsep.join(dict.fromkeys(p for p in path if p))}


def run_shell(command: str, *, checkout: Path, files: list[str], log: Path, registry: ChildRegistry,
              limit_s: float) -> int:
    """Run a target's command line in `checkout`, its output into `log`; raises TimeLimit past `limit_s`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        out.write(f"$ {command}\n")
        out.flush()
        return run_child([SHELL, "-c", command], cwd=checkout, env=command_environment(checkout, files),
                         log=out, registry=registry, limit_s=limit_s)


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"


def rebuild(manifest: Manifest, checkout: Path, log: Path, registry: ChildRegistry) -> None:
    """The target's rebuild command, if it has one; raises BenchError if it fails."""
    if not manifest.rebuild_command:
        return
    try:
        status = run_shell(manifest.rebuild_command, checkout=checkout, files=manifest.files, log=log,
                           registry=registry, limit_s=manifest.compile_timeout_s)
    except TimeLimit as exc:
        raise BenchError(f"rebuild {exc}") from None
    if status != 0:
        raise BenchError(f"rebuild exited {status}: {_last_line(log)}")


def focused_test(manifest: Manifest, checkout: Path, log: Path, registry: ChildRegistry) -> str | None:
    """Run the manifest's test command on the checkout as it is: None if it passes (or there is none),
    else why it failed, in one line."""
    if not manifest.test_command:
        return None
    log.unlink(missing_ok=True)
    try:
        rebuild(manifest, checkout, log, registry)
        status = run_shell(manifest.test_command, checkout=checkout, files=manifest.files, log=log,
                           registry=registry, limit_s=manifest.compile_timeout_s + manifest.run_timeout_s)
    except (BenchError, TimeLimit) as exc:
        return f"focused test: {exc}"
    return None if status == 0 else f"focused test failed (exit {status}): {_last_line(log)}"


def csv_schema(manifest: Manifest, csv: Path) -> CsvSchema | None:
    """The schema a campaign's CSV is read as: the manifest's (None for turbo-opt's own ops: any declared
    one); for an external target without one, a declared schema or the one its header follows by the
    convention, named after the op (the baseline then writes it into the manifest, which freezes it)."""
    if manifest.csv_schema is not None or not manifest.external:
        return manifest.schema
    with csv.open(encoding="utf-8", errors="replace") as f:
        header = f.readline()
    known = next((s for s in SCHEMAS.values() if s.header == header.strip()), None)
    inferred = schema_of_header(header, manifest.op)
    return known or (register_schema(inferred) if inferred else None)


def benchmark_command(manifest: Manifest, request: BenchRequest) -> str:
    """The command line that measures `request`: the quick command on the representative shapes (if the
    manifest has one), else the benchmark command, its placeholders filled in."""
    command = manifest.benchmark_command
    if request.scope == "representative" and manifest.quick_command:
        command = manifest.quick_command
    assert command is not None
    return command.replace(CSV_PLACEHOLDER, str(request.summary_csv)).replace(
        SHAPES_PLACEHOLDER, str(request.shapes_file))


def check_command(manifest: Manifest, checkout: Path, request: BenchRequest) -> str:
    """The benchmark command for a person or an agent to run by hand in the checkout, with the import roots
    the runner's own commands get (command_environment)."""
    roots = ":".join(str(r) for r in import_roots(checkout, manifest.files))
    return f"export PYTHONPATH={roots}${{PYTHONPATH:+:$PYTHONPATH}}; {benchmark_command(manifest, request)}"


def measure(manifest: Manifest, checkout: Path, request: BenchRequest, *, home: Path, expected_harness: str,
            device: str, registry: ChildRegistry) -> None:
    """Run the target's benchmark on the checkout; raise BenchError unless it wrote a summary CSV of the
    declared schema while turbo-opt's harness stayed as it was. Writes the CSV's sidecar."""
    request.summary_csv.unlink(missing_ok=True)
    request.log.unlink(missing_ok=True)
    rebuild(manifest, checkout, request.log, registry)
    command = benchmark_command(manifest, request)
    try:
        status = run_shell(command, checkout=checkout, files=manifest.files, log=request.log, registry=registry,
                           limit_s=manifest.compile_timeout_s + manifest.run_timeout_s)
    except TimeLimit as exc:
        raise BenchError(f"benchmark {exc}") from None
    if status not in (0, 1) or not request.summary_csv.exists():
        wrote = "" if request.summary_csv.exists() else f", and wrote no CSV at {request.summary_csv}"
        raise BenchError(f"benchmark exited {status}{wrote}: {_last_line(request.log)}")
    if harness_hash(home / "harness") != expected_harness:
        raise BenchError("turbo-opt's harness/ changed since the campaign started (hash mismatch)")
    try:
        summary = read_summary(request.summary_csv, csv_schema(manifest, request.summary_csv))
    except UserError as exc:
        raise BenchError(f"the benchmark's CSV: {exc}") from None
    commit, dirty = git_state(checkout)
    failed = {label: "check: the target's benchmark marked it FAIL"
              for label, check in summary.checks().items() if check == FAIL}
    write_meta(request.summary_csv, BenchMeta(
        op=manifest.op, runner=f"external: {command}", csv_schema=summary.schema.name, dtype=manifest.dtype,
        variant=manifest.resolved_variant, shapes=str(request.shapes_file), seed=0, device=device,
        gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None, torch_version=torch.__version__,
        triton_version=triton.__version__, python_version=sys.version.split()[0],
        timing=TimingInfo(mode="external", repeats=0, warmup=0, l2_flush=False,
                          note="timed by the target's own benchmark command"),
        git_commit=commit, git_dirty=dirty, harness_hash=expected_harness,
        created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"), errors=failed, checks="basic"))


def shapes_of(summary_labels: list[str], dims: dict[str, dict[str, float]]) -> list[Shape]:
    """The shapes a target's benchmark ran, as its CSV names them (dims that are positive integers)."""
    return [Shape(label=label, dims={k: int(v) for k, v in dims[label].items() if v == v and int(v) == v and v > 0})
            for label in summary_labels]
