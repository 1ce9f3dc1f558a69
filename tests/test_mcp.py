"""`turbo-opt mcp` answers the official SDK's own client over stdio, against a real `manual` campaign in a
throwaway clone: status, the request, a submitted change judged by the runner, the trend, knowledge."""

from __future__ import annotations

import os
import subprocess

import anyio
import pytest

from agent.decision import DecisionRecord
from agent.request import Request
from agent.status import CampaignStatus
from tests.clones import clone_worktree

# A declared dependency (CI installs it); the lent GPU machine has no mcp, and runs only `-m gpu` there.
mcp = pytest.importorskip("mcp")

TOOLS = {"list_campaigns", "status", "read_request", "submit_candidate", "performance_trend",
         "ineffective_directions", "knowledge"}


def test_the_mcp_server_serves_a_real_campaign_to_a_real_client(tmp_path):
    root = clone_worktree(tmp_path / "clone")
    started = subprocess.run(["turbo-opt", "start", "--op", "gemm", "--shapes", "smoke", "--proposer", "manual",
                              "--name", "mcp", "--max-iterations", "3", "--repeats", "1"],
                             cwd=root, capture_output=True, text=True, timeout=600)
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
    server = mcp.StdioServerParameters(command="turbo-opt", args=["mcp"], cwd=str(root), env=dict(os.environ))

    async def session() -> None:
        async with mcp.Client(server, read_timeout_seconds=600) as client:
            assert {tool.name for tool in (await client.list_tools()).tools} >= TOOLS
            status = CampaignStatus.model_validate((await client.call_tool("status", {"campaign": "mcp"}))
                                                   .structured_content)
            assert status.phase == "AWAITING_CANDIDATE" and status.expected_actor == "agent"
            request = Request.model_validate(
                (await client.call_tool("read_request", {"campaign": "mcp"})).structured_content)
            assert request.round == 2 and "kernels/gemm/tuning.py" in request.mutable_files

            tuning = root / "kernels/gemm/tuning.py"
            tuning.write_text(tuning.read_text().replace('"BLOCK_K": 32, "GROUP_M": 8', '"BLOCK_K": 64, "GROUP_M": 8'))
            submitted = await client.call_tool("submit_candidate", {
                "campaign": "mcp", "hypothesis": "deeper K tiles: half the mainloop trips",
                "summary": "small BLOCK_K 32 -> 64", "expected_gain_pct": 10.0})
            assert not submitted.is_error, submitted.content
            decision = DecisionRecord.model_validate(submitted.structured_content["decision"])
            assert decision.round == 2 and decision.status in ("ACCEPT", "ROLLBACK") and decision.measurements
            assert submitted.structured_content["status"]["round"] == 3

            trend = (await client.call_tool("performance_trend", {"campaign": "mcp"})).structured_content
            assert [row["round"] for row in trend["result"]] == [1, 2]
            knowledge = (await client.call_tool("knowledge", {"op": "gemm"})).structured_content
            assert "knowledge/ops/gemm/overview.md" in [f["path"] for f in knowledge["files"]]

            wrong = await client.call_tool("submit_candidate", {"campaign": "nope", "hypothesis": "h", "summary": "s"})
            assert wrong.is_error and "no campaign 'nope'" in wrong.content[0].text

    anyio.run(session)
