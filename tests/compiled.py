"""Running tests/hopper_compile.py's compilers for sm_90a from a test, in a fresh process (the kernels must be
compiled, not interpreted), with the installed Triton or with the lent GPU's.

The GPU's Triton (3.6) is installed apart (`pip install --no-deps --target DIR triton==3.6.0`; .ci/run does) and
named by TURBO_OPT_GPU_TRITON: its ptxas spills where the newest Triton's does not (the fused attention backward
at d256: 148-180 bytes a thread under 3.6, reloaded every step, 0-16 under 3.9), so the kernels are compiled
with both."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.files import REPO_ROOT

GPU_TRITON = os.environ.get("TURBO_OPT_GPU_TRITON")

# A test's `triton_dir`: the installed Triton (None), then the GPU's where TURBO_OPT_GPU_TRITON names it.
BOTH_TRITONS = pytest.mark.parametrize("triton_dir", [
    None, pytest.param(GPU_TRITON, marks=pytest.mark.skipif(not GPU_TRITON, reason="TURBO_OPT_GPU_TRITON unset"))],
    ids=["installed", "gpu-triton"])


def compiled(args: list[str], triton_dir: str | None = None, timeout: int = 600) -> object:
    """The JSON on the last line that `python -W ignore ARGS` prints, run from the repository root with the
    interpreter off, under the installed Triton or the one at triton_dir (first on PYTHONPATH)."""
    env = os.environ | {"TRITON_INTERPRET": "0"}
    if triton_dir:
        env["PYTHONPATH"] = os.pathsep.join([triton_dir, str(REPO_ROOT)])
    done = subprocess.run([sys.executable, "-W", "ignore", *args], env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def compiled_for_hopper(call: str, triton_dir: str | None = None) -> object:
    """`call`, an expression over tests.hopper_compile (its value JSON), evaluated by `compiled`."""
    return compiled(["-c", f"import json; from tests import hopper_compile; print(json.dumps({call}))"], triton_dir)
