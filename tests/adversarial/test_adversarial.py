"""Every cheat goes through real campaign rounds (SCREEN, then VALIDATE in a subprocess under the
interpreter, then DECIDE) in a throwaway clone, and must be rejected for the reason that names its
class; the honest change must be accepted. The held-out classes arrive by each route a candidate can
take: a proposer in the runner, `turbo-opt submit` (manual) and an agent command (command)."""

from __future__ import annotations

import json
from pathlib import Path

import git
import pytest
import yaml
from rich.console import Console

from agent.manifest import parse_manifest
from agent.proposers import Exhausted, Outcome, Proposed, Proposer, RoundContext
from agent.runner import Campaign
from agent.state import Proposal, RoundRecord
from tests.adversarial.cheats import CHEATS, CRASH, HANG, HELD_OUT_CLASSES, HELD_OUT_SHAPE_FILES, HONEST, Candidate
from tests.clones import clone_worktree

SHAPE_FILES = {
    "uniform.yaml": [{"label": f"u{i}", "B": 4, "M": 32, "N": 40 + 8 * i, "K": 24, "group_lens": [32] * 4}
                     for i in range(3)],
    "square.yaml": [{"label": f"square-{n}", "B": 1, "M": n, "N": n, "K": n} for n in (112, 128)],
    **HELD_OUT_SHAPE_FILES,
}


class ScriptedProposer(Proposer):
    """Proposes the given candidates, one per round, then nothing."""

    name = "scripted"

    def __init__(self, candidates: list[Candidate]) -> None:
        self.candidates = list(candidates)

    def propose(self, context: RoundContext) -> Outcome:
        if not self.candidates:
            return Exhausted("no candidate left")
        candidate = self.candidates.pop(0)
        candidate.apply(context.root)
        return Proposed(Proposal(hypothesis=candidate.name, summary=candidate.name, expected_gain_pct=5.0))


def clone(tmp_path: Path) -> Path:
    return clone_worktree(tmp_path / "clone", {name: yaml.safe_dump(shapes) for name, shapes in SHAPE_FILES.items()})


def manifest(candidates: list[Candidate], **fields: object):
    return parse_manifest({"campaign": "adv", "op": candidates[0].op, "shapes": candidates[0].shapes,
                           "max_iterations": len(candidates), "repeats": 2} | fields, "test")


def run_scripted(tmp_path: Path, candidates: list[Candidate], **fields: object) -> Campaign:
    campaign = Campaign.create(clone(tmp_path), manifest(candidates, **fields), console=Console(quiet=True),
                               proposer=ScriptedProposer(candidates))
    campaign.run()
    return campaign


def run_manual(tmp_path: Path, candidates: list[Candidate]) -> Campaign:
    """Each candidate edited into the checkout and handed in as `turbo-opt submit` does."""
    campaign = Campaign.create(clone(tmp_path), manifest(candidates, proposer="manual"), console=Console(quiet=True))
    campaign.run()
    for candidate in candidates:
        candidate.apply(campaign.root)
        campaign.submit(Proposal(hypothesis=candidate.name, summary=candidate.name))
    return campaign


def run_command(tmp_path: Path, candidates: list[Candidate]) -> Campaign:
    """Each candidate made by the scripted agent command, unattended."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({str(n): {"candidate": c.name} for n, c in enumerate(candidates, start=2)}))
    command = {"kind": "command", "run": f"python -m tests.scripted_agent {plan}", "timeout_min": 2}
    campaign = Campaign.create(clone(tmp_path), manifest(candidates, proposer=command), console=Console(quiet=True))
    campaign.run()
    return campaign


def assert_rejected_for_their_reasons(campaign: Campaign, candidates: list[Candidate]) -> None:
    rounds: list[RoundRecord] = campaign.state.optimization_rounds()
    verdicts = [(c.name, r.status, r.reason) for c, r in zip(candidates, rounds, strict=True)]
    wrong = [v for v, c in zip(verdicts, candidates, strict=True) if v[1] != c.status or c.reason not in v[2]]
    assert not wrong, wrong
    repo = git.Repo(campaign.root)
    assert not repo.is_dirty(untracked_files=True)  # whatever the candidates touched is gone
    assert repo.head.commit.hexsha == campaign.state.best_commit == campaign.state.start_commit


def by_campaign(candidates: list[Candidate]) -> dict[str, list[Candidate]]:
    """Candidates of one op and one shape file share a campaign: one baseline, a round each."""
    groups: dict[str, list[Candidate]] = {}
    for c in candidates:
        groups.setdefault(f"{c.op}-{c.shapes}", []).append(c)
    return groups


GROUPS = by_campaign([*CHEATS, *HELD_OUT_CLASSES])
DENSE_HELD_OUT = [c for c in HELD_OUT_CLASSES if c.op == "gemm"]


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_each_cheat_is_rejected_for_its_own_reason(tmp_path, group):
    candidates = GROUPS[group]
    assert_rejected_for_their_reasons(run_scripted(tmp_path, candidates), candidates)


@pytest.mark.parametrize("route", [run_manual, run_command], ids=["manual", "command"])
def test_held_out_cheats_are_rejected_whichever_route_they_arrive_by(tmp_path, route):
    assert_rejected_for_their_reasons(route(tmp_path, DENSE_HELD_OUT), DENSE_HELD_OUT)


# Verdicts on timing alone (agent/scoring.py), as opposed to a cheat check firing.
TIMING_VERDICTS = ("regressed", "slower than the best", "overfit", "not reproducible", "ineffective")


def test_the_honest_change_is_accepted(tmp_path):
    """Interpreter timings on a small shared CPU swing by up to 2x for seconds at a time, which can
    outvote a 1.4x change even with the best re-measured next to it. So the round is run again (up to
    three times, each in a fresh clone), as long as only a timing verdict stood in its way; a cheat
    check firing on the honest change fails at once. (Timing CPU time instead is no cure: BLAS worker
    threads spin after each call and inflate it up to 2x.)"""
    reasons = []
    for attempt in range(3):
        campaign = run_scripted(tmp_path / f"attempt{attempt}", [HONEST])
        (record,) = campaign.state.optimization_rounds()
        if record.status == "ACCEPT":
            break
        assert any(verdict in record.reason for verdict in TIMING_VERDICTS), record.reason
        reasons.append(record.reason)
    assert record.status == "ACCEPT", reasons
    assert HONEST.reason in record.reason, record.reason
    assert git.Repo(campaign.root).head.commit.hexsha == campaign.state.best_commit


def test_a_hang_and_a_crash_end_as_error_rounds_and_the_campaign_goes_on(tmp_path):
    campaign = run_scripted(tmp_path, [HANG, CRASH, HONEST], compile_timeout_s=20, run_timeout_s=15)
    statuses = [(r.status, r.reason) for r in campaign.state.optimization_rounds()]
    # The third round is measured and decided like any other (its verdict on timing is
    # test_the_honest_change_is_accepted's business): the point here is that it runs at all.
    assert [s for s, _ in statuses[:2]] == ["ERROR", "ERROR"] and statuses[2][0] in ("ACCEPT", "ROLLBACK"), statuses
    assert HANG.reason in statuses[0][1] and CRASH.reason in statuses[1][1]
    assert campaign.state.phase == "DONE"
