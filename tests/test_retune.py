"""The search proposer with an algorithm: a bucket retuned per round by trials, the winner proposed,
validated and decided by the runner like any candidate (fake trials and a fake measurer: no GPU)."""

import json
import math
import shutil

import pytest
from rich.console import Console

from agent.knowledge import Tip, shape_class
from agent.proposers import Exhausted, Failed, Proposed
from agent.proposers.search import SearchProposer
from agent.runner import Campaign
from agent.tuning_table import read_tuning
from harness.files import REPO_ROOT
from tests.test_campaign import FakeMeasurer, make_repo, manifest
from tests.test_search_proposer import closed, context, op_root

TWO_BUCKETS = ({"B": 1, "M": 128, "N": 128, "K": 128}, {"B": 1, "M": 4096, "N": 4096, "K": 4096})


def fake_speed(cfg) -> float:
    """BLOCK_M 128 and 3 stages are 10% faster each, GROUP_M 4 10% slower; nothing else matters."""
    return 100.0 * (1.1 if cfg["BLOCK_M"] == 128 else 1.0) * (1.1 if cfg["num_stages"] == 3 else 1.0) * (
        0.9 if cfg["GROUP_M"] == 4 else 1.0)


class FakeMeasure:
    """Scores over the batch's first config, as the trial pool reports them, the same on every shape."""

    def __call__(self, configs, fidelity):
        return [fake_speed(c) / fake_speed(configs[0]) for c in configs]

    def on(self, shapes):
        return self


class FakeTrials:
    """The measure factory."""

    def __init__(self):
        self.buckets = []

    def __call__(self, context, bucket, shapes):
        self.buckets.append((bucket, [s.label for s in shapes]))
        return FakeMeasure()


@pytest.mark.parametrize("algorithm", ["pattern", "lhs", "halving"])
def test_a_round_retunes_a_bucket_and_proposes_the_winner_as_one_line(tmp_path, algorithm):
    root = op_root(tmp_path, "gemm")
    path = root / "kernels/gemm/tuning.py"
    before = path.read_text().splitlines()
    trials = FakeTrials()
    outcome = SearchProposer(algorithm, trials, budget=24).propose(context(root))
    assert isinstance(outcome, Proposed) and trials.buckets == [("small", ["s0"])]
    p = outcome.proposal.params
    assert p["bucket"] == "small" and p["algorithm"] == algorithm and p["new"]["BLOCK_M"] == 128
    assert outcome.proposal.expected_gain_pct == pytest.approx(100 * (fake_speed(p["new"]) / fake_speed(p["old"]) - 1))
    after = path.read_text().splitlines()
    assert sum(a != b for a, b in zip(before, after, strict=True)) == 1
    assert read_tuning(path)[1]["small"] == p["new"]
    assert (root / "trials.json").exists()  # every config tried, in the round dir


def test_a_bucket_with_nothing_better_or_a_rolled_back_winner_is_settled(tmp_path):
    root = op_root(tmp_path, "gemm")
    scratch: dict = {}
    path = root / "kernels/gemm/tuning.py"
    path.write_text(path.read_text().replace('"small": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, '
                                             '"num_warps": 4, "num_stages": 3}',
                                             '"small": {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, '
                                             '"num_warps": 4, "num_stages": 3}'))
    assert read_tuning(path)[1]["small"]["BLOCK_M"] == 128  # at the fake's peak, as "large" already is
    trials = FakeTrials()
    outcome = SearchProposer("pattern", trials).propose(context(root, dims=TWO_BUCKETS, scratch=scratch))
    assert isinstance(outcome, Exhausted) and set(scratch["settled"]) == {"small", "large"}
    assert sorted(b for b, _ in trials.buckets) == ["large", "small"]
    root2 = op_root(tmp_path / "b", "gemm")
    rolled = closed({"file": "kernels/gemm/tuning.py", "bucket": "small", "old": {}, "new": {}, "algorithm": "lhs"})
    again = SearchProposer("lhs", FakeTrials()).propose(context(root2, history=[rolled]))
    assert isinstance(again, Exhausted)  # its only bucket's winner was rolled back


