"""The `manual` proposer: the handoff. The runner has written the round's request; an agent or a person
edits the working tree and calls `turbo-opt submit` (or the MCP tool), which screens, validates and
decides the change and writes the next request. Until then the campaign waits in AWAITING_CANDIDATE."""

from __future__ import annotations

from agent.proposers import Awaiting, Outcome, Proposer, RoundContext


class ManualProposer(Proposer):
    name = "manual"

    def propose(self, context: RoundContext) -> Outcome:
        return Awaiting()
