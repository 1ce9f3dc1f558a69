"""Campaigns on a kernel outside turbo-opt (tests/external_repo.py: its own git repository, Triton kernel,
pytest test and benchmark script), through the real CLI with a scripted `command` agent, under the
interpreter: in `repo` mode with turbo-opt's field names, and in `workspace` mode from a manifest in
kernel-optimize's template field names with `git_commit: false` and `git_branch: none`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import git
import pytest
import yaml

from agent.manifest import parse_manifest
from agent.state import load_state
from agent.template import from_template, metric_of, speedup_of
from harness.errors import UserError
from harness.files import REPO_ROOT
from tests.clones import clone_worktree
from tests.external_repo import SCHEMA, make_external_repo

PLAN = {
    # 384 and 640 elements: 3 and 5 programs of 128, 2 and 3 of 256 (a gain, but not one too large to be true).
    "2": {"replace": ["vecadd/kernel.py", "BLOCK = 128", "BLOCK = 256"], "name": "wider blocks: fewer programs"},
    "3": {"replace": ["vecadd/kernel.py", "alpha * x + y, mask", "alpha * x + y + 0.5, mask"],
          "name": "breaks its test"},
    "4": {"replace": ["bench.py", "LAUNCH_MS, PROGRAM_MS = 1.0, 1.0", "LAUNCH_MS, PROGRAM_MS = 1.0, 0.1"],
          "name": "edits the benchmark"},
}


def agent_command(home, tmp_path) -> str:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    # From turbo-opt's checkout: the target has a `tests` folder of its own.
    return f"cd {home} && {sys.executable} -m tests.scripted_agent {plan}"


def start(home, manifest_path):
    result = subprocess.run(["turbo-opt", "start", "--manifest", str(manifest_path)], cwd=home, capture_output=True,
                            text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def verdicts(state) -> dict[int, tuple[str, str]]:
    return {r.number: (r.status, r.reason) for r in state.optimization_rounds()}


def assert_untouched(home):
    assert not git.Repo(home).is_dirty(untracked_files=True), "turbo-opt's own tree was changed"


def test_a_command_campaign_in_an_external_repo(tmp_path):
    home = clone_worktree(tmp_path / "home")
    ext = make_external_repo(tmp_path / "ext")
    manifest = {"campaign": "ext", "op": "axpy", "repo": str(ext), "kernel_source": ["vecadd/kernel.py"],
                "test_command": "python -m pytest -q tests", "benchmark_command": "python bench.py {csv}",
                "csv_schema": SCHEMA, "max_iterations": 3,
                "proposer": {"kind": "command", "run": agent_command(home, tmp_path), "timeout_min": 5}}
    (tmp_path / "ext.yaml").write_text(yaml.safe_dump(manifest))
    start(home, tmp_path / "ext.yaml")
    run = home / "campaigns" / "runs" / "ext"
    state = load_state(run / "state.json")
    got = verdicts(state)
    assert got[2][0] == "ACCEPT", got[2]
    assert got[3][0] == "ROLLBACK" and got[3][1].startswith("focused test failed"), got[3]
    assert got[4][0] == "ROLLBACK" and got[4][1].startswith("write scope: touched bench.py"), got[4]
    # The kernel has no backward: the step the manifest asked for is scored on the forward, with a note.
    assert state.manifest.primary_metric == "forward" and "no backward" in state.notes[0]
    assert "no backward" in (run / "report.md").read_text()
    # The lineage is in the target's repo: its campaign branch holds the accepted round, the tree is clean.
    repo = git.Repo(ext)
    assert repo.active_branch.name == "optimize/ext" and repo.head.commit.hexsha == state.best_commit
    assert repo.head.commit.message.startswith("[optimize] axpy triton round-2:")
    assert "BLOCK = 256" in (ext / "vecadd/kernel.py").read_text() and not repo.is_dirty(untracked_files=True)
    # Its test ran at the baseline, on each candidate, and in the final check.
    for log in ("rounds/round-1/artifacts/test.log", "rounds/round-2/artifacts/test.log", "final/test.log"):
        assert "passed" in (run / log).read_text(), log
    assert "failed" in (run / "rounds/round-3/artifacts/test.log").read_text()
    assert_untouched(home)


TEMPLATE = {
    "target_op": "axpy", "target_backend": "TRITON", "target_lang": "python/triton", "target_gpu": "any",
    "execution_mode": "workspace", "project_skill": "kernel-optimize", "performance_target": "3x",
    "primary_metric": "Forward GB/s",
    "target_shapes": [{"model": "toy", "op": "axpy", "N": 384}, {"model": "toy", "op": "axpy", "N": 640}],
    "kernel_source": "vecadd/kernel.py", "test_command": "python -m pytest -q tests",
    "benchmark_command": "python bench.py {csv} {shapes}", "quick_command": "python bench.py {csv} {shapes}",
    "git_commit": False, "git_branch": "none", "max_iterations": 1, "created": "2026-11-24",
    "owner": "kernels team",
}


def test_a_template_manifest_runs_in_a_workspace_and_syncs_the_best_back(tmp_path):
    home = clone_worktree(tmp_path / "home")
    ext = make_external_repo(tmp_path / "ext")
    template = TEMPLATE | {"proposer": {"kind": "command", "run": agent_command(home, tmp_path), "timeout_min": 5},
                           "campaign": "ws"}
    (ext / "optimize.yaml").write_text(yaml.safe_dump(template))
    repo = git.Repo(ext)
    repo.git.add(A=True)
    repo.git.commit("-q", "-m", "the campaign's manifest")
    start_commit = repo.head.commit.hexsha
    result = start(home, ext / "optimize.yaml")
    assert "kept as metadata: owner" in result.stderr
    run = home / "campaigns" / "runs" / "ws"
    state = load_state(run / "state.json")
    assert verdicts(state)[2][0] == "ACCEPT", verdicts(state)
    assert state.manifest.metadata["owner"] == "kernels team" and state.manifest.target_speedup == 3.0
    assert [s.label for s in state.manifest.shapes] == ["toy/axpy/384", "toy/axpy/640"]
    # git_commit false and git_branch none: the user's branch is where it was, no campaign branch is left,
    # the rounds are kept under a ref, and the best kernel is in the user's tree, uncommitted.
    assert repo.active_branch.name == "main" and repo.head.commit.hexsha == start_commit
    assert [h.name for h in repo.heads] == ["main"]
    assert repo.git.rev_parse("refs/turbo-opt/ws") == state.best_commit
    assert repo.git.status("--porcelain").strip() == "M vecadd/kernel.py"
    assert "BLOCK = 256" in (ext / "vecadd/kernel.py").read_text()
    assert not (run / "workspace").exists() and any("synced into" in n for n in state.notes)
    assert_untouched(home)


def test_template_fields_map_to_ours(tmp_path):
    ext = make_external_repo(tmp_path / "ext")
    data, notes = from_template(TEMPLATE, ext)
    assert data["op"] == "axpy" and data["backend"] == "triton" and data["repo"] == str(ext)
    assert data["branch"] == "none" and data["git_commit"] is False and data["primary_metric"] == "forward"
    assert data["metadata"]["target_lang"] == "python/triton" and data["metadata"]["owner"] == "kernels team"
    assert any("owner" in n for n in notes)
    assert [metric_of(m) for m in ("Combined Step TFLOPS", "Forward GB/s", "backward tflops", "Latency")] == \
        ["step", "forward", "backward", None]
    assert [speedup_of(v) for v in ("1.2x", "+20%", 1.5, "fast")] == [1.2, 1.2, 1.5, None]
    # One of turbo-opt's own ops: its files are the mutable files, and no repo is assumed.
    own, _ = from_template({"target_op": "gemm", "kernel_source": ["kernels/gemm/tuning.py"],
                            "target_shapes": [{"model": "llama", "M": 128, "N": 128, "K": 128}]}, ext)
    manifest = parse_manifest(own, "own.yaml")
    assert manifest.repo is None and manifest.files == ["kernels/gemm/tuning.py"]


@pytest.mark.parametrize("change, message", [
    ({"benchmark_command": "python bench.py"}, "put {csv} in it"),
    ({"kernel_source": []}, "needs kernel_source"),
    ({"kernel_source": ["../elsewhere.py"]}, "must be a path inside repo"),
    ({"benchmark_command": "python bench.py {csv} {shapes}"}, "list the shapes it is to run"),
    ({"repo": None}, "needs `repo`"),
])
def test_bad_external_manifests_get_one_line(tmp_path, change, message):
    data = {"campaign": "x", "op": "axpy", "repo": str(tmp_path), "kernel_source": ["k.py"],
            "benchmark_command": "python bench.py {csv}"} | change
    with pytest.raises(UserError, match=message.replace("{", r"\{").replace("}", r"\}")) as info:
        parse_manifest(data, "m.yaml")
    assert "\n" not in str(info.value)


TUNING = '''\
TUNABLE_SPACE = {"BLOCK_N": (64, 128, 256, 512), "num_warps": (1, 2, 4, 8)}
TUNED_TABLE = {
    "vector": {"BLOCK_N": 128, "num_warps": 4},
}


def buckets_for(dims, variant):
    return {"vector"}
'''


def test_the_search_walks_an_external_targets_tuned_table(tmp_path):
    """The one-knob search works on a target that declares a tuned table in turbo-opt's format; the
    trial-based algorithms, which measure through turbo-opt's harness, are refused for it."""
    from agent.processes import ChildRegistry
    from agent.proposers import Proposed, RoundContext
    from agent.proposers.search import SearchProposer
    from agent.tuning_table import read_tuning

    ext = make_external_repo(tmp_path / "ext")
    (ext / "vecadd" / "tuning.py").write_text(TUNING)
    data = {"campaign": "t", "op": "axpy", "repo": str(ext), "kernel_source": ["vecadd/kernel.py", "vecadd/tuning.py"],
            "benchmark_command": "python bench.py {csv}", "proposer": "search"}
    with pytest.raises(UserError, match="names it as tuned_table"):
        SearchProposer().check(parse_manifest(data, "m.yaml"))
    manifest = parse_manifest(data | {"tuned_table": "vecadd/tuning.py"}, "m.yaml")
    SearchProposer().check(manifest)
    with pytest.raises(UserError, match="one-knob walk"):
        SearchProposer("halving").check(manifest)
    with pytest.raises(UserError, match="must be one of kernel_source"):
        parse_manifest(data | {"tuned_table": "bench.py"}, "m.yaml")
    shapes = (parse_manifest(data | {"shapes": [{"label": "n384", "N": 384}]}, "m.yaml").shapes[0],)
    context = RoundContext(campaign="t", number=2, root=ext, round_dir=tmp_path, manifest=manifest, shapes=shapes,
                           analyses=(), history=(), tips=(), after_stagnation=False, request_md=tmp_path / "r.md",
                           request_json=tmp_path / "r.json", children=ChildRegistry(tmp_path / "children.json"))
    outcome = SearchProposer().propose(context)
    assert isinstance(outcome, Proposed) and outcome.proposal.params["file"] == "vecadd/tuning.py"
    _, table = read_tuning(ext / "vecadd" / "tuning.py")
    knob, new = outcome.proposal.params["knob"], outcome.proposal.params["new"]
    assert table["vector"][knob] == new != {"BLOCK_N": 128, "num_warps": 4}[knob]


