"""Growth of the knowledge base: `turbo-opt learn` merges a finished campaign's verified tips and findings
into knowledge/, the next campaign reads them, and a campaign whose gains did not reproduce is refused."""

from __future__ import annotations

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from agent.cli import app
from agent.knowledge import TipFile, check_knowledge
from agent.learn import LEARNED_SECTION, learn
from agent.runner import Campaign
from harness.errors import UserError
from tests.clones import clone_worktree
from tests.test_campaign import EXPECTED, FakeMeasurer, manifest


def finished(root, name, **measurer):
    campaign = Campaign.create(root, manifest(name), measurer=FakeMeasurer(root, **measurer),
                               console=Console(quiet=True))
    campaign.run()
    return campaign


def test_learn_merges_verified_tips_and_the_next_campaign_reads_them(tmp_path, monkeypatch):
    root = clone_worktree(tmp_path / "clone")
    first = finished(root, "first")
    assert first.state.reproduced, first.state.reproduction
    monkeypatch.chdir(root)
    result = CliRunner().invoke(app, ["learn", "first"])
    assert result.exit_code == 0 and "4 tip(s) into" in result.output, result.output
    tips = TipFile.model_validate(yaml.safe_load((root / "knowledge/tips/gemm.yaml").read_text())).tips
    learned = [t for t in tips if t.campaign == "first"]
    assert [(t.outcome, t.params["knob"], t.params["new"]) for t in learned] == EXPECTED
    directions = (root / "knowledge/ops/gemm/optimization-directions.md").read_text()
    assert LEARNED_SECTION in directions and "ACCEPT small BLOCK_M 64 -> 128: +10.00% step geomean" in directions
    assert check_knowledge(root) == []  # what learn writes is valid knowledge
    assert CliRunner().invoke(app, ["learn", "first"]).output.startswith("nothing new from first")

    # The next campaign starts from the tuned table as committed (learn writes, the user commits).
    git_root = first.lineage.repo
    git_root.git.checkout(first.state.start_commit)
    git_root.git.checkout("-b", "learned")
    git_root.git.add("knowledge")
    git_root.git.commit("-m", "learned from campaign first", "--author", "t <t@t>")
    second = Campaign.create(root, manifest("second", max_iterations=1), measurer=FakeMeasurer(root),
                             console=Console(quiet=True))
    second.run()
    (record,) = second.state.optimization_rounds()
    tried = {(r.candidate.params["knob"], r.candidate.params["new"]) for r in first.state.optimization_rounds()
             if r.status == "ROLLBACK"}
    assert (record.candidate.params["knob"], record.candidate.params["new"]) not in tried
    request = (second.round_dir(2) / "request.md").read_text()
    assert "Tips of this op, device and variant" in request and "small GROUP_M 8 -> 4" in request


def test_learn_takes_a_campaign_started_again_under_the_same_name(tmp_path):
    root = clone_worktree(tmp_path / "clone")
    campaign = finished(root, "again")
    assert len(learn(root, "again").new_tips) == 4
    # Its run directory removed and the campaign started again: the same round paths, other changes.
    tips_path = campaign.run_dir / "tips.yaml"
    rerun = yaml.safe_load(tips_path.read_text())
    rerun["tips"][0]["summary"] = "small num_warps 4 -> 8"
    tips_path.write_text(yaml.safe_dump(rerun))
    assert [t.summary for t in learn(root, "again").new_tips] == ["small num_warps 4 -> 8"]
    assert learn(root, "again").new_tips == []


def test_learn_refuses_a_campaign_whose_gains_did_not_reproduce(tmp_path):
    root = clone_worktree(tmp_path / "clone")
    campaign = finished(root, "lucky", final_slowdown=0.8)
    assert campaign.state.reproduced is False
    with pytest.raises(UserError, match=r"^campaign lucky did not reproduce its gains in the final bench: the "):
        learn(root, "lucky")
    assert not (root / "knowledge/tips/gemm.yaml").read_text().count("lucky")


def test_learn_refuses_a_campaign_that_is_not_done(tmp_path):
    root = clone_worktree(tmp_path / "clone")
    Campaign.create(root, manifest("open"), measurer=FakeMeasurer(root), console=Console(quiet=True))
    with pytest.raises(UserError, match="campaign open is not done"):
        learn(root, "open")
