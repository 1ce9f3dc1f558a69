"""The handoff through the real CLI, in a throwaway clone, under the interpreter: a `manual` campaign on
gemm smoke shapes that an agent (here: this test) drives with `turbo-opt submit`, including the ways an
agent can step out of bounds, a kill -9 in the middle of a submit, and `finish`."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import git

from agent.decision import DecisionRecord
from agent.request import Request
from agent.state import load_state
from tests.adversarial.cheats import CHEATS
from tests.clones import clone_worktree
from tests.test_processes import alive, wait_dead

TUNING = "kernels/gemm/tuning.py"
NAME = "hand"


def cli(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["turbo-opt", *args], cwd=root, capture_output=True, text=True, timeout=900)
    if check:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def submit(root: Path, summary: str) -> DecisionRecord:
    out = json.loads(cli(root, "submit", NAME, "--hypothesis", f"test: {summary}", "--summary", summary,
                         "--json").stdout)
    return DecisionRecord.model_validate(out["decision"])


def retune(root: Path, old: str, new: str) -> None:
    path = root / TUNING
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def run_dir(root: Path) -> Path:
    return root / "campaigns" / "runs" / NAME


def test_a_manual_campaign_driven_through_the_cli(tmp_path):
    root = clone_worktree(tmp_path / "clone")
    repo = git.Repo(root)
    cli(root, "start", "--op", "gemm", "--shapes", "smoke", "--proposer", "manual", "--name", NAME,
        "--max-iterations", "8", "--repeats", "1")
    status = json.loads(cli(root, "status", NAME, "--json").stdout)
    assert status["phase"] == "AWAITING_CANDIDATE" and status["expected_actor"] == "agent"
    request = Request.model_validate_json(cli(root, "request", NAME, "--json").stdout)
    assert request.round == 2 and request.mutable_files == ["kernels/gemm/kernel.py", TUNING]
    assert (run_dir(root) / "rounds/round-2/request.md").read_text().startswith("# Round 2 of campaign hand")

    # An honest edit: judged on its numbers (the interpreter's timings decide which way), with a decision.json.
    retune(root, '"BLOCK_K": 32, "GROUP_M": 8', '"BLOCK_K": 64, "GROUP_M": 8')
    honest = submit(root, "small BLOCK_K 32 -> 64")
    assert honest.round == 2 and honest.status in ("ACCEPT", "ROLLBACK") and honest.measurements, honest.reason
    assert (run_dir(root) / "rounds/round-2/decision.json").exists()
    best = load_state(run_dir(root) / "state.json").best_commit

    # A harness edit is refused and undone.
    (root / "harness/snr.py").write_text((root / "harness/snr.py").read_text() + "\nTHRESHOLD_OVERRIDE = 0\n")
    scope = submit(root, "loosen the referee")
    assert scope.status == "ROLLBACK" and scope.reason.startswith("write scope: touched harness/snr.py")
    assert not repo.is_dirty(untracked_files=True)

    # An agent that commits its own change: an ERROR round, the branch put back at the best commit.
    retune(root, '"num_warps": 4, "num_stages": 3}', '"num_warps": 4, "num_stages": 2}')
    repo.git.commit("-qam", "agent commits", "--author", "agent <a@a>")
    committed = submit(root, "commits by itself")
    assert committed.status == "ERROR" and "committed on top of the best commit" in committed.reason
    assert repo.head.commit.hexsha == best and repo.active_branch.name == f"optimize/{NAME}"

    # A cheat from tests/adversarial is rolled back for its own reason.
    cheat = next(c for c in CHEATS if c.name == "id-keyed output cache")
    cheat.apply(root)
    caught = submit(root, cheat.name)
    assert caught.status == cheat.status and cheat.reason in caught.reason, caught.reason

    # kill -9 during a submit: the benchmark dies with it; resume finishes that round, once. (A candidate
    # that FAILs, decided on one measurement: a timing verdict could re-measure it three times more.)
    wrong = next(c for c in CHEATS if c.name == "zeros for small M")
    wrong.apply(root)
    number = load_state(run_dir(root) / "state.json").round
    proc = subprocess.Popen(["turbo-opt", "submit", NAME, "--hypothesis", "killed mid-way", "--summary", wrong.name],
                            cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children = run_dir(root) / "children.json"
    deadline = time.monotonic() + 300
    while not (children.exists() and json.loads(children.read_text() or "[]")):
        assert proc.poll() is None and time.monotonic() < deadline, "the submit never started a benchmark"
        time.sleep(0.1)
    bench = json.loads(children.read_text())[0]["pid"]
    proc.kill()
    proc.wait()
    assert wait_dead(bench), "the benchmark outlived its killed runner"
    assert load_state(run_dir(root) / "state.json").phase in ("SCREEN", "VALIDATE", "DECIDE")
    cli(root, "resume", NAME)
    state = load_state(run_dir(root) / "state.json")
    (record,) = [r for r in state.rounds if r.number == number]
    assert record.status == wrong.status and wrong.reason in record.reason, record.reason
    assert state.phase == "AWAITING_CANDIDATE" and state.round == number + 1
    assert (run_dir(root) / f"rounds/round-{number}/decision.json").exists()
    assert (run_dir(root) / "logs/optimize.md").read_text().count(f"## Round {number}:") == 1
    assert json.loads(children.read_text()) == [] and not alive(bench)

    # finish: the best measured on every shape, a report, a clean tree on the campaign branch.
    cli(root, "finish", NAME)
    state = load_state(run_dir(root) / "state.json")
    assert state.phase == "DONE" and state.stop_reason == "finished by the user"
    report = (run_dir(root) / "report.md").read_text()
    assert "## Termination check" in report and "## Rounds" in report
    assert not repo.is_dirty(untracked_files=True) and repo.head.commit.hexsha == state.best_commit


def test_submit_and_finish_refuse_what_they_cannot_do(tmp_path):
    root = clone_worktree(tmp_path / "clone")
    missing = cli(root, "submit", "nope", "--hypothesis", "h", check=False)
    assert missing.returncode == 2 and missing.stderr.startswith("error: no campaign 'nope'")
    bad = cli(root, "start", "--op", "gemm", "--proposer", "robot", check=False)
    assert bad.returncode == 2 and "field 'proposer'" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
