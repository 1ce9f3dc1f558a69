"""Every cheat goes through a real campaign round (VALIDATE in a subprocess, under the interpreter)
in a fresh clone, and must be rejected for its own reason; the honest change must be accepted."""

from __future__ import annotations

import subprocess
from pathlib import Path

import git
import pytest
import yaml
from rich.console import Console

from agent.manifest import parse_manifest
from agent.proposers import Proposal, ProposalContext
from agent.runner import Campaign
from harness.files import REPO_ROOT
from tests.adversarial.cheats import CHEATS, CRASH, HANG, HONEST, Candidate

SHAPE_FILES = {
    "uniform.yaml": [{"label": f"u{i}", "B": 4, "M": 32, "N": 40 + 8 * i, "K": 24, "group_lens": [32] * 4}
                     for i in range(3)],
    "square.yaml": [{"label": f"square-{n}", "B": 1, "M": n, "N": n, "K": n} for n in (112, 128)],
}


class ScriptedProposer:
    """Proposes the given patches, one per round, then nothing."""

    def __init__(self, patches: list[Candidate]) -> None:
        self.patches = list(patches)

    def propose(self, context: ProposalContext) -> Proposal | None:
        if not self.patches:
            return None
        return Proposal(hypothesis=self.patches[0].name, change=None, expected_gain_pct=5.0,
                        description=self.patches[0].name)

    def apply(self, proposal: Proposal, root: Path) -> None:
        self.patches.pop(0).apply(root)


@pytest.fixture(scope="module")
def origin(tmp_path_factory) -> Path:
    return REPO_ROOT


def run_round(tmp_path: Path, patches: list[Candidate], **manifest_fields) -> Campaign:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(clone)], check=True)
    for name, shapes in SHAPE_FILES.items():
        (clone / name).write_text(yaml.safe_dump(shapes))
    repo = git.Repo(clone)
    repo.git.add(*SHAPE_FILES)
    repo.git.commit("-m", "shape files", "--author", "t <t@t>")
    fields = {"campaign": "adv", "op": patches[0].op, "shapes": patches[0].shapes, "max_iterations": len(patches),
              "repeats": 2} | manifest_fields
    campaign = Campaign.create(clone, parse_manifest(fields, "test"), console=Console(quiet=True),
                               proposer=ScriptedProposer(patches))
    campaign.run()
    return campaign


@pytest.mark.parametrize("cheat", [*CHEATS, HONEST], ids=lambda c: c.name)
def test_each_candidate_gets_its_verdict_for_the_right_reason(tmp_path, cheat):
    campaign = run_round(tmp_path, [cheat])
    (record,) = campaign.state.optimization_rounds()
    assert record.status == cheat.status, record.reason
    assert cheat.reason in record.reason, record.reason
    repo = git.Repo(campaign.root)
    assert not repo.is_dirty(untracked_files=True)  # whatever the candidate touched is gone
    assert repo.head.commit.hexsha == campaign.state.best_commit


def test_a_hang_and_a_crash_end_as_error_rounds_and_the_campaign_goes_on(tmp_path):
    campaign = run_round(tmp_path, [HANG, CRASH, HONEST], compile_timeout_s=60, run_timeout_s=30)
    statuses = [(r.status, r.reason) for r in campaign.state.optimization_rounds()]
    # The third round is measured and decided like any other (its verdict on timing is the honest
    # candidate's test above): the point here is that it runs at all.
    assert [s for s, _ in statuses[:2]] == ["ERROR", "ERROR"] and statuses[2][0] in ("ACCEPT", "ROLLBACK"), statuses
    assert HANG.reason in statuses[0][1] and CRASH.reason in statuses[1][1]
    assert campaign.state.phase == "DONE"
