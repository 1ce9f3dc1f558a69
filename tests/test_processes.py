"""The runner's children: killed with their whole group on a time limit, dead with a killed runner, and
ended by whoever resumes (agent/processes.py)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agent.processes import Child, ChildRegistry, TimeLimit, _start_time, run_child


def alive(pid: int) -> bool:
    """Running (a zombie that only waits to be reaped counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_dead(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_a_time_limit_kills_the_whole_group_and_forgets_it(tmp_path):
    registry = ChildRegistry(tmp_path / "children.json")
    pidfile = tmp_path / "grandchild"
    with (tmp_path / "log").open("w") as log, pytest.raises(TimeLimit, match="limit of 1 s"):
        run_child(["bash", "-c", f"sleep 600 & echo $! > {pidfile}; sleep 600"], cwd=tmp_path, env=os.environ,
                  log=log, registry=registry, limit_s=1)
    assert wait_dead(int(pidfile.read_text()))
    assert registry.reap() == []  # nothing left on record


def test_reap_ends_a_recorded_group_that_outlived_its_runner_and_nothing_else(tmp_path):
    registry = ChildRegistry(tmp_path / "children.json")
    orphan = subprocess.Popen(["sleep", "600"], start_new_session=True)
    registry.add(Child(orphan.pid, _start_time(orphan.pid), "sleep 600"))
    registry.add(Child(os.getpid(), "0", "a pid since reused by another process"))  # wrong start time: spared
    assert [c.pid for c in registry.reap()] == [orphan.pid]
    orphan.wait(timeout=10)
    assert orphan.returncode == -signal.SIGKILL and alive(os.getpid())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_dies_with_its_runner(tmp_path):
    pidfile = tmp_path / "child"
    runner = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from agent.processes import ChildRegistry, run_child
        with open("{tmp_path / 'log'}", "w") as log:
            run_child(["bash", "-c", "echo $$ > {pidfile}; exec sleep 600"], cwd=Path("{tmp_path}"),
                      env=os.environ, log=log, registry=ChildRegistry(Path("{tmp_path / 'children.json'}")),
                      limit_s=600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", runner], env=os.environ | {"PYTHONPATH": os.getcwd()})
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.1)
    child = int(pidfile.read_text())
    parent.kill()  # SIGKILL: no cleanup code of the runner runs
    parent.wait()
    assert wait_dead(child)
