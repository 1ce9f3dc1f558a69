"""manifest.yaml: what a campaign optimizes, on which shapes, by which metric, within which limits."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.errors import UserError
from harness.files import atomic_write_text
from harness.registry import get_spec
from harness.rules import first_error, load_rules
from harness.shapes import Shape


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The campaign's name (its run dir and branch); `turbo-opt start` fills in `<op>-<date>-<time>` if absent.
    campaign: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    op: str
    backend: Literal["triton"] = "triton"
    # The GPU the campaign is meant for ("auto": whatever it runs on); recorded in the report.
    gpu: str = "auto"
    variant: str | None = None
    dtype: str = "auto"
    # A shape preset of the op, a YAML shape file, or the shapes themselves.
    shapes: str | list[Shape]
    # Labels measured every round; empty until BASELINE picks them.
    representative_shapes: list[str] = []
    primary_metric: Literal["forward", "backward", "step"] = "step"
    # Stop once the best is this many times the baseline on the primary metric (None: no target).
    target_speedup: float | None = Field(default=None, gt=1.0)
    # Files the campaign may change: default (empty) means all of the op's mutable files.
    mutable_files: list[str] = []
    branch: str = "auto"
    max_iterations: int = Field(default=10, ge=1, lt=120)
    max_duration_min: float = Field(default=240.0, gt=0)
    proposer: Literal["search"] = "search"
    timing: Literal["auto", "cuda-events", "cuda-graph"] = "auto"
    repeats: int | None = Field(default=None, ge=1)
    # Also time with fresh input tensors every call; a gain that vanishes there is rejected as overfit.
    fresh_inputs: bool = True
    # Measure the best commit again next to every candidate and compare the two: a machine whose speed
    # drifts between rounds (clocks, neighbours, thermals) then cannot decide. Doubles measuring time.
    paired_reference: bool = True
    # Limits of one measurement subprocess: its first shape (import, compile, check, time) must be
    # done within compile_timeout_s, the whole within compile_timeout_s + run_timeout_s.
    compile_timeout_s: int = Field(default=900, ge=5)
    run_timeout_s: int = Field(default=1800, ge=5)

    @model_validator(mode="after")
    def _check_against_the_op(self) -> Manifest:
        try:
            spec = get_spec(self.op)
        except UserError as exc:
            raise ValueError(str(exc)) from None
        if self.variant is not None and self.variant not in spec.variants:
            raise ValueError(f"variant '{self.variant}' is not one of {', '.join(spec.variants)}")
        outside = [f for f in self.mutable_files if f not in spec.mutable_files]
        if outside:
            raise ValueError(f"mutable_files {outside} are not mutable files of {self.op}: {list(spec.mutable_files)}")
        if self.max_iterations > load_rules().max_iterations:
            raise ValueError(f"max_iterations exceeds the rules' limit of {load_rules().max_iterations}")
        return self

    @property
    def files(self) -> list[str]:
        return self.mutable_files or list(get_spec(self.op).mutable_files)

    @property
    def branch_name(self) -> str:
        return f"optimize/{self.campaign}" if self.branch == "auto" else self.branch

    @property
    def resolved_variant(self) -> str:
        return self.variant or get_spec(self.op).variants[0]


def default_campaign_name(op: str) -> str:
    return f"{op}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def load_manifest(path: Path) -> Manifest:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise UserError(f"cannot read manifest {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    return parse_manifest(data, str(path))


def parse_manifest(data: object, source: str) -> Manifest:
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise UserError(first_error(exc, source)) from None


def write_manifest(manifest: Manifest, path: Path) -> Path:
    data = manifest.model_dump(mode="json", exclude_defaults=False)
    return atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))
