import shutil
from pathlib import Path

import pytest

from agent.analysis import ShapeAnalysis
from agent.knowledge import Tip, shape_class, similarity
from agent.manifest import parse_manifest
from agent.processes import ChildRegistry
from agent.proposers import Exhausted, Proposed, RoundContext
from agent.proposers.search import DIRECTIONS, SearchProposer, read_tuning, rewrite_table
from agent.state import Candidate, RoundRecord
from harness.files import REPO_ROOT
from harness.shapes import Shape
from kernels.gemm import tuning as gemm_tuning
from kernels.gemm_fp8 import tuning as dense_fp8_tuning
from kernels.grouped_gemm import tuning as grouped_tuning
from kernels.grouped_gemm_fp8 import tuning as fp8_tuning

SMOKE = ({"B": 1, "M": 128, "N": 128, "K": 128},)
COMPUTE_BOUND = (ShapeAnalysis("s", 500.0, "compute", 1.0, float("nan")),)


def op_root(tmp_path: Path, op: str) -> Path:
    (tmp_path / "kernels" / op).mkdir(parents=True)
    shutil.copy(REPO_ROOT / "kernels" / op / "tuning.py", tmp_path / "kernels" / op / "tuning.py")
    return tmp_path


def context(root, op="gemm", dims=SMOKE, variant=None, history=(), tips=(), after_stagnation=False, scratch=None):
    shapes = tuple(Shape(label=f"s{i}", dims=d) for i, d in enumerate(dims))
    manifest = parse_manifest({"campaign": "t", "op": op, "variant": variant, "shapes": list(shapes)}, "test")
    return RoundContext(campaign="t", number=2, root=root, round_dir=root, manifest=manifest, shapes=shapes,
                        analyses=COMPUTE_BOUND, history=tuple(history), tips=tuple(tips),
                        after_stagnation=after_stagnation, request_md=root / "request.md",
                        request_json=root / "request.json", children=ChildRegistry(root / "children.json"),
                        scratch={} if scratch is None else scratch)


def closed(params: dict, status: str = "ROLLBACK") -> RoundRecord:
    candidate = Candidate(hypothesis="h", summary="s", proposer="search", params=params)
    return RoundRecord(number=2, candidate=candidate, status=status)


def test_proposals_move_one_knob_of_a_used_bucket_to_a_neighbour(tmp_path):
    root = op_root(tmp_path, "gemm")
    proposals = SearchProposer().candidates(context(root), "tile")
    assert proposals and all(p.params["bucket"] == "small" for p in proposals)  # smoke shapes use only "small"
    space, _ = read_tuning(root / "kernels/gemm/tuning.py")
    for p in proposals:
        allowed = space[p.params["knob"]]
        assert abs(allowed.index(p.params["new"]) - allowed.index(p.params["old"])) == 1
    assert [p.expected_gain_pct for p in proposals] == sorted((p.expected_gain_pct for p in proposals), reverse=True)


def test_propose_rewrites_one_line_and_evaluated_moves_are_never_retried(tmp_path):
    root = op_root(tmp_path, "gemm")
    path = root / "kernels/gemm/tuning.py"
    before = path.read_text().splitlines()
    outcome = SearchProposer().propose(context(root))
    assert isinstance(outcome, Proposed)
    first = outcome.proposal.params
    after = path.read_text().splitlines()
    assert len(before) == len(after) and sum(a != b for a, b in zip(before, after, strict=True)) == 1
    assert read_tuning(path)[1][first["bucket"]][first["knob"]] == first["new"]
    rewrite_table(path, read_tuning(REPO_ROOT / "kernels/gemm/tuning.py")[1])
    again = SearchProposer().candidates(context(root, history=[closed(first)]), first["direction"])
    assert all((p.params["knob"], p.params["new"]) != (first["knob"], first["new"]) for p in again)


def test_tips_steer_the_search_ineffective_moves_skipped_and_learned_gains_ranked(tmp_path):
    root = op_root(tmp_path, "gemm")
    ranked = SearchProposer().candidates(context(root), "tile")
    top = ranked[0].params

    def tip(params: dict, outcome: str, gain: float | None) -> Tip:
        return Tip(op="gemm", backend="triton", device="cpu", variant="default",
                   shape_class=shape_class(context(root).manifest), summary="s", params=params, outcome=outcome,
                   gain_pct=gain, reason="r", proposer="search")

    skipped = SearchProposer().candidates(context(root, tips=[tip(top, "ROLLBACK", -3.0)]), "tile")
    assert all((p.params["knob"], p.params["new"]) != (top["knob"], top["new"]) for p in skipped)
    last = ranked[-1].params
    learned = SearchProposer().candidates(context(root, tips=[tip(last, "ACCEPT", 40.0)]), "tile")
    assert (learned[0].params["knob"], learned[0].params["new"] > learned[0].params["old"]) == (
        last["knob"], last["new"] > last["old"])


