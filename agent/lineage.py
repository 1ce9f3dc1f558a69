"""Lineage: the campaign's git history (gitpython). Accepted rounds are commits on the campaign
branch; a rollback puts the tree back at the best commit. Nothing outside the mutable files is ever
staged, and no other branch is touched. A candidate that moved the history itself (a commit, a
reset, a branch switch, a stash) is noticed here and undone.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import git

from harness.errors import UserError


def repo_root() -> Path:
    """turbo-opt's checkout that holds the campaigns: $TURBO_OPT_HOME if set (an agent working in an external
    target's checkout is given it), else the git checkout the command runs in."""
    if os.environ.get("TURBO_OPT_HOME"):
        return Path(os.environ["TURBO_OPT_HOME"]).resolve()
    try:
        return Path(git.Repo(Path.cwd(), search_parent_directories=True).working_tree_dir)
    except git.InvalidGitRepositoryError:
        raise UserError(f"{Path.cwd()} is not inside a git checkout") from None


class Lineage:
    def __init__(self, root: Path) -> None:
        try:
            self.repo = git.Repo(root)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise UserError(f"{root} is not a git checkout: a campaign needs git to keep its lineage") from None
        self.root = Path(self.repo.working_tree_dir)

    def dirty_paths(self) -> list[str]:
        """Tracked files changed against HEAD (staged or not) and untracked files git does not ignore."""
        changed = [d.a_path for d in self.repo.index.diff(None)] + [d.a_path for d in self.repo.index.diff("HEAD")]
        return sorted(set(changed) | set(self.repo.untracked_files))

    def untracked(self) -> list[str]:
        return sorted(self.repo.untracked_files)

    def ensure_clean(self) -> None:
        if not self.repo.head.is_valid():
            raise UserError("the repository has no commit yet: commit the tree before starting a campaign")
        dirty = self.dirty_paths()
        if dirty:
            shown = ", ".join(dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
            raise UserError(f"the working tree is not clean ({shown}): commit or stash before starting a campaign")

    def head(self) -> str:
        return self.repo.head.commit.hexsha

    def head_message(self) -> str:
        return self.repo.head.commit.message

    def branch(self) -> str | None:
        """The checked-out branch, or None on a detached HEAD."""
        return None if self.repo.head.is_detached else self.repo.active_branch.name

    def stash(self) -> str | None:
        """The newest stash entry's commit, or None: a change means someone stashed or popped."""
        try:
            return self.repo.git.rev_parse("--verify", "--quiet", "refs/stash")
        except git.GitCommandError:
            return None

    def checkout_branch(self, name: str, start: str) -> None:
        """Create `name` at `start` (or reuse it if it already points into this campaign) and check it out."""
        if name in self.repo.heads:
            branch = self.repo.heads[name]
            if not self.repo.is_ancestor(start, branch.commit):
                raise UserError(f"branch {name} exists and does not descend from {start[:10]}: pick another name")
        else:
            branch = self.repo.create_head(name, start)
        branch.checkout()

    def lineage_problem(self, branch: str, best: str, stash: str | None) -> str | None:
        """How the history differs from where the runner left it (on `branch` at `best`), in words."""
        current = self.branch()
        if current != branch:
            return f"switched from branch {branch} to {current or 'a detached HEAD'}"
        if self.head() != best:
            moved = "committed on top of" if self.repo.is_ancestor(best, self.head()) else "reset"
            return f"{moved} the best commit {best[:10]} (HEAD is now {self.head()[:10]})"
        if self.stash() != stash:
            return "stashed or popped changes (git stash)"
        return None

    def diff_from(self, commit: str) -> str:
        """The working tree's tracked changes against `commit`, as a patch (committed changes included)."""
        return self.repo.git.diff(commit, "--binary")

    def changed_from(self, commit: str) -> list[str]:
        return sorted(set(self.repo.git.diff(commit, "--name-only").split()))

    def restore(self, commit: str, paths: Sequence[str]) -> None:
        """Put `paths` back exactly as they are in `commit` (index and working tree)."""
        self.repo.git.checkout(commit, "--", *paths)

    def restore_exactly(self, branch: str, commit: str) -> None:
        """The tree exactly at `commit` on `branch`: the branch moved back if something moved it, tracked
        files restored, untracked files removed (ignored ones, such as the campaign dir, are kept)."""
        if self.branch() != branch:
            self.repo.git.checkout("-f", branch)
        if self.head() != commit:
            self.repo.head.reset(commit, index=True, working_tree=True)
        self.discard_changes(commit)

    def discard_changes(self, commit: str) -> None:
        """Undo every change in the working tree against `commit` (tracked files restored, new files
        removed; ignored files such as the campaign dir are kept): a candidate's leftovers."""
        tracked = set(self.repo.git.ls_tree("-r", "--name-only", commit).splitlines())
        for path in self.dirty_paths():
            if path in tracked:
                self.repo.git.checkout(commit, "--", path)
            else:
                (self.root / path).unlink(missing_ok=True)

    def apply(self, patch_file: Path) -> None:
        if patch_file.read_text().strip():
            self.repo.git.apply("--whitespace=nowarn", "--binary", str(patch_file))

    def show(self, commit: str, path: str) -> str:
        """The text of `path` at `commit` ("" where it does not exist)."""
        try:
            return self.repo.git.show(f"{commit}:{path}", strip_newline_in_stdout=False)
        except git.GitCommandError:
            return ""

    def switch(self, branch_or_commit: str) -> None:
        self.repo.git.checkout(branch_or_commit)

    def add_worktree(self, path: Path, commit: str) -> None:
        """A new checkout of `commit` at `path` sharing this repository (its branches and commits)."""
        self.repo.git.worktree("add", "--detach", str(path), commit)

    def remove_worktree(self, path: Path) -> None:
        self.repo.git.worktree("remove", "--force", str(path))

    def keep_as_ref(self, branch: str, ref: str) -> None:
        """Keep `branch`'s commits under `ref` (outside refs/heads: no branch of the user's) and delete it."""
        self.repo.git.update_ref(ref, self.repo.heads[branch].commit.hexsha)
        self.repo.delete_head(branch, force=True)

    def commit(self, paths: Sequence[str], message: str) -> str:
        self.repo.index.add(list(paths))
        return self.repo.index.commit(message).hexsha
