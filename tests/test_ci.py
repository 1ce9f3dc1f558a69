"""`turbo-opt ci` through the CLI on a clone, under the interpreter: baselines taken with --update pass a
check of the same code, and a deliberately slowed kernel fails it (exit 1) with the shapes named."""

from __future__ import annotations

import subprocess

import pytest

from agent.ci import markdown
from tests.clones import clone_worktree

LAUNCH = "def launch_pointer(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, cfg: TileConfig) -> torch.Tensor:\n"


def ci(root, *args):
    return subprocess.run(["turbo-opt", "ci", "--baselines", "ci", *args], cwd=root, capture_output=True, text=True,
                          timeout=900)


def test_ci_passes_against_fresh_baselines_and_fails_on_a_slowed_kernel(tmp_path):
    root = clone_worktree(tmp_path / "clone")
    shapes = tmp_path / "two.yaml"  # two of smoke's shapes: three CI runs over them
    shapes.write_text("- {label: square-128, B: 1, M: 128, N: 128, K: 128}\n"
                      "- {label: odd-97x75x61, B: 1, M: 97, N: 75, K: 61}\n")
    taken = ci(root, "--update", "--op", "gemm", "--shapes", str(shapes))
    assert taken.returncode == 0, taken.stdout + taken.stderr
    assert {p.name for p in (root / "ci" / "cpu-interpreter").iterdir()} == {
        "gemm.csv", "gemm.meta.json", "gemm.shapes.yaml"}
    # Interpreter timings on a shared CPU are noisy: a wide limit, and a slowdown far past it.
    summary = tmp_path / "summary.md"
    same = ci(root, "--max-regression", "60", "--summary", str(summary))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "| gemm | 2 |" in summary.read_text() and summary.read_text().rstrip().endswith("**PASS**")
    kernel = root / "kernels" / "gemm" / "kernel.py"
    source = kernel.read_text()
    assert LAUNCH in source
    kernel.write_text(source.replace(LAUNCH, LAUNCH + "    __import__('time').sleep(0.25)\n"))
    slowed = ci(root, "--max-regression", "60", "--summary", str(tmp_path / "slowed.md"))
    assert slowed.returncode == 1, slowed.stdout + slowed.stderr
    text = (tmp_path / "slowed.md").read_text()
    assert "| FAIL |" in text and "slower (limit 60%)" in text and text.rstrip().endswith("**FAIL**")


def test_ci_without_baselines_for_this_device_is_one_line(tmp_path):
    root = clone_worktree(tmp_path / "clone")
    (root / "ci" / "nvidia-h100").mkdir(parents=True)
    result = ci(root)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "devices there: nvidia-h100" in result.stderr


@pytest.mark.parametrize("passed", [True, False])
def test_markdown_names_the_verdict(passed, tmp_path):
    from agent.ci import Baseline, Outcome
    from harness.gate import GateResult, ShapeComparison

    shapes = (ShapeComparison("a", 1.0, 1.0 if passed else 0.5, "PASS", "PASS"),)
    failures = () if passed else ("a: 0.500x, 50.0% slower (limit 5%)",)
    text = markdown([Outcome(Baseline(tmp_path / "gemm.csv"), GateResult("step", 5.0, shapes, failures))],
                    "cpu-interpreter", "step", 5.0)
    assert ("**PASS**" if passed else "**FAIL**") in text and ("50.0% slower" in text) != passed


def test_a_regression_is_judged_on_the_faster_of_two_runs_and_a_fail_always_stays(tmp_path):
    from agent.ci import best_of
    from harness.gate import compare
    from harness.schema import GEMM, read_summary, write_summary
    from tests.test_schema import gemm_row

    def run(name, rates, checks=("PASS", "PASS", "PASS")):
        rows = [gemm_row(label, check, fwd=r, bwd=r) for label, r, check in zip("abc", rates, checks, strict=True)]
        return read_summary(write_summary(tmp_path / f"{name}.csv", GEMM, rows))

    base = run("base", (100.0, 100.0, 100.0))
    noisy = run("noisy", (93.0, 100.0, 100.0))  # one slow run of unchanged code
    calm = run("calm", (99.0, 100.0, 100.0))
    assert not compare(base, noisy).passed and compare(base, best_of(noisy, calm, "step")).passed
    slowed = run("slowed", (60.0, 100.0, 100.0))  # a real regression reproduces
    assert not compare(base, best_of(slowed, run("slowed2", (61.0, 100.0, 100.0)), "step")).passed
    failed = run("failed", (100.0, 100.0, 100.0), ("PASS", "PASS", "FAIL"))
    merged = best_of(noisy, failed, "step")
    assert merged.checks()["c"] == "FAIL" and merged.labels == ["a", "b", "c"]
    assert best_of(failed, calm, "step").checks()["c"] == "FAIL"