def test_stagnation_switches_the_knob_family_and_the_search_ends_when_all_are_tried(tmp_path):
    root = op_root(tmp_path, "gemm")
    scratch: dict = {}
    first = SearchProposer().propose(context(root, scratch=scratch))
    assert isinstance(first, Proposed) and scratch["direction"] == "tile"
    rewrite_table(root / "kernels/gemm/tuning.py", read_tuning(REPO_ROOT / "kernels/gemm/tuning.py")[1])
    second = SearchProposer().propose(context(root, scratch=scratch, after_stagnation=True))
    assert isinstance(second, Proposed) and scratch["direction"] == "pipeline" and scratch["exhausted"] == ["tile"]
    scratch["exhausted"] = list(DIRECTIONS)
    assert SearchProposer().propose(context(root, scratch=scratch)) == Exhausted(
        "search space exhausted: every knob family was tried")


def test_configs_that_do_not_fit_shared_memory_are_never_proposed(tmp_path):
    root = op_root(tmp_path, "grouped_gemm_fp8")
    dims = ({"B": 8, "M": 512, "N": 4096, "K": 7168},)
    proposals = SearchProposer().candidates(context(root, "grouped_gemm_fp8", dims, "e4m3-rowwise"), "pipeline")
    _, table = read_tuning(root / "kernels/grouped_gemm_fp8/tuning.py")
    assert proposals
    for p in proposals:
        assert fp8_tuning.fits(table[p.params["bucket"]] | {p.params["knob"]: p.params["new"]})
    # 128x256x128 fp8 tiles with 5 stages need 240 KiB: the H100 refused exactly this config
    assert not fp8_tuning.fits(table["fwd/small"] | {"num_stages": 5})


@pytest.mark.parametrize("tuning", [gemm_tuning, grouped_tuning, fp8_tuning, dense_fp8_tuning])
def test_every_tuned_config_fits(tuning):
    assert all(tuning.fits(cfg) for cfg in tuning.TUNED_TABLE.values())


def test_the_tma_store_tile_counts_against_shared_memory():
    # The H100 refused both with the output tile staged for the TMA store (262 KB and 263 KB).
    assert not gemm_tuning.fits(gemm_tuning.TUNED_TABLE["large"] | {"num_stages": 4})
    assert not dense_fp8_tuning.fits(dense_fp8_tuning.TUNED_TABLE["fwd/large"] | {"num_stages": 4})


def test_a_tip_counts_only_in_its_own_context(tmp_path):
    """A move found ineffective from a detuned config (BLOCK_N 64 -> 128 while BLOCK_M was 32) is tried again
    from another config; learned gains lean on the tips measured in contexts like this one."""
    root = op_root(tmp_path, "gemm")
    here = context(root)
    current = read_tuning(root / "kernels/gemm/tuning.py")[1]["small"]
    top = SearchProposer().candidates(here, "tile")[0].params
    detuned = current | {"BLOCK_M": 32}

    def tip(params: dict, outcome: str, gain: float | None, shapes: str = shape_class(here.manifest)) -> Tip:
        return Tip(op="gemm", backend="triton", device="cpu", variant="default", shape_class=shapes, summary="s",
                   params=params, outcome=outcome, gain_pct=gain, reason="r", proposer="search")

    elsewhere = tip(top | {"config": detuned}, "ROLLBACK", -3.0)
    shapes = shape_class(here.manifest)
    assert similarity(elsewhere, "default", shapes, current) == pytest.approx(0.5 + 0.5 * 5 / 6)  # 5 of 6 knobs
    again = SearchProposer().candidates(context(root, tips=[elsewhere]), "tile")
    assert (again[0].params["knob"], again[0].params["new"]) == (top["knob"], top["new"])
    other_shapes = tip(top, "ROLLBACK", -3.0, shapes="another preset: x")
    assert SearchProposer().candidates(context(root, tips=[other_shapes]), "tile")[0].params["new"] == top["new"]
    # Two accepted tips on the same move: +40% measured here, -20% measured from a far config and shape class.
    here_tip = tip(top, "ACCEPT", 40.0)
    far = tip(top | {"config": {k: -1 for k in current}}, "ACCEPT", -20.0, shapes="another preset: x")
    learned = SearchProposer().candidates(context(root, tips=[here_tip, far]), "tile")[0]
    assert learned.params["knob"] == top["knob"] and "learned" in learned.hypothesis
    # weights 1.0 and 0.25: (40 - 5) / 1.25 = 28, averaged with the prior
    prior = SearchProposer().candidates(here, "tile")[0].expected_gain_pct
    assert learned.expected_gain_pct == pytest.approx((prior + 28.0) / 2)
