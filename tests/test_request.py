"""The request an agent is handed, and the published JSON schemas of what the runner reads and writes."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from agent.request import Request
from agent.runner import Campaign
from scripts.write_schemas import SCHEMAS, schema_text
from tests.clones import clone_worktree
from tests.test_campaign import FakeMeasurer, manifest


def test_a_request_cites_the_knowledge_that_applies_and_says_how_to_submit(tmp_path):
    root = clone_worktree(tmp_path / "clone")
    campaign = Campaign.create(root, manifest("req", op="gemm_fp8", variant="e4m3-blockwise", proposer="manual"),
                               measurer=FakeMeasurer(root), console=Console(quiet=True))
    state = campaign.run()
    assert state.phase == "AWAITING_CANDIDATE"
    rd = campaign.round_dir(2)
    request = Request.model_validate_json((rd / "request.json").read_text())
    cited = [k.path for k in request.knowledge]
    # The CPU matches no hardware file; the FP8 op's Gluon kernel brings the Gluon backend files.
    assert set(cited) == {f"knowledge/{path}.md" for path in (
        "backend/triton/programming-model", "backend/triton/optimization-directions",
        "backend/gluon/programming-model", "backend/gluon/optimization-directions",
        "ops/gemm_fp8/overview", "ops/gemm_fp8/optimization-directions")}
    text = (rd / "request.md").read_text()
    for path in cited:
        assert f"`{path}`" in text
    assert "turbo-opt submit req --hypothesis" in text and request.submission.how == "submit"
    assert request.mutable_files == list(campaign.spec.mutable_files)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_the_published_schemas_are_the_models(name):
    """docs/schemas/ is what agents code against: regenerate with `python scripts/write_schemas.py`."""
    published = json.loads((SCHEMAS[name][1]).read_text())
    assert published == json.loads(schema_text(SCHEMAS[name][0]))
