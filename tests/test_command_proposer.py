"""A `command` campaign through the real CLI, unattended, driven by a scripted agent
(tests/scripted_agent.py) in a throwaway clone under the interpreter: an agent that crashes, one that
hangs, one that writes no proposal, one that changes nothing, cheats, and an honest change, each
judged for its own reason while the campaign goes on to its report."""

from __future__ import annotations

import json
import subprocess

import git
import yaml

from agent.state import load_state
from tests.clones import clone_worktree
from tests.test_processes import wait_dead

PLAN = {
    "2": {"exit": 3},
    "3": {"sleep": 600},
    "4": {"candidate": "honest: deeper K tiles for small GEMMs", "proposal": False},
    "5": {"proposal_only": True},
    "6": {"candidate": "edits the harness"},
    "7": {"candidate": "id-keyed output cache"},
    "8": {"candidate": "zeros for small M"},
    "9": {"candidate": "honest: deeper K tiles for small GEMMs"},
}
EXPECTED = {
    2: ("ERROR", "agent command exited 3: scripted agent: simulated crash"),
    3: ("ERROR", "agent command timed out after 0.1 min (its process group was killed)"),
    4: ("ERROR", "agent command wrote no proposal.json"),
    5: ("ERROR", "the candidate changed nothing"),
    6: ("ROLLBACK", "write scope: touched harness/snr.py"),
    7: ("ROLLBACK", "audit: kernels/gemm/kernel.py"),
    8: ("ROLLBACK", "unannounced shape probe/"),  # zeros only for M < 100: the campaign's squares are larger
}


def test_a_command_campaign_runs_unattended_through_crashes_hangs_and_cheats(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    manifest = {"campaign": "cmd", "op": "gemm", "shapes": "square.yaml", "max_iterations": len(PLAN),
                "repeats": 2, "proposer": {"kind": "command", "run": f"python -m tests.scripted_agent {plan}",
                                           "timeout_min": 0.1}}
    squares = [{"label": f"square-{n}", "B": 1, "M": n, "N": n, "K": n} for n in (112, 128)]
    root = clone_worktree(tmp_path / "clone", {"square.yaml": yaml.safe_dump(squares),
                                               "cmd.yaml": yaml.safe_dump(manifest)})
    result = subprocess.run(["turbo-opt", "start", "--manifest", "cmd.yaml"], cwd=root, capture_output=True,
                            text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = root / "campaigns" / "runs" / "cmd"
    state = load_state(run / "state.json")
    verdicts = {r.number: (r.status, r.reason) for r in state.optimization_rounds()}
    for number, (status, reason) in EXPECTED.items():
        assert verdicts[number][0] == status and verdicts[number][1].startswith(reason), (number, verdicts[number])
    # The honest change: measured and decided on its numbers (interpreter timing decides which way).
    assert verdicts[9][0] in ("ACCEPT", "ROLLBACK") and state.current.measurements, verdicts[9]
    assert state.phase == "DONE" and state.stop_reason.startswith("max iterations")
    assert wait_dead(int((run / "rounds/round-3/sleeper.pid").read_text())), "the hung agent's child survived"
    assert "simulated crash" in (run / "rounds/round-2/agent.log").read_text()
    assert (run / "rounds/round-9/request.md").exists() and (run / "report.md").exists()
    repo = git.Repo(root)
    assert not repo.is_dirty(untracked_files=True) and repo.head.commit.hexsha == state.best_commit
