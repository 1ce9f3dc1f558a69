"""Every cheat goes through a real campaign round (VALIDATE in a subprocess, under the interpreter)
in a fresh clone, and must be rejected for its own reason; the honest change must be accepted (its
round run again while only interpreter timing noise stands in its way)."""

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


# Verdicts on timing alone (agent/scoring.py), as opposed to a cheat check firing.
TIMING_VERDICTS = ("regressed", "slower than the best", "overfit", "not reproducible", "ineffective")


@pytest.mark.parametrize("cheat", CHEATS, ids=lambda c: c.name)
def test_each_cheat_is_rejected_for_its_own_reason(tmp_path, cheat):
    campaign = run_round(tmp_path, [cheat])
    (record,) = campaign.state.optimization_rounds()
    assert record.status == cheat.status, record.reason
    assert cheat.reason in record.reason, record.reason
    repo = git.Repo(campaign.root)
    assert not repo.is_dirty(untracked_files=True)  # whatever the candidate touched is gone
    assert repo.head.commit.hexsha == campaign.state.best_commit


def test_the_honest_change_is_accepted(tmp_path):
    """Interpreter timings on a small shared CPU swing by up to 2x for seconds at a time, which can
    outvote a 1.4x change even with the best re-measured next to it. So the round is run again (up to
    three times, each in a fresh clone), as long as only a timing verdict stood in its way; a cheat
    check firing on the honest change fails at once. (Timing CPU time instead is no cure: BLAS worker
    threads spin after each call and inflate it up to 2x.)"""
    reasons = []
    for attempt in range(3):
        campaign = run_round(tmp_path / f"attempt{attempt}", [HONEST])
        (record,) = campaign.state.optimization_rounds()
        if record.status == "ACCEPT":
            break
        assert any(verdict in record.reason for verdict in TIMING_VERDICTS), record.reason
        reasons.append(record.reason)
    assert record.status == "ACCEPT", reasons
    assert HONEST.reason in record.reason, record.reason
    assert git.Repo(campaign.root).head.commit.hexsha == campaign.state.best_commit


def test_a_hang_and_a_crash_end_as_error_rounds_and_the_campaign_goes_on(tmp_path):
    campaign = run_round(tmp_path, [HANG, CRASH, HONEST], compile_timeout_s=60, run_timeout_s=30)
    statuses = [(r.status, r.reason) for r in campaign.state.optimization_rounds()]
    # The third round is measured and decided like any other (its verdict on timing is
    # test_the_honest_change_is_accepted's business): the point here is that it runs at all.
    assert [s for s, _ in statuses[:2]] == ["ERROR", "ERROR"] and statuses[2][0] in ("ACCEPT", "ROLLBACK"), statuses
    assert HANG.reason in statuses[0][1] and CRASH.reason in statuses[1][1]
    assert campaign.state.phase == "DONE"
