"""The campaign state machine on a throwaway git repo, with a deterministic fake measurer.

The fake scores the gemm tuned table: BLOCK_M 128 is 10% faster, GROUP_M 4 is 10% slower, BLOCK_M
256 is 3% slower, everything else changes nothing. So a 4-round campaign must roll back GROUP_M
8 -> 4 (a regression), re-measure GROUP_M 8 -> 16 and roll it back as noise, accept BLOCK_M 64 -> 128
and roll back BLOCK_M 128 -> 256.
"""

import shutil
import subprocess
from pathlib import Path

import git
import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from agent.bench import BenchRequest
from agent.cli import app
from agent.manifest import load_manifest, parse_manifest
from agent.proposers.search import read_tuning
from agent.runner import Campaign
from harness.errors import UserError
from harness.files import REPO_ROOT
from harness.meta import BenchMeta, TimingInfo, environment, write_meta
from harness.registry import get_spec
from harness.schema import GEMM, write_summary
from harness.shapes import load_shape_file, load_shapes
from tests.clones import clone_worktree
from tests.test_schema import gemm_row

EXPECTED = [("ROLLBACK", "GROUP_M", 4), ("ROLLBACK", "GROUP_M", 16), ("ACCEPT", "BLOCK_M", 128),
            ("ROLLBACK", "BLOCK_M", 256)]


def make_repo(path: Path) -> Path:
    (path / "kernels" / "gemm").mkdir(parents=True)
    for name in ("kernel.py", "tuning.py"):  # the op's mutable files
        shutil.copy(REPO_ROOT / "kernels" / "gemm" / name, path / "kernels" / "gemm" / name)
    (path / "README.md").write_text("a throwaway repo\n")
    (path / ".gitignore").write_text("campaigns/runs/\n")
    repo = git.Repo.init(path)
    repo.git.add(A=True)
    repo.git.commit("-m", "start", "--author", "t <t@t>")
    return path


def speed(root: Path) -> float:
    _, table = read_tuning(root / "kernels" / "gemm" / "tuning.py")
    cfg = table["small"]
    factor = {128: 1.10, 256: 1.10 * 0.97}.get(cfg["BLOCK_M"], 1.0)
    return 100.0 * factor * (0.90 if cfg["GROUP_M"] == 4 else 1.0)


class FakeMeasurer:
    """`slowdown`: the machine's speed after the baseline (1.0: as fast as at BASELINE); `final_slowdown`: the
    best's speed in REPORT's final bench (a gain that does not reproduce)."""

    def __init__(self, root: Path, interrupt_at_call: int | None = None, slowdown: float = 1.0,
                 final_slowdown: float = 1.0) -> None:
        self.root, self.calls, self.interrupt_at_call, self.slowdown = root, 0, interrupt_at_call, slowdown
        self.final_slowdown = final_slowdown

    def __call__(self, request: BenchRequest) -> None:
        self.calls += 1
        if self.calls == self.interrupt_at_call:
            raise KeyboardInterrupt  # the process dies in the middle of this measurement
        labels = [s.label for s in load_shape_file(request.shapes_file)]
        value = speed(self.root) * (self.slowdown if self.calls > 1 else 1.0)
        if request.summary_csv.parent.name == "final" and request.summary_csv.name == "benchmark.csv":
            value *= self.final_slowdown
        write_summary(request.summary_csv, GEMM, [gemm_row(label, fwd=value, bwd=value) for label in labels])
        meta = BenchMeta(op="gemm", runner="fake", csv_schema="gemm", dtype="fp16", variant="default", shapes="t",
                         seed=0, timing=TimingInfo(mode="fake", repeats=1, warmup=0, l2_flush=False),
                         **environment(torch.device("cpu")))
        write_meta(request.summary_csv, meta)
        if request.compare_baselines:
            rows = [gemm_row(label, fwd=200.0, bwd=200.0) for label in labels]
            write_summary(request.summary_csv.with_name("benchmark.baseline-torch_matmul.csv"), GEMM, rows)


def manifest(name: str, **overrides):
    return parse_manifest({"campaign": name, "op": "gemm", "shapes": "smoke", "max_iterations": 4} | overrides, "test")


