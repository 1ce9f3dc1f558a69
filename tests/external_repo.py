"""A small external project for tests of external targets: its own git repository with a Triton kernel
(`vecadd/kernel.py`: out = alpha * x + y), its own pytest test, and its own benchmark script that writes
the frozen summary CSV the way kernel-optimize's quick_test_bench.py does (csv.DictWriter on the header,
Python float reprs, CRLF line endings, nan for the backward it does not have), with modeled times (see
its docstring)."""

from __future__ import annotations

from pathlib import Path

import git

KERNEL = '''\
import torch
import triton
import triton.language as tl

BLOCK = 128


@triton.jit
def _axpy_kernel(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, alpha * x + y, mask=mask)


def axpy(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    _axpy_kernel[(triton.cdiv(n, BLOCK),)](x, y, out, alpha, n, BLOCK=BLOCK)
    return out
'''

TEST = '''\
import torch

from vecadd.kernel import axpy


def test_axpy_matches_torch():
    for n in (1, 1000, 4099):
        x, y = torch.randn(n), torch.randn(n)
        torch.testing.assert_close(axpy(x, y, 2.0), 2.0 * x + y)
'''

BENCH = '''\
"""python bench.py OUT.csv [SHAPES.yaml]: the frozen summary CSV of axpy (forward only).

Its times are modeled, not clocked: a launch costs LAUNCH_MS and each program it runs PROGRAM_MS, which
is how the Triton interpreter's time goes (a Python loop over the programs). The project is a fixture
for the campaign's plumbing (its edits, test and benchmark commands, gates and commits), and a clock on a
shared 2-core CI machine swings by more than the change it must see: once 1.4x measured 2.2x there.
"""
import csv
import math
import sys

import torch
import triton
import yaml

from vecadd import kernel
from vecadd.kernel import axpy

COLUMNS = ["label", "N", "Check", "Forward GB/s", "Forward GB/s_stddev", "Backward GB/s", "Backward GB/s_stddev",
           "Forward Time (ms)", "Backward Time (ms)", "out_snr"]
LAUNCH_MS, PROGRAM_MS = 1.0, 1.0
shapes = [{"label": f"n{n}", "N": n} for n in (384, 640)]
if len(sys.argv) > 2:
    shapes = yaml.safe_load(open(sys.argv[2]))["shapes"]
rows = []
for shape in shapes:
    n = shape["N"] if "N" in shape else shape["dims"]["N"]
    x, y = torch.randn(n), torch.randn(n)
    out = axpy(x, y, 2.0).double()
    ref = 2.0 * x.double() + y.double()
    snr = 10 * math.log10(float((ref ** 2).sum()) / max(float(((out - ref) ** 2).sum()), 1e-300))
    ms = LAUNCH_MS + PROGRAM_MS * triton.cdiv(n, kernel.BLOCK)
    rows.append({"label": shape["label"], "N": n, "Check": "PASS" if snr > 60 else "FAIL",
                 "Forward GB/s": 3 * n * 4 / (ms * 1e-3) / 1e9, "Forward GB/s_stddev": 0.0,
                 "Backward GB/s": float("nan"), "Backward GB/s_stddev": float("nan"),
                 "Forward Time (ms)": ms, "Backward Time (ms)": float("nan"), "out_snr": snr})
with open(sys.argv[1], "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
'''

# The CSV schema of its benchmark, as a manifest declares it.
SCHEMA = {"name": "axpy", "dims": ["N"], "metric": "GB/s", "outputs": ["out"]}


def make_external_repo(path: Path) -> Path:
    """The project at `path`, committed on its branch main."""
    files = {"vecadd/__init__.py": "", "vecadd/kernel.py": KERNEL, "tests/test_kernel.py": TEST, "bench.py": BENCH,
             ".gitignore": "__pycache__/\n.pytest_cache/\n"}
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    repo = git.Repo.init(path, initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", "external tests").set_value("user", "email", "tests@external")
    repo.git.add(A=True)
    repo.git.commit("-q", "-m", "axpy")
    return path
