"""Proposers: given a round's context, change the mutable files once and say what is expected.

Only the built-in `search` proposer exists so far (agent/proposers/search.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from agent.state import Change


@dataclass(frozen=True)
class Proposal:
    hypothesis: str
    # A tuned-table move (the search proposer's kind of change), or None for any other edit.
    change: Change | None
    expected_gain_pct: float
    # One line for the commit subject and the logs (default: the change's description).
    description: str = ""
    # A high-risk change is validated on every shape, not only the representative ones.
    risk: Literal["low", "high"] = "low"

    @property
    def summary(self) -> str:
        return self.description or (self.change.describe() if self.change else "change")


@dataclass(frozen=True)
class ProposalContext:
    op: str
    variant: str
    root: Path
    # Dims of the shapes the campaign measures.
    shape_dims: tuple[dict[str, int], ...]
    direction: str
    # (file, bucket, knob, value) already evaluated in this campaign or recorded ineffective.
    visited: frozenset[tuple[str, str, str, int]] = frozenset()
    # Mean gain (%) by (knob, +1/-1) of changes that earlier campaigns accepted.
    learned_gain_pct: dict[tuple[str, int], float] = field(default_factory=dict)


class Proposer(Protocol):
    def propose(self, context: ProposalContext) -> Proposal | None: ...

    def apply(self, proposal: Proposal, root: Path) -> None: ...
