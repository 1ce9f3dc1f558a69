"""`turbo-opt learn <campaign>`: a finished campaign's verified tips into knowledge/tips/<op>.yaml and
its measured findings into knowledge/ops/<op>/optimization-directions.md, in the working tree for the
user to review and commit. Refused, with the reason, for a campaign that is not done or whose final
bench did not reproduce its accepted gains: unverified numbers never enter the knowledge base."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from agent.knowledge import Tip, TipFile, write_tips
from agent.runner import Campaign
from harness.errors import UserError
from harness.files import atomic_write_text

LEARNED_SECTION = "## Learned by campaigns"


@dataclass(frozen=True)
class Learned:
    tips_file: Path
    directions_file: Path
    new_tips: list[Tip]


def _key(tip: Tip) -> tuple[str | None, str, str]:
    # The change too: a campaign started again under a name whose run directory was removed writes the
    # same round paths for other experiments.
    return tip.campaign, tip.evidence, tip.summary


def _finding(tip: Tip, metric: str) -> str:
    gain = f"{tip.gain_pct:+.2f}% {metric} geomean" if tip.gain_pct is not None and math.isfinite(tip.gain_pct) \
        else "not measured"
    commit = f", commit {tip.commit[:10]}" if tip.commit else ""
    return (f"- {tip.outcome} {tip.summary}: {gain} on {tip.device} ({tip.variant}; {tip.shape_class}); "
            f"{tip.reason}. Campaign {tip.campaign}{commit} ({tip.evidence}).")


def _append_findings(path: Path, lines: list[str]) -> None:
    text = path.read_text() if path.exists() else ""
    if LEARNED_SECTION not in text:
        text = text.rstrip("\n") + f"\n\n{LEARNED_SECTION}\n\nMerged by `turbo-opt learn` from campaigns whose final " \
                                   "bench reproduced their gains; review before committing.\n"
    atomic_write_text(path, text.rstrip("\n") + "\n" + "\n".join(lines) + "\n")


def learn(root: Path, name: str) -> Learned:
    campaign = Campaign.open(root, name)
    state, op = campaign.state, campaign.manifest.op
    if state.phase != "DONE":
        raise UserError(f"campaign {name} is not done (phase {state.phase}): finish or resume it first")
    if not state.reproduced:
        raise UserError(f"campaign {name} did not reproduce its gains in the final bench: {state.reproduction}")
    tips_path = campaign.run_dir / "tips.yaml"
    learned = [t for t in TipFile.model_validate(yaml.safe_load(tips_path.read_text()) or {}).tips
               if t.outcome != "ERROR"]  # an agent's crash or a time-out teaches nothing about the kernel
    target = root / "knowledge" / "tips" / f"{op}.yaml"
    known = TipFile.model_validate(yaml.safe_load(target.read_text()) or {}).tips if target.exists() else []
    seen = {_key(t) for t in known}
    new = [t for t in learned if _key(t) not in seen]
    directions = root / "knowledge" / "ops" / op / "optimization-directions.md"
    if new:
        write_tips(target, known + new)
        measured = [t for t in new if t.gain_pct is not None]
        if measured:
            _append_findings(directions, [_finding(t, campaign.manifest.primary_metric) for t in measured])
    return Learned(target, directions, new)
