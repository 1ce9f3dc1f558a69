"""The runner's child processes (benchmarks, agent commands): each in its own process group, killed
with its group on a time limit, dying with the runner where the OS allows it, and written down so
that whoever resumes a campaign after a kill -9 ends the ones that outlived their runner before it
measures anything (a leftover benchmark would share the GPU with the resumed campaign's timings).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from harness.files import atomic_write_text

PR_SET_PDEATHSIG = 1
# Children started from several threads at once (a worker per GPU) add and remove their entries in turn.
_REGISTRY_LOCK = threading.Lock()
POLL_S = 0.2
# Resolved here, not in the forked child: a dlopen there could wait on a lock another thread held.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def _die_with_parent(parent: int) -> None:
    """In the child, before exec: ask Linux to SIGKILL it when the runner dies (prctl PDEATHSIG)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the runner died between fork and prctl
            os._exit(1)


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22): with the pid it
    names one process, so a pid reused after a reboot or by another program is never killed."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


@dataclass(frozen=True)
class Child:
    pid: int
    start: str | None
    command: str


class ChildRegistry:
    """children.json in the campaign dir: the process groups the runner started and has not reaped."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> list[Child]:
        try:
            return [Child(**c) for c in json.loads(self.path.read_text())]
        except (OSError, ValueError, TypeError):
            return []

    def _write(self, children: list[Child]) -> None:
        atomic_write_text(self.path, json.dumps([c.__dict__ for c in children]))

    def add(self, child: Child) -> None:
        with _REGISTRY_LOCK:
            self._write([*self._read(), child])

    def remove(self, pid: int) -> None:
        with _REGISTRY_LOCK:
            self._write([c for c in self._read() if c.pid != pid])

    def reap(self) -> list[Child]:
        """End every recorded process group whose leader is still the process that was started."""
        ended = []
        for child in self._read():
            if child.start is not None and _start_time(child.pid) == child.start:
                kill_group(child.pid)
                ended.append(child)
        self._write([])
        return ended


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class TimeLimit(Exception):
    """A child ran past its limit; its process group was killed."""


def run_child(
    command: list[str], *, cwd: Path, env: Mapping[str, str], log: IO[str], registry: ChildRegistry,
    limit_s: float, stdin_text: str | None = None, still_ok: Callable[[], str | None] | None = None,
) -> int:
    """Run `command` in its own process group, its output into `log`, and return its exit status.

    Raises TimeLimit after `limit_s` seconds, or as soon as `still_ok()` (called while it runs) returns
    a message; the whole group is killed either way, and whatever it started with it.
    """
    parent = os.getpid()
    proc = subprocess.Popen(
        command, cwd=cwd, env=dict(env), stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
        start_new_session=True, preexec_fn=lambda: _die_with_parent(parent),
    )
    registry.add(Child(proc.pid, _start_time(proc.pid), " ".join(command)[:200]))
    started = time.monotonic()
    try:
        if stdin_text is not None:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(stdin_text.encode())
                proc.stdin.close()
        while proc.poll() is None:
            problem = still_ok() if still_ok else None
            if problem:
                raise TimeLimit(problem)
            if time.monotonic() - started > limit_s:
                raise TimeLimit(f"ran past its limit of {limit_s:g} s")
            time.sleep(POLL_S)
        return proc.returncode
    finally:
        kill_group(proc.pid)  # also ends anything it left running in its group
        proc.wait()
        registry.remove(proc.pid)
