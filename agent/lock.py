"""One process drives a campaign at a time: an flock on the campaign dir's `lock` file, which the OS
drops when its holder dies (even by kill -9), so a crashed runner never blocks the next one."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from harness.errors import UserError


@contextlib.contextmanager
def hold(run_dir: Path, campaign: str) -> Iterator[None]:
    with (run_dir / "lock").open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            raise UserError(f"campaign {campaign} is being run by another process (pid {lock.read().strip() or '?'})"
                            ) from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        yield


def holder(run_dir: Path) -> int | None:
    """The pid driving the campaign now, or None when nobody is."""
    path = run_dir / "lock"
    if not path.exists():
        return None
    with path.open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            text = lock.read().strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(lock, fcntl.LOCK_UN)
        return None
