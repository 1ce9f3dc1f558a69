"""SCREEN on a throwaway repo: every way a candidate can step outside its scope or move the history is
refused for its own reason, and the tree goes back exactly to the best commit; no GPU, no benchmark."""

from pathlib import Path

import git
import pytest

from agent.lineage import Lineage
from agent.screening import capture, screen
from agent.state import Proposal

MUTABLE = ["kernels/op/kernel.py"]
PROTECTED = "campaigns/runs/c/manifest.yaml"


@pytest.fixture
def repo(tmp_path: Path) -> git.Repo:
    (tmp_path / "kernels" / "op").mkdir(parents=True)
    (tmp_path / "kernels" / "op" / "kernel.py").write_text("def f(x):\n    return x + 1\n")
    (tmp_path / "harness.py").write_text("THRESHOLD = 40\n")
    (tmp_path / ".gitignore").write_text("campaigns/runs/\n")
    r = git.Repo.init(tmp_path, initial_branch="optimize/c")
    r.git.add(A=True)
    r.git.commit("-m", "best", "--author", "t <t@t>")
    (tmp_path / "campaigns" / "runs" / "c").mkdir(parents=True)
    (tmp_path / PROTECTED).write_text("op: op\n")
    return r


def judge(r: git.Repo, best: str) -> tuple[str | None, str]:
    """Capture what the tree holds, put it back at the best commit as the runner does, and screen it."""
    root = Path(r.working_tree_dir)
    lineage = Lineage(root)
    diff = root / "campaigns" / "runs" / "c" / "candidate.diff"
    candidate = capture(lineage, Proposal(hypothesis="h", summary="s"), "manual", branch="optimize/c", best=best,
                        stash=None, diff_path=diff, protected={PROTECTED: "op: op\n"})
    lineage.restore_exactly("optimize/c", best)
    (root / PROTECTED).write_text("op: op\n")
    verdict = screen(lineage, candidate, MUTABLE, diff)
    if verdict is not None:
        lineage.restore_exactly("optimize/c", best)
    assert r.head.commit.hexsha == best and r.active_branch.name == "optimize/c"
    return (verdict.status, verdict.reason) if verdict else (None, diff.read_text())


def edit(r: git.Repo, path: str, text: str) -> None:
    (Path(r.working_tree_dir) / path).write_text(text)


def test_an_edit_of_a_mutable_file_goes_on_to_validation_with_its_diff(repo):
    edit(repo, MUTABLE[0], "def f(x):\n    return x + 2\n")
    status, diff = judge(repo, repo.head.commit.hexsha)
    assert status is None and "+    return x + 2" in diff
    assert "x + 2" in (Path(repo.working_tree_dir) / MUTABLE[0]).read_text()  # applied for VALIDATE


@pytest.mark.parametrize(
    ("act", "status", "reason"),
    [
        (lambda r: edit(r, "harness.py", "THRESHOLD = 0\n"), "ROLLBACK", "write scope: touched harness.py"),
        (lambda r: edit(r, PROTECTED, "op: op\nmax_iterations: 100\n"), "ROLLBACK",
         f"write scope: touched {PROTECTED}"),
        (lambda r: edit(r, "kernels/op/helper.py", "X = 1\n"), "ROLLBACK",
         "write scope: new untracked files kernels/op/helper.py"),
        (lambda r: None, "ERROR", "the candidate changed nothing"),
        (lambda r: edit(r, MUTABLE[0], "def f(x:\n"), "ERROR", "does not compile: kernels/op/kernel.py:1"),
        (lambda r: edit(r, MUTABLE[0], "def f(x):\n    return id(x)\n"), "ROLLBACK", "audit: kernels/op/kernel.py:2"),
    ],
    ids=["harness", "manifest", "untracked", "nothing", "syntax", "audit"],
)
def test_a_candidate_out_of_bounds_is_refused_for_its_reason_and_undone(repo, act, status, reason):
    best = repo.head.commit.hexsha
    act(repo)
    got_status, got_reason = judge(repo, best)
    assert got_status == status and got_reason.startswith(reason), got_reason
    root = Path(repo.working_tree_dir)
    assert not repo.is_dirty(untracked_files=True) and (root / PROTECTED).read_text() == "op: op\n"


def _commit(r: git.Repo) -> None:
    edit(r, MUTABLE[0], "def f(x):\n    return x + 3\n")
    r.git.commit("-am", "agent", "--author", "a <a@a>")


def _switch(r: git.Repo) -> None:
    r.git.checkout("-b", "elsewhere")


def _reset(r: git.Repo) -> None:
    _commit(r)
    r.git.branch("-f", "keep", "HEAD")
    r.git.reset("--hard", "HEAD~1")
    r.git.checkout("keep")


def _stash(r: git.Repo) -> None:
    edit(r, MUTABLE[0], "def f(x):\n    return x + 4\n")
    r.git.stash()


@pytest.mark.parametrize(
    ("act", "reason"),
    [(_commit, "committed on top of the best commit"), (_switch, "switched from branch optimize/c to elsewhere"),
     (_reset, "switched from branch"), (_stash, "stashed or popped changes")],
    ids=["commit", "switch", "reset", "stash"],
)
def test_a_candidate_that_moves_the_history_is_an_error_and_the_branch_is_put_back(repo, act, reason):
    best = repo.head.commit.hexsha
    act(repo)
    status, got = judge(repo, best)
    assert status == "ERROR" and reason in got, got
    assert repo.heads["optimize/c"].commit.hexsha == best and not repo.is_dirty(untracked_files=True)
