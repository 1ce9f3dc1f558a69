"""manifest.yaml: what a campaign optimizes, on which shapes, by which metric, who proposes the changes,
and when it stops."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.errors import UserError
from harness.files import atomic_write_text
from harness.registry import get_spec
from harness.rules import first_error, load_rules
from harness.shapes import Shape

Metric = Literal["forward", "backward", "step"]


class SearchConfig(BaseModel):
    """The built-in search over the op's tuned table (kernels/<op>/tuning.py)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["search"] = "search"
    # None: one knob of one bucket per round, each validated. A name from agent/search_algorithms.py
    # (pattern, random, lhs, halving): each round retunes a bucket, many configs tried, the winner validated.
    algorithm: str | None = None

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, value: str | None) -> str | None:
        from agent.search_algorithms import SEARCH_ALGORITHMS

        if value is not None and value not in SEARCH_ALGORITHMS:
            raise ValueError(f"unknown search algorithm '{value}' (known: {', '.join(SEARCH_ALGORITHMS)})")
        return value


class ManualConfig(BaseModel):
    """The handoff: the runner writes a request each round and waits for `turbo-opt submit`."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["manual"] = "manual"


class CommandConfig(BaseModel):
    """A coding agent run unattended: `run` is a shell command line started in the repo root each round."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["command"] = "command"
    run: str = Field(min_length=1)
    timeout_min: float = Field(default=30.0, gt=0)


ProposerConfig = Annotated[SearchConfig | ManualConfig | CommandConfig, Field(discriminator="kind")]


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
    primary_metric: Metric = "step"
    # Who proposes each round's change: `search` (built in), `manual` (a person or an agent submits),
    # or `{kind: command, run: "...", timeout_min: 30}` (an agent command run each round).
    proposer: ProposerConfig = SearchConfig()
    # Stop conditions, any of which ends the campaign. Best over baseline on the primary metric:
    target_speedup: float | None = Field(default=None, gt=1.0)
    # An absolute geomean (representative shapes) per metric, e.g. {step: 700}: stop once all are reached.
    target: dict[Metric, float] = {}
    # Best over the first vendor baseline that measures the primary metric (e.g. 1.05: 5% past cuBLAS).
    target_vs_vendor: float | None = Field(default=None, gt=0)
    # Geomean over the representative shapes of the forward rate as a fraction of its measured roofline.
    hardware_efficiency: float | None = Field(default=None, gt=0, le=1)
    # Files the campaign may change: default (empty) means all of the op's mutable files.
    mutable_files: list[str] = []
    branch: str = "auto"
    max_iterations: int = Field(default=10, ge=1, lt=120)
    max_duration_min: float = Field(default=240.0, gt=0)
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

    @field_validator("proposer", mode="before")
    @classmethod
    def _proposer_by_name(cls, value: Any) -> Any:
        """`proposer: manual` is short for `proposer: {kind: manual}`."""
        return {"kind": value} if isinstance(value, str) else value

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
    def name(self) -> str:
        if self.campaign is None:
            raise ValueError("the manifest has no campaign name yet")
        return self.campaign

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


def manifest_text(manifest: Manifest) -> str:
    return yaml.safe_dump(manifest.model_dump(mode="json"), sort_keys=False)


def write_manifest(manifest: Manifest, path: Path) -> Path:
    return atomic_write_text(path, manifest_text(manifest))
