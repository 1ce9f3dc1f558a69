"""Throwaway repositories for tests that run real campaigns: a clone of this repository (its history,
which knowledge evidence and lineage checks read) with the working tree as it is now on top, committed:
what a clean clone of the next commit would hold."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import git

from harness.files import REPO_ROOT

AUTHOR = "--author=turbo-opt tests <tests@turbo-opt>"


def _listed(root: Path) -> set[str]:
    """Tracked files and new files git does not ignore, as the working tree holds them."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         check=True, capture_output=True).stdout.decode()
    return {rel for rel in out.split("\0") if rel and (root / rel).is_file()}


def clone_worktree(dest: Path, extra: dict[str, str] | None = None) -> Path:
    """A git clone at `dest` of this checkout, its working tree (plus `extra` files) committed on top."""
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(dest)], check=True)
    wanted = _listed(REPO_ROOT)
    for rel in _listed(dest) - wanted:  # deleted in the working tree
        (dest / rel).unlink()
    for rel in wanted:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / rel, dest / rel)
    for rel, text in (extra or {}).items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(text)
    repo = git.Repo(dest)
    repo.git.add(A=True)
    if repo.is_dirty(untracked_files=True):
        repo.git.commit("-q", "-m", "the working tree under test", AUTHOR)
    return dest
