"""The `command` proposer: a coding agent run unattended, once per round.

The manifest's `run` command line starts in the repository root with the request on stdin and its
paths in the environment (TURBO_OPT_REQUEST, TURBO_OPT_REQUEST_JSON, TURBO_OPT_ROUND_DIR,
TURBO_OPT_PROPOSAL, ...). It edits the mutable files and writes proposal.json (docs/schemas/
proposal.schema.json) into the round dir. A command that exits non-zero, runs past `timeout_min`
(its whole process group is killed), or writes no valid proposal is an ERROR round with the reason;
the campaign goes on. Its output is kept in the round's agent.log.
"""

from __future__ import annotations

import os
import shutil

from pydantic import ValidationError

from agent.manifest import CommandConfig, ProposerConfig
from agent.processes import TimeLimit, run_child
from agent.proposers import Failed, Outcome, Proposed, Proposer, RoundContext
from agent.state import Proposal
from harness.rules import first_error


class CommandProposer(Proposer):
    name = "command"

    def __init__(self, run: str, timeout_min: float) -> None:
        self.run = run
        self.timeout_min = timeout_min

    @classmethod
    def from_config(cls, config: ProposerConfig) -> CommandProposer:
        assert isinstance(config, CommandConfig)
        return cls(config.run, config.timeout_min)

    def environment(self, context: RoundContext) -> dict[str, str]:
        return {
            "TURBO_OPT_CAMPAIGN": context.campaign,
            "TURBO_OPT_ROUND": str(context.number),
            "TURBO_OPT_ROOT": str(context.root),
            "TURBO_OPT_ROUND_DIR": str(context.round_dir),
            "TURBO_OPT_REQUEST": str(context.request_md),
            "TURBO_OPT_REQUEST_JSON": str(context.request_json),
            "TURBO_OPT_PROPOSAL": str(context.round_dir / "proposal.json"),
            "TURBO_OPT_MUTABLE_FILES": "\n".join(context.manifest.files),
            "TURBO_OPT_OP": context.manifest.op,
            "TURBO_OPT_HOME": str(context.home or context.root),
        }

    def propose(self, context: RoundContext) -> Outcome:
        proposal_file = context.round_dir / "proposal.json"
        proposal_file.unlink(missing_ok=True)
        log_path = context.round_dir / "agent.log"
        shell = shutil.which("bash") or "/bin/sh"
        with log_path.open("w") as log:
            try:
                status = run_child([shell, "-c", self.run], cwd=context.root, log=log, registry=context.children,
                                   env=os.environ | self.environment(context), limit_s=self.timeout_min * 60,
                                   stdin_text=context.request_md.read_text())
            except TimeLimit:
                return Failed(f"agent command timed out after {self.timeout_min:g} min (its process group was killed)")
        if status != 0:
            tail = log_path.read_text().strip().splitlines()[-1:] or ["no output"]
            return Failed(f"agent command exited {status}: {tail[0][:200]}")
        if not proposal_file.exists():
            return Failed("agent command wrote no proposal.json ($TURBO_OPT_PROPOSAL)")
        try:
            return Proposed(Proposal.model_validate_json(proposal_file.read_text()))
        except ValidationError as exc:
            return Failed(first_error(exc, "proposal.json"))
