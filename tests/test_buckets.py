"""Buckets that follow the shapes: a grouped op's table entry split by layer, and the retune search
proposing the split when the bucket's winner would slow one layer down (fake trials: no GPU)."""

import json

import git
import pytest
import torch
from rich.console import Console

from agent.knowledge import Tip
from agent.knowledge import shape_class as knowledge_shape_class
from agent.proposers import Proposed
from agent.proposers.search import SearchProposer
from agent.runner import Campaign
from agent.tuning_table import read_tuning, rewrite_table
from harness.meta import BenchMeta, TimingInfo, environment, write_meta
from harness.schema import GEMM, write_summary
from harness.shapes import load_shape_file
from kernels.common.fp8 import Granularity
from kernels.common.tiles import TileConfig, layer_class, table_entry
from kernels.grouped_gemm_fp8 import tuning as fp8_tuning
from tests.test_campaign import make_repo
from tests.test_campaign import manifest as campaign_manifest
from tests.test_schema import gemm_row
from tests.test_search_proposer import context, op_root

GATEUP = {"B": 8, "M": 2048, "N": 3072, "K": 4096}
DOWN = {"B": 8, "M": 2048, "N": 4096, "K": 1536}
DETUNED = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 2}


def test_a_split_entry_serves_its_layer_only(monkeypatch):
    own = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 4, "num_warps": 4, "num_stages": 3}
    monkeypatch.setitem(fp8_tuning.TUNED_TABLE, "fwd/large 4096x1536", own)
    assert fp8_tuning.config_for("fwd", 16384, 8, Granularity.ROWWISE, (4096, 1536)).BLOCK_N == 128
    assert fp8_tuning.config_for("fwd", 16384, 8, Granularity.ROWWISE, (1536, 4096)).BLOCK_N == 128  # dgrad's view
    assert fp8_tuning.config_for("fwd", 16384, 8, Granularity.ROWWISE, (3072, 4096)).BLOCK_N == 256
    assert "fwd/large 4096x1536" in fp8_tuning.buckets_for(DOWN) and "fwd/large" in fp8_tuning.buckets_for(GATEUP)


def test_a_remembered_config_follows_the_table(monkeypatch):
    """config_for remembers its answer by shape, yet serves at once what a trial swaps in (in memory), an entry
    changed in place, a split entry added later, and refuses an entry outside the tunable space every time."""
    args = ("fwd", 16384, 8, Granularity.ROWWISE, (4096, 1536))
    assert fp8_tuning.config_for(*args).BLOCK_N == 256
    monkeypatch.setitem(fp8_tuning.TUNED_TABLE, "fwd/large", fp8_tuning.TUNED_TABLE["fwd/large"] | {"BLOCK_N": 64})
    assert fp8_tuning.config_for(*args).BLOCK_N == 64
    fp8_tuning.TUNED_TABLE["fwd/large"]["GROUP_M"] = 4  # the swapped-in copy, changed in place
    assert fp8_tuning.config_for(*args).GROUP_M == 4
    monkeypatch.setitem(fp8_tuning.TUNED_TABLE, "fwd/large 4096x1536", DETUNED)
    assert fp8_tuning.config_for(*args) == TileConfig(**DETUNED)
    monkeypatch.setitem(fp8_tuning.TUNED_TABLE, "fwd/large 4096x1536", DETUNED | {"BLOCK_M": 48})
    for _ in range(2):
        with pytest.raises(ValueError, match="outside the tunable space"):
            fp8_tuning.config_for(*args)


def test_the_wgrad_bucket_follows_its_reduction_length():
    """The wgrad reduces over a group's tokens: DeepSeek-V3's 1024-token experts take the short-K bucket
    there, while their forward (tokens = M) stays in the large one; 2048-token groups stay large."""
    def entry(pass_name, tokens_per_group):
        return fp8_tuning._key(pass_name, 32 * tokens_per_group, 32, Granularity.ROWWISE)
    assert entry("wgrad", 1024) == "wgrad/small" and entry("fwd", 1024) == "fwd/large"
    assert entry("wgrad", 2048) == "wgrad/large" and entry("dgrad", 512) == "dgrad/small"
    assert fp8_tuning._key("wgrad", 32 * 1024, 32, Granularity.BLOCKWISE) == "wgrad/small/blockwise"


