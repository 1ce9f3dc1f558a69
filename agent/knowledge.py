"""Tips: what each round of each campaign taught, per op, device and variant.

A campaign writes its tips to its own run dir (`campaigns/runs/<name>/tips.yaml`: the campaign never
writes outside its mutable files); curated tips live in `knowledge/tips/*.yaml`. The search
proposer reads both: verified-ineffective moves are not tried again, accepted gains raise the
expectation of similar moves.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from harness.files import atomic_write_text


class Tip(BaseModel):
    model_config = ConfigDict(extra="forbid")

    op: str
    backend: str
    device: str
    variant: str
    file: str
    bucket: str
    knob: str
    old: int
    new: int
    outcome: Literal["ACCEPT", "ROLLBACK", "ERROR"]
    gain_pct: float | None
    reason: str
    campaign: str


class TipFile(BaseModel):
    tips: list[Tip] = []


def tip_files(root: Path) -> list[Path]:
    curated = sorted((root / "knowledge" / "tips").glob("*.yaml"))
    return curated + sorted((root / "campaigns" / "runs").glob("*/tips.yaml"))


def load_tips(root: Path, op: str, device: str, variant: str) -> list[Tip]:
    """Tips for this op on this device and variant; unreadable files are skipped, not fatal."""
    tips = []
    for path in tip_files(root):
        try:
            tips += TipFile.model_validate(yaml.safe_load(path.read_text()) or {}).tips
        except (OSError, yaml.YAMLError, ValidationError):
            continue
    return [t for t in tips if t.op == op and t.device == device and t.variant == variant]


def write_tips(path: Path, tips: list[Tip]) -> None:
    atomic_write_text(path, yaml.safe_dump(TipFile(tips=tips).model_dump(mode="json"), sort_keys=False))


def verified_ineffective(tips: list[Tip]) -> set[tuple[str, str, str, int]]:
    """(file, bucket, knob, value) moves that were measured and rolled back."""
    return {(t.file, t.bucket, t.knob, t.new) for t in tips if t.outcome != "ACCEPT"}


def learned_gains(tips: list[Tip]) -> dict[tuple[str, int], float]:
    """Mean accepted gain (%) by (knob, +1 up / -1 down)."""
    gains: dict[tuple[str, int], list[float]] = defaultdict(list)
    for t in tips:
        if t.outcome == "ACCEPT" and t.gain_pct is not None:
            gains[(t.knob, 1 if t.new > t.old else -1)].append(t.gain_pct)
    return {k: sum(v) / len(v) for k, v in gains.items()}
