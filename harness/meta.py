"""The JSON sidecar of a summary CSV: where, how and with what the numbers were made."""

from __future__ import annotations

import hashlib
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import git
import torch
import triton
from pydantic import BaseModel, ConfigDict

from harness.files import REPO_ROOT, atomic_write_text

HARNESS_DIR = Path(__file__).resolve().parent


class TimingInfo(BaseModel):
    mode: str
    repeats: int
    warmup: int
    l2_flush: bool
    # The repeats spread over this many interleaved rounds of every runner timed (1 in sidecars written
    # before the rounds: each runner's repeats back to back, ours first).
    rounds: int = 1
    note: str = ""


class BenchMeta(BaseModel):
    model_config = ConfigDict(extra="forbid")

    op: str
    runner: str
    csv_schema: str
    dtype: str
    variant: str
    shapes: str
    seed: int
    device: str
    gpu: str | None
    torch_version: str
    triton_version: str
    python_version: str
    timing: TimingInfo
    git_commit: str | None
    git_dirty: bool | None
    harness_hash: str
    created_utc: str
    # label -> why the row FAILs: a check's message ("check: ...") or the exception it raised
    errors: dict[str, str] = {}
    # label -> the passes ("fwd", "bwd") whose timing was mostly the runner's host time, not its kernels'
    host_bound: dict[str, list[str]] = {}
    # label -> (forward ms, backward ms) timed with fresh input tensors every call (--fresh-inputs)
    fresh_ms: dict[str, tuple[float, float]] = {}
    # baseline name -> its summary CSV (same schema and labels), when baselines were run
    baseline_csvs: dict[str, str] = {}
    # "full" (training, timed-output, thread and probe checks on our runner) or "basic" (without them)
    checks: Literal["full", "basic"] = "full"
    # labels of the unannounced probes our runner was checked on (--probe-seed), and why any failed
    probes: list[str] = []
    probe_errors: dict[str, str] = {}


def harness_hash(harness_dir: Path = HARNESS_DIR) -> str:
    """sha256 over harness/*.py (paths and bytes): any edit to the referee changes it."""
    digest = hashlib.sha256()
    for path in sorted(harness_dir.rglob("*.py")):
        digest.update(path.relative_to(harness_dir).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def git_state(path: Path = REPO_ROOT) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout holding `path`; (None, None) outside a git checkout."""
    try:
        repo = git.Repo(path, search_parent_directories=True)
        return repo.head.commit.hexsha, repo.is_dirty(untracked_files=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, git.GitCommandNotFound, ValueError):
        return None, None


def environment(device: torch.device) -> dict[str, object]:
    commit, dirty = git_state()
    return {
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch_version": torch.__version__,
        "triton_version": triton.__version__,
        "python_version": platform.python_version(),
        "git_commit": commit,
        "git_dirty": dirty,
        "harness_hash": harness_hash(),
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def sidecar_path(csv_path: Path) -> Path:
    return csv_path.with_suffix(".meta.json")


def write_meta(csv_path: Path, meta: BenchMeta) -> Path:
    return atomic_write_text(sidecar_path(csv_path), meta.model_dump_json(indent=2) + "\n")


def read_meta(csv_path: Path) -> BenchMeta:
    return BenchMeta.model_validate_json(sidecar_path(csv_path).read_text())