def layer_speed(cfg, dims) -> float:
    """Wider tiles pay on the gate-up layer; on the down layer (K 1536) BLOCK_N 128 is best and 256 costs 30%."""
    block_n = ({64: 1.0, 128: 1.1, 256: 0.7} if dims["K"] == 1536 else {64: 1.0, 128: 1.2, 256: 2.0})[cfg["BLOCK_N"]]
    return 100.0 * 1.1 ** ((cfg["BLOCK_M"] == 128) + (cfg["num_warps"] == 8)) * block_n


class FakeTrials:
    """The trial pool's part: scores over the batch's first config on its shapes, or `on` some of them."""

    def __init__(self, shapes):
        self.shapes = shapes

    def __call__(self, configs, fidelity):
        scores = [1.0] * len(configs)
        for shape in self.shapes:
            scores = [s * layer_speed(c, shape.dims) for s, c in zip(scores, configs, strict=True)]
        return [(s / scores[0]) ** (1 / len(self.shapes)) for s in scores]

    def on(self, shapes):
        return FakeTrials(shapes)


def trials(context, bucket, shapes):
    return FakeTrials(shapes)


def detuned(tmp_path):
    root = op_root(tmp_path, "grouped_gemm_fp8")
    path = root / "kernels/grouped_gemm_fp8/tuning.py"
    rewrite_table(path, dict.fromkeys(read_tuning(path)[1], DETUNED))
    return root


def test_the_search_splits_a_bucket_whose_winner_slows_one_layer_down(tmp_path):
    root = detuned(tmp_path)
    path = root / "kernels/grouped_gemm_fp8/tuning.py"
    ctx = context(root, "grouped_gemm_fp8", (GATEUP, DOWN), "e4m3-rowwise")
    outcome = SearchProposer("pattern", trials, budget=60).propose(ctx)
    assert isinstance(outcome, Proposed)
    p = outcome.proposal.params
    assert p["new"]["BLOCK_N"] == 256 and list(p["split"]) == [f"{p['bucket']} 4096x1536"]
    own = p["split"][f"{p['bucket']} 4096x1536"]
    assert (own["BLOCK_N"], own["BLOCK_M"], own["num_warps"]) == (128, 128, 8)
    after = read_tuning(path)[1]
    keys = list(after)
    assert keys[keys.index(p["bucket"]) + 1] == f"{p['bucket']} 4096x1536"  # right under its bucket, one line
    assert "split" in outcome.proposal.summary and after[p["bucket"]] == p["new"]
    tried = json.loads((root / "trials.json").read_text())
    assert set(tried) == {p["bucket"], f"{p['bucket']} 4096x1536"}  # the bucket's search and the layer's own


@pytest.mark.parametrize("dims", [(GATEUP,), (GATEUP, {**GATEUP, "M": 4096})])
def test_no_split_where_the_shapes_are_one_layer(tmp_path, dims):
    root = detuned(tmp_path)
    outcome = SearchProposer("pattern", trials, budget=60).propose(context(root, "grouped_gemm_fp8", dims,
                                                                            "e4m3-rowwise"))
    assert isinstance(outcome, Proposed) and outcome.proposal.params["split"] == {}


def compromise(tmp_path):
    """Every entry at the config that is best for the two layers together (BLOCK_N 256: the gate-up layer's
    2.0 times the down layer's 0.7 beats 128's 1.2 times 1.1), which the down layer alone would not pick."""
    root = op_root(tmp_path, "grouped_gemm_fp8")
    path = root / "kernels/grouped_gemm_fp8/tuning.py"
    rewrite_table(path, dict.fromkeys(read_tuning(path)[1], DETUNED | {"BLOCK_M": 128, "BLOCK_N": 256,
                                                                        "num_warps": 8}))
    return root, path


def test_where_no_config_beats_the_bucket_a_layer_that_wants_its_own_gets_a_split(tmp_path):
    root, path = compromise(tmp_path)
    outcome = SearchProposer("pattern", trials, budget=60).propose(
        context(root, "grouped_gemm_fp8", (GATEUP, DOWN), "e4m3-rowwise"))
    assert isinstance(outcome, Proposed)
    p = outcome.proposal.params
    key = f"{p['bucket']} 4096x1536"
    assert p["new"] == p["old"] and list(p["split"]) == [key] and p["split"][key]["BLOCK_N"] == 128
    assert read_tuning(path)[1][key] == p["split"][key] and "kept" in outcome.proposal.summary
    # the down layer's 1.1 / 0.7 over the bucket's config, weighted by its share of the bucket's two shapes
    assert outcome.proposal.expected_gain_pct == pytest.approx(100 * ((1.1 / 0.7) ** 0.5 - 1), rel=1e-6)
    tried = json.loads((root / "trials.json").read_text())
    assert set(tried) == {p["bucket"], f"{p['bucket']} 4096x1536", f"{p['bucket']} 4096x3072"}
    # trials.md: per entry, the best change against the entry's own config, in its timings' terms
    digest = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in
              (root / "trials.md").read_text().splitlines() if line.startswith(f"| {p['bucket']}")}
    assert set(digest) == set(tried)
    best_change, ratio = digest[key][1:3]
    assert best_change == "BLOCK_N 256 -> 128" and float(ratio.rstrip("x")) == pytest.approx(1.1 / 0.7, abs=1e-3)
    assert all(row["base"] == (row["config"] == tried[key][0]["config"]) for row in tried[key])