def test_a_manual_campaign_on_an_external_repo_takes_a_submit_from_the_targets_checkout(tmp_path):
    """The handoff works from the target's checkout: the request names TURBO_OPT_HOME, and `turbo-opt
    submit` run there with it finds the campaign and judges the edit made there."""
    home = clone_worktree(tmp_path / "home")
    ext = make_external_repo(tmp_path / "ext")
    manifest = {"campaign": "hand", "op": "axpy", "repo": str(ext), "kernel_source": ["vecadd/kernel.py"],
                "test_command": "python -m pytest -q tests", "benchmark_command": "python bench.py {csv}",
                "max_iterations": 1, "proposer": "manual"}
    (tmp_path / "hand.yaml").write_text(yaml.safe_dump(manifest))
    start(home, tmp_path / "hand.yaml")
    request = (home / "campaigns/runs/hand/rounds/round-2/request.md").read_text()
    assert f"TURBO_OPT_HOME={home} turbo-opt submit hand" in request
    kernel = ext / "vecadd" / "kernel.py"
    kernel.write_text(kernel.read_text().replace("alpha * x + y, mask", "alpha * x + y + 0.5, mask"))
    submitted = subprocess.run(["turbo-opt", "submit", "hand", "--hypothesis", "a wrong kernel", "--json"], cwd=ext,
                               env=os.environ | {"TURBO_OPT_HOME": str(home)}, capture_output=True, text=True,
                               timeout=600)
    assert submitted.returncode == 0, submitted.stdout[-2000:] + submitted.stderr[-2000:]
    decision = json.loads(submitted.stdout)["decision"]
    assert decision["status"] == "ROLLBACK" and decision["reason"].startswith("focused test failed"), decision
    assert "+ 0.5" not in kernel.read_text() and git.Repo(ext).active_branch.name == "optimize/hand"
    assert_untouched(home)


