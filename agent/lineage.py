"""Lineage: the campaign's git history (gitpython). Accepted rounds are commits on the campaign
branch; a rollback restores the mutable files from the best commit. Nothing outside the mutable
files is ever staged, and no other branch is touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import git

from harness.errors import UserError


class Lineage:
    def __init__(self, root: Path) -> None:
        try:
            self.repo = git.Repo(root)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise UserError(f"{root} is not a git checkout: a campaign needs git to keep its lineage") from None
        self.root = Path(self.repo.working_tree_dir)

    def dirty_paths(self) -> list[str]:
        changed = [d.a_path for d in self.repo.index.diff(None)] + [d.a_path for d in self.repo.index.diff("HEAD")]
        return sorted(set(changed) | set(self.repo.untracked_files))

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

    def checkout_branch(self, name: str, start: str) -> None:
        """Create `name` at `start` (or reuse it if it already points into this campaign) and check it out."""
        if name in self.repo.heads:
            branch = self.repo.heads[name]
            if not self.repo.is_ancestor(start, branch.commit):
                raise UserError(f"branch {name} exists and does not descend from {start[:10]}: pick another name")
        else:
            branch = self.repo.create_head(name, start)
        branch.checkout()

    def diff(self, paths: Sequence[str] = ()) -> str:
        """The working tree's changes (to `paths`, or all tracked files) against HEAD, as a patch."""
        return self.repo.git.diff("HEAD", "--", *paths)

    def restore(self, commit: str, paths: Sequence[str]) -> None:
        """Put `paths` back exactly as they are in `commit` (a rollback)."""
        self.repo.git.checkout(commit, "--", *paths)

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
            self.repo.git.apply("--whitespace=nowarn", str(patch_file))

    def commit(self, paths: Sequence[str], message: str) -> str:
        self.repo.index.add(list(paths))
        return self.repo.index.commit(message).hexsha