def test_a_split_known_not_to_pay_here_is_not_proposed_again(tmp_path):
    root, _ = compromise(tmp_path)
    first = SearchProposer("pattern", trials, budget=60).propose(
        context(root, "grouped_gemm_fp8", (GATEUP, DOWN), "e4m3-rowwise"))
    root2, _ = compromise(tmp_path / "again")
    tip = Tip(op="grouped_gemm_fp8", backend="triton", device="d", variant="e4m3-rowwise",
              shape_class=knowledge_shape_class(context(root2, "grouped_gemm_fp8", (GATEUP, DOWN),
                                                        "e4m3-rowwise").manifest),
              summary="s", params=first.proposal.params, proposer="search", outcome="ROLLBACK", gain_pct=0.1,
              reason="noise")
    again = SearchProposer("pattern", trials, budget=60).propose(
        context(root2, "grouped_gemm_fp8", (GATEUP, DOWN), "e4m3-rowwise", tips=(tip,)))
    assert not isinstance(again, Proposed) or again.proposal.params["bucket"] != first.proposal.params["bucket"]


class LayerMeasurer:
    """The campaign's bench, faked: each shape at the speed `layer_speed` gives the config of its own table
    entry (a split entry where the table has one for its layer)."""

    def __init__(self, root):
        self.root = root

    def __call__(self, request):
        _, table = read_tuning(self.root / "kernels/gemm/tuning.py")
        rows = []
        for shape in load_shape_file(request.shapes_file):
            dims = dict(shape.dims)
            cfg = table[table_entry(table, "small", layer_class(dims["N"], dims["K"]))]
            rows.append(gemm_row(shape.label, fwd=layer_speed(cfg, dims), bwd=layer_speed(cfg, dims)))
        write_summary(request.summary_csv, GEMM, rows)
        write_meta(request.summary_csv, BenchMeta(
            op="gemm", runner="fake", csv_schema="gemm", dtype="fp16", variant="default", shapes="t", seed=0,
            timing=TimingInfo(mode="fake", repeats=1, warmup=0, l2_flush=False), **environment(torch.device("cpu"))))


def test_a_campaign_accepts_a_layers_own_entry_and_then_settles(tmp_path):
    """Through the runner: two layers in one bucket (every pass "small"), whose config suits them together but
    not the K-1536 layer alone; the split is proposed, validated, accepted as a commit, and the campaign ends."""
    root = make_repo(tmp_path / "repo")
    path = root / "kernels/gemm/tuning.py"
    rewrite_table(path, read_tuning(path)[1] | {"small": DETUNED | {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 32,
                                                                   "num_warps": 8}})
    git.Repo(root).git.commit("-qam", "the compromise")
    shapes = [{"label": "down", "B": 1, "M": 128, "N": 128, "K": 1536},
              {"label": "up", "B": 1, "M": 128, "N": 128, "K": 2048}]
    campaign = Campaign.create(root, campaign_manifest("split", shapes=shapes, max_iterations=4,
                                                       proposer={"kind": "search", "algorithm": "pattern"}),
                               measurer=LayerMeasurer(root), console=Console(quiet=True),
                               proposer=SearchProposer("pattern", trials, budget=60))
    campaign.run()
    rounds = campaign.state.optimization_rounds()
    assert [r.status for r in rounds] == ["ACCEPT"]
    params = rounds[0].candidate.params
    assert params["new"] == params["old"] and list(params["split"]) == ["small 1536x128"]
    assert rounds[0].gain_pct == pytest.approx(100 * ((1.1 / 0.7) ** 0.5 - 1), abs=0.01)
    assert read_tuning(path)[1]["small 1536x128"]["BLOCK_N"] == 128
    assert campaign.state.stop_reason.startswith("pattern search: no bucket left")
