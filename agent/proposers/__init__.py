"""Proposers: who makes a round's one change. Each is a small class over one interface, picked by the
manifest's `proposer.kind` (as Helion picks a search algorithm by name):

- `search` (search.py): moves one knob of the op's tuned table; needs no network.
- `manual` (manual.py): the handoff; the runner waits for an agent or a person to `turbo-opt submit`.
- `command` (command.py): runs a coding agent's command line each round, unattended.

A proposer edits the working tree (or leaves that to whoever the request is for) and says what it
did as a `Proposal`. It never measures or decides: the runner screens, validates and decides every
candidate the same way, whoever proposed it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from agent.analysis import ShapeAnalysis
from agent.knowledge import Tip
from agent.manifest import Manifest, ProposerConfig
from agent.processes import ChildRegistry
from agent.state import CampaignState, Proposal, RoundRecord
from harness.shapes import Shape


@dataclass(frozen=True)
class RoundContext:
    """Everything a proposer may read about the round it proposes for."""

    campaign: str
    number: int
    root: Path
    round_dir: Path
    manifest: Manifest
    shapes: tuple[Shape, ...]
    analyses: tuple[ShapeAnalysis, ...]
    # The closed rounds so far (baseline first), with their candidates, verdicts and gains.
    history: tuple[RoundRecord, ...]
    tips: tuple[Tip, ...]
    # The last rounds were all rolled back: change course.
    after_stagnation: bool
    request_md: Path
    request_json: Path
    children: ChildRegistry
    # The proposer's own notes, kept in state.json between rounds and runs.
    scratch: dict[str, Any] = field(default_factory=dict)
    # turbo-opt's checkout holding the campaign, where it is not `root` (an external target's checkout).
    home: Path | None = None


@dataclass(frozen=True)
class Proposed:
    """The working tree holds the change; this says what it is."""

    proposal: Proposal


@dataclass(frozen=True)
class Awaiting:
    """The request is out; the change arrives later through `turbo-opt submit`."""


@dataclass(frozen=True)
class Exhausted:
    """Nothing left to propose: the campaign goes to its report."""

    reason: str


@dataclass(frozen=True)
class Failed:
    """The proposer itself failed (an agent crashed or timed out): an ERROR round, and the campaign goes on."""

    reason: str


Outcome = Proposed | Awaiting | Exhausted | Failed


class Proposer(ABC):
    name: ClassVar[str]

    @classmethod
    def from_config(cls, config: ProposerConfig) -> Proposer:
        return cls()

    def check(self, manifest: Manifest) -> None:  # noqa: B027 (most proposers work on any manifest)
        """Raise UserError if this proposer cannot work on the manifest (called before anything is written)."""

    @abstractmethod
    def propose(self, context: RoundContext) -> Outcome: ...

    def next_steps(self, state: CampaignState) -> list[str]:
        """Lines for the report's next steps, from this proposer's point of view."""
        return []


def make_proposer(config: ProposerConfig) -> Proposer:
    from agent.proposers.command import CommandProposer
    from agent.proposers.manual import ManualProposer
    from agent.proposers.search import SearchProposer

    proposers: dict[str, type[Proposer]] = {p.name: p for p in (SearchProposer, ManualProposer, CommandProposer)}
    return proposers[config.kind].from_config(config)
