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
import queue
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
# How long a serving child may take to exit by itself once its stdin closes, before it is killed.
CLOSE_WAIT_S = 5.0
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


def _start(command: list[str], *, cwd: Path, env: Mapping[str, str], log: IO[str], registry: ChildRegistry,
           stdin: int, stdout: int | IO[str]) -> subprocess.Popen:
    """`command` in a process group of its own that dies with the runner, written down in `registry`."""
    parent = os.getpid()
    proc = subprocess.Popen(
        command, cwd=cwd, env=dict(env), stdin=stdin, stdout=stdout,
        stderr=log if stdout != log else subprocess.STDOUT,
        start_new_session=True, preexec_fn=lambda: _die_with_parent(parent),
    )
    registry.add(Child(proc.pid, _start_time(proc.pid), " ".join(command)[:200]))
    return proc


def _end(proc: subprocess.Popen, registry: ChildRegistry) -> None:
    """Kill the child's whole group (also whatever it left running there), reap it, forget it."""
    kill_group(proc.pid)
    proc.wait()
    registry.remove(proc.pid)


def run_child(
    command: list[str], *, cwd: Path, env: Mapping[str, str], log: IO[str], registry: ChildRegistry,
    limit_s: float, stdin_text: str | None = None, still_ok: Callable[[], str | None] | None = None,
) -> int:
    """Run `command` in its own process group, its output into `log`, and return its exit status.

    Raises TimeLimit after `limit_s` seconds, or as soon as `still_ok()` (called while it runs) returns
    a message; the whole group is killed either way, and whatever it started with it.
    """
    proc = _start(command, cwd=cwd, env=env, log=log, registry=registry, stdout=log,
                  stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL)
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
        _end(proc, registry)


class ChildDied(Exception):
    """A serving child exited (or closed its output) before it answered."""


class ServingChild:
    """A child that lives across requests: each request one line on its stdin, each answer one line on its
    stdout (what it prints anywhere else belongs in `log`). It saves a trial worker the start it would pay
    per batch (Python, torch, the CUDA context, the inputs and references of its shapes).

    A request that is not answered within its limit, or a child that dies, raises; the whole process group
    is killed then, and the next request starts a fresh child.
    """

    def __init__(self, command: list[str], *, cwd: Path, env: Mapping[str, str], log: IO[str],
                 registry: ChildRegistry) -> None:
        self.command, self.cwd, self.env, self.log, self.registry = command, cwd, env, log, registry
        self._proc: subprocess.Popen | None = None
        self._answers: queue.Queue[str | None] = queue.Queue()

    def start(self) -> subprocess.Popen:
        """Start the child unless it runs. Call it from a thread that outlives the child: Linux sends the
        die-with-the-runner signal when the thread that started it ends, not the process."""
        if self._proc is None:
            self._proc = _start(self.command, cwd=self.cwd, env=self.env, log=self.log, registry=self.registry,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self._answers = queue.Queue()
            threading.Thread(target=self._read, args=(self._proc, self._answers), daemon=True).start()
        return self._proc

    @staticmethod
    def _read(proc: subprocess.Popen, answers: queue.Queue[str | None]) -> None:
        for line in proc.stdout:
            answers.put(line.decode().rstrip("\n"))
        answers.put(None)  # end of output: the child exited

    def request(self, line: str, limit_s: float) -> str:
        """Send `line`, return the answer; TimeLimit or ChildDied (the child killed) when none comes."""
        proc = self.start()
        try:
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()
            answer = self._answers.get(timeout=limit_s)
        except queue.Empty:
            self.close()
            raise TimeLimit(f"ran past its limit of {limit_s:g} s") from None
        except BrokenPipeError:
            answer = None
        if answer is None:
            self.close()
            raise ChildDied(f"exited {proc.returncode}")
        return answer

    def close(self) -> None:
        """End the child (its stdin closed first, so that a serving loop can finish), and its group."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        with contextlib.suppress(BrokenPipeError, OSError):
            proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=CLOSE_WAIT_S)
        _end(proc, self.registry)