def run_campaign(root: Path, name: str, measurer=None, **overrides) -> Campaign:
    measurer = measurer or FakeMeasurer(root)
    campaign = Campaign.create(root, manifest(name, **overrides), measurer=measurer, console=Console(quiet=True))
    campaign.run()
    return campaign


def outcomes(campaign: Campaign) -> list[tuple[str, str, int]]:
    return [(r.status, r.candidate.params["knob"], r.candidate.params["new"])
            for r in campaign.state.optimization_rounds()]


def test_campaign_accepts_and_rolls_back_with_lineage_logs_and_report(tmp_path):
    root = make_repo(tmp_path / "repo")
    campaign = run_campaign(root, "c1")
    state = campaign.state
    assert state.phase == "DONE" and outcomes(campaign) == EXPECTED
    assert state.stop_reason.startswith("max iterations")
    remeasured = state.rounds[2]
    assert len(remeasured.measurements) == 1 + campaign.rules.remeasure_count
    repo = git.Repo(root)
    assert repo.active_branch.name == "optimize/c1"
    assert repo.head.commit.hexsha == state.best_commit
    subjects = [c.message for c in repo.iter_commits(max_count=2)]
    assert subjects[0].startswith("[optimize] gemm triton round-4: small BLOCK_M 64 -> 128")
    assert "\nHypothesis: " in subjects[0] and "\nResult: " in subjects[0]
    assert repo.git.diff("HEAD~1", "--name-only").split() == ["kernels/gemm/tuning.py"]
    assert not repo.is_dirty(untracked_files=True)
    assert "master" in repo.heads or "main" in repo.heads  # the user's branch is untouched
    run = campaign.run_dir
    for n in range(1, 6):
        for name in ("summary.md", "candidate.diff", "artifacts/benchmark.csv"):
            assert (run / "rounds" / f"round-{n}" / name).exists(), (n, name)
    trend = (run / "logs" / "performance_trend.md").read_text()
    assert trend.count("| ACCEPT |") == 2 and trend.count("| ROLLBACK |") == 3  # baseline + round 4; 3 rollbacks
    assert (run / "report.md").exists() and (run / "metric_by_round.png").stat().st_size > 1000
    assert "| smoke/square-128 | 100 | 110 | 1.100x | 200 | 0.550x |" in (run / "report.md").read_text()
    assert "GROUP_M" in (run / "tips.yaml").read_text()


class UnmovedMeasurer(FakeMeasurer):
    """Every table measures the same; the final bench runs 6% faster (a machine that warmed up)."""

    def __call__(self, request: BenchRequest) -> None:
        super().__call__(request)
        value = 106.0 if request.summary_csv.parent.name == "final" else 100.0
        labels = [s.label for s in load_shape_file(request.shapes_file)]
        write_summary(request.summary_csv, GEMM, [gemm_row(label, fwd=value, bwd=value) for label in labels])


def test_a_campaign_that_accepts_nothing_reports_drift_not_a_gain(tmp_path):
    root = make_repo(tmp_path / "repo")
    campaign = run_campaign(root, "flat", UnmovedMeasurer(root), max_iterations=2)
    assert campaign.state.best_commit == campaign.state.start_commit
    report = (campaign.run_dir / "report.md").read_text()
    assert "no round was accepted, so the best is the start: its final bench 106 against the baseline bench 100 " \
           "(+6.0%) is two benches of the same code, drift and not a gain" in report
    assert "their ratio is the machine's drift" in report


def test_kill_during_validate_then_resume_gives_the_same_campaign(tmp_path):
    reference = run_campaign(make_repo(tmp_path / "a"), "same")
    root = make_repo(tmp_path / "b")
    # calls (each candidate measurement, then the best next to it): 1 baseline, 2-3 round 2, 4-11 round 3
    # (with re-measures), 12-13 round 4: die while re-measuring the best in round 4's VALIDATE
    killed = Campaign.create(root, manifest("same"), measurer=FakeMeasurer(root, interrupt_at_call=13),
                             console=Console(quiet=True))
    with pytest.raises(KeyboardInterrupt):
        killed.run()
    resumed = Campaign.open(root, "same", measurer=FakeMeasurer(root), console=Console(quiet=True))
    assert resumed.state.phase == "VALIDATE" and resumed.state.round == 4
    resumed.run()
    assert outcomes(resumed) == outcomes(reference) == EXPECTED
    repo = git.Repo(root)
    assert repo.head.commit.hexsha == resumed.state.best_commit and not repo.is_dirty(untracked_files=True)
    assert len([c for c in repo.iter_commits() if c.message.startswith("[optimize]")]) == 1
    optimize_log = (resumed.run_dir / "logs" / "optimize.md").read_text()
    assert [optimize_log.count(f"## Round {n}:") for n in range(1, 6)] == [1] * 5