@pytest.mark.parametrize("change, message", [
    ({"benchmark_command": "exit 3 # {csv}"}, "benchmark exited 3"),
    ({"benchmark_command": "true # {csv}"}, "wrote no CSV"),
    ({"rebuild_command": "echo compiler says no; exit 2"}, "rebuild exited 2: compiler says no"),
    ({"benchmark_command": "printf 'label,x\\nn,1\\n' > {csv}"}, "the benchmark's CSV"),
])
def test_a_target_benchmark_that_produces_nothing_usable_is_a_bench_error(tmp_path, change, message):
    from agent.bench import BenchError, BenchRequest
    from agent.processes import ChildRegistry
    from agent.target import measure
    from harness.meta import harness_hash

    ext = make_external_repo(tmp_path / "ext")
    manifest = parse_manifest({"campaign": "t", "op": "axpy", "repo": str(ext), "kernel_source": ["vecadd/kernel.py"],
                               "benchmark_command": "python bench.py {csv}"} | change, "m.yaml")
    request = BenchRequest(tmp_path / "shapes.yaml", tmp_path / "out.csv", tmp_path / "bench.log")
    with pytest.raises(BenchError, match=message):
        measure(manifest, ext, request, home=REPO_ROOT, expected_harness=harness_hash(), device="cpu",
                registry=ChildRegistry(tmp_path / "children.json"))