def test_a_campaign_with_an_algorithm_accepts_the_trials_winner_then_stops_when_settled(tmp_path):
    root = make_repo(tmp_path / "repo")
    proposer = SearchProposer("pattern", FakeTrials())
    campaign = Campaign.create(root, manifest("retune", proposer={"kind": "search", "algorithm": "pattern"}),
                               measurer=FakeMeasurer(root), console=Console(quiet=True), proposer=proposer)
    campaign.run()
    rounds = campaign.state.optimization_rounds()
    assert [r.status for r in rounds] == ["ACCEPT"]
    assert rounds[0].candidate.params["new"]["BLOCK_M"] == 128 and math.isclose(rounds[0].gain_pct, 10.0, abs_tol=0.01)
    assert campaign.state.stop_reason.startswith("pattern search: no bucket left")
    assert read_tuning(root / "kernels/gemm/tuning.py")[1]["small"]["BLOCK_M"] == 128
    assert "| 2 | ACCEPT |" in (campaign.run_dir / "logs" / "performance_trend.md").read_text()


def test_real_trials_in_a_worker_process_under_the_interpreter(tmp_path):
    """The whole path, small: a worker process runs agent.trials on the round's tree, its own copy of kernels/
    (64^3, 3 random configs)."""
    root = tmp_path / "repo"
    shutil.copytree(REPO_ROOT / "kernels", root / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    ctx = context(root, dims=({"B": 1, "M": 64, "N": 64, "K": 64},))
    outcome = SearchProposer("random", budget=3).propose(ctx)
    tried = json.loads((root / "trials.json").read_text())["small"]
    assert len(tried) == 4 and tried[0]["score"] == 1.0 and all(math.isfinite(t["score"]) for t in tried)
    pool = root / "trials" / "pool-1"
    assert [p.name for p in pool.glob("*.log")] == ["worker-0.log"] and (pool / "trials-1-w0.scores.json").exists()
    assert json.loads((pool / "pool.json").read_text()) == {"bucket": "small", "shapes": ["s0"], "gpus": [None]}
    assert isinstance(outcome, Proposed | Exhausted)  # interpreter timings decide nothing; the plumbing is the point


def test_a_winner_a_tip_rolled_back_from_the_same_config_and_context_is_not_proposed_again(tmp_path):
    root = op_root(tmp_path, "gemm")
    first = SearchProposer("pattern", FakeTrials(), budget=24).propose(context(root))
    assert isinstance(first, Proposed)
    p = first.proposal.params

    def tip(old):
        return Tip(op="gemm", backend="triton", device="cpu", variant="default",
                   shape_class=shape_class(context(root).manifest), summary="s", params=p | {"old": old},
                   outcome="ROLLBACK", gain_pct=-6.0, reason="small regressed", proposer="search")

    here, elsewhere = tip(p["old"]), tip(p["old"] | {"num_warps": 8})
    for tips, proposed in (([here], False), ([elsewhere], True)):
        fresh = op_root(tmp_path / str(proposed), "gemm")
        outcome = SearchProposer("pattern", FakeTrials(), budget=24).propose(context(fresh, tips=tips))
        assert isinstance(outcome, Proposed) == proposed


def test_trials_that_cannot_run_the_buckets_own_config_fail_the_round_not_settle_it_quietly(tmp_path):
    """A screen that scores the table's own config NaN (its runner failed under the trials' timing) judged
    nothing: an ERROR round naming the bucket, and the next round goes on to the next bucket."""
    class Broken(FakeTrials):
        def __call__(self, context, bucket, shapes):
            super().__call__(context, bucket, shapes)
            return lambda configs, fidelity: [math.nan] * len(configs)

    scratch: dict = {}
    trials = Broken()
    ctx = context(op_root(tmp_path, "gemm"), dims=TWO_BUCKETS, scratch=scratch)
    first = SearchProposer("halving", trials).propose(ctx)
    assert isinstance(first, Failed) and f"'{trials.buckets[0][0]}' bucket" in first.reason
    second = SearchProposer("halving", trials).propose(ctx)
    assert isinstance(second, Failed) and [b for b, _ in trials.buckets] == ["large", "small"]
    assert isinstance(SearchProposer("halving", trials).propose(ctx), Exhausted)

