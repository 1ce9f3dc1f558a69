"""SCREEN: what a candidate is judged on before it ever runs.

`capture` reads the working tree a proposer left (read-only, so a kill at any moment loses nothing):
the diff against the best commit, the paths it changed, new untracked files, and whether it moved the
git history. `screen` then judges that record on a tree put back at the best commit plus the diff:
history moved -> ERROR; untracked files or paths outside the mutable files -> ROLLBACK (and all of
it is undone); nothing changed -> ERROR; a file that does not compile -> ERROR; an audit finding ->
ROLLBACK. Whatever the verdict, the candidate's whole diff stays in the round's candidate.diff.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import git

from agent.audit import new_findings, write_scope
from agent.lineage import Lineage
from agent.state import Candidate, Proposal, RoundStatus
from harness.files import atomic_write_text


@dataclass(frozen=True)
class Verdict:
    status: RoundStatus
    reason: str


def capture(lineage: Lineage, proposal: Proposal, proposer: str, *, branch: str, best: str, stash: str | None,
            diff_path: Path, protected: dict[str, str]) -> Candidate:
    """Record the candidate the working tree holds, and write its diff (against the best commit) to `diff_path`.

    `protected` maps paths outside git's view (the campaign's own files) to the text the runner wrote:
    a candidate that edited one of them has touched a path outside its scope.
    """
    tampered = [path for path, text in protected.items()
                if not (lineage.root / path).exists() or (lineage.root / path).read_text() != text]
    atomic_write_text(diff_path, lineage.diff_from(best) + "\n")
    return Candidate(**proposal.model_dump(), proposer=proposer,
                     changed=sorted(set(lineage.changed_from(best)) | set(tampered)), untracked=lineage.untracked(),
                     lineage_problem=lineage.lineage_problem(branch, best, stash))


def screen(lineage: Lineage, candidate: Candidate, mutable: list[str], diff_path: Path,
           packages: frozenset[str] = frozenset()) -> Verdict | None:
    """Judge a captured candidate; None: go on to VALIDATE, with the diff applied.

    The caller has put the tree back exactly at the best commit (and the protected files back); the
    diff is applied here once the paths are in scope, and on a verdict the caller puts the tree back.
    The audit charges the candidate with the findings it adds to the best commit's files; `packages`
    are the target's own packages, which its kernel files may import.
    """
    if candidate.lineage_problem:
        return Verdict("ERROR", f"git history: the candidate {candidate.lineage_problem}; the campaign branch, "
                                "the tree and HEAD were put back at the best commit")
    if candidate.untracked:
        return Verdict("ROLLBACK", f"write scope: new untracked files {', '.join(candidate.untracked[:5])} "
                                   "(a candidate may only edit the mutable files)")
    outside = write_scope(candidate.changed, mutable)
    if outside:
        return Verdict("ROLLBACK", f"write scope: touched {', '.join(outside)} (mutable: {', '.join(mutable)})")
    if not candidate.changed:
        return Verdict("ERROR", "the candidate changed nothing")
    try:
        lineage.apply(diff_path)
    except git.GitCommandError as exc:
        return Verdict("ERROR", f"the candidate's diff does not apply to the best commit: {exc.stderr.strip()[:200]}")
    sources = {path: (lineage.root / path).read_text() for path in candidate.changed
               if path.endswith(".py") and (lineage.root / path).exists()}
    for path, source in sources.items():
        try:
            with warnings.catch_warnings():  # a code base's own SyntaxWarnings are not the candidate's
                warnings.simplefilter("ignore", SyntaxWarning)
                compile(source, path, "exec")
        except SyntaxError as exc:
            return Verdict("ERROR", f"does not compile: {path}:{exc.lineno}: {exc.msg}")
    findings = [f for path, source in sources.items()
                for f in new_findings(path, lineage.show("HEAD", path), source, packages)]
    if findings:
        return Verdict("ROLLBACK", f"audit: {'; '.join(map(str, findings))}")
    return None