def test_a_machine_that_slows_down_after_the_baseline_does_not_decide(tmp_path):
    paired = run_campaign(make_repo(tmp_path / "a"), "paired", FakeMeasurer(tmp_path / "a", slowdown=0.85))
    assert outcomes(paired) == EXPECTED
    assert all(len(r.references) == len(r.measurements) for r in paired.state.optimization_rounds())
    unpaired = run_campaign(make_repo(tmp_path / "b"), "unpaired", FakeMeasurer(tmp_path / "b", slowdown=0.85),
                            paired_reference=False)
    assert [status for status, _, _ in outcomes(unpaired)] == ["ROLLBACK"] * 4  # the +10% drowned in the -15%


def test_a_dirty_tree_is_refused_before_anything_is_written(tmp_path):
    root = make_repo(tmp_path / "repo")
    (root / "kernels" / "gemm" / "tuning.py").write_text("# edited\n")
    with pytest.raises(UserError, match=r"not clean \(kernels/gemm/tuning.py\)"):
        Campaign.create(root, manifest("dirty"), measurer=FakeMeasurer(root))
    assert not (root / "campaigns").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_iterations": 500}, "field 'max_iterations'"),
        ({"primary_metric": "latency"}, "field 'primary_metric'"),
        ({"variant": "fp4"}, "variant 'fp4'"),
        ({"mutable_files": ["harness/gate.py"]}, "not mutable files of gemm"),
        ({"colour": "blue"}, "field 'colour'"),
    ],
)
def test_a_wrong_manifest_field_is_one_clear_line(overrides, message):
    with pytest.raises(UserError, match=message) as info:
        manifest("bad", **overrides)
    assert "\n" not in str(info.value)


def test_cli_start_with_a_bad_manifest_exits_2(tmp_path, monkeypatch):
    bad = tmp_path / "m.yaml"
    bad.write_text("op: gemm\nshapes: smoke\nmax_iterations: 0\n")
    monkeypatch.chdir(make_repo(tmp_path / "repo"))
    result = CliRunner().invoke(app, ["start", "--manifest", str(bad)])
    assert result.exit_code == 2 and result.output.startswith("error: ") and "max_iterations" in result.output


def test_real_campaign_through_the_cli_in_a_clone(tmp_path):
    """The real thing, small: benches in subprocesses on the clone's own code, under the interpreter."""
    clone = clone_worktree(tmp_path / "clone")
    shapes = tmp_path / "one.yaml"  # one odd shape: each of the campaign's benches costs a quarter of smoke's four
    shapes.write_text("- {label: odd-97x75x61, B: 1, M: 97, N: 75, K: 61}\n")
    result = subprocess.run(["turbo-opt", "start", "--op", "gemm", "--shapes", str(shapes), "--max-iterations", "1",
                             "--name", "ci", "--repeats", "1"], cwd=clone, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    run = clone / "campaigns" / "runs" / "ci"
    assert (run / "report.md").exists() and (run / "rounds" / "round-2" / "summary.md").exists()
    assert not git.Repo(clone).is_dirty(untracked_files=True)


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "campaigns").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_campaign_preset_loads_and_names_shapes_its_op_has(path):
    """The presets a user starts from: each a valid manifest whose op is registered and whose shapes resolve."""
    manifest = load_manifest(path)
    spec = get_spec(manifest.op)
    assert manifest.resolved_variant in spec.variants
    if isinstance(manifest.shapes, str):
        assert load_shapes(spec.shape_family, manifest.shapes)
