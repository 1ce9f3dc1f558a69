"""manifest.yaml: what a campaign optimizes, on which shapes, by which metric, who proposes the changes,
and when it stops."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.errors import UserError
from harness.files import atomic_write_text
from harness.registry import get_spec
from harness.rules import first_error, load_rules
from harness.schema import SCHEMAS, CsvSchema, register_schema
from harness.shapes import Shape

Metric = Literal["forward", "backward", "step"]
# How a campaign's benches and its search's trials time a call ("auto": the harness's default for the device;
# cuda-graph: the kernels alone, replayed, for shapes whose host time would set the numbers).
TimingChoice = Literal["auto", "cuda-events", "cuda-graph"]
# Where the placeholders of an external target's commands are filled in: the summary CSV to write, and
# a YAML file of the shapes to run (optional: a command may run its own shape set).
CSV_PLACEHOLDER, SHAPES_PLACEHOLDER = "{csv}", "{shapes}"


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


class SchemaDeclaration(BaseModel):
    """The frozen summary CSV of an external kernel that is none of turbo-opt's own schemas: its header is
    `label, <dims>, Check, Forward <metric>, ..., <output>_snr...` (harness/schema.py's convention)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    dims: list[str] = Field(min_length=1)
    metric: Literal["TFLOPS", "GB/s"] = "TFLOPS"
    outputs: list[str] = Field(min_length=1)

    def schema(self) -> CsvSchema:
        return CsvSchema(self.name, tuple(self.dims), self.metric, tuple(self.outputs))

    @classmethod
    def of(cls, schema: CsvSchema) -> SchemaDeclaration:
        return cls(name=schema.name, dims=list(schema.dims), metric=schema.metric, outputs=list(schema.outputs))


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The campaign's name (its run dir and branch); `turbo-opt start` fills in `<op>-<date>-<time>` if absent.
    campaign: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    op: str
    # triton for turbo-opt's own ops; an external target may name its own (hip, cuda, ck...).
    backend: str = "triton"
    # The GPU the campaign is meant for ("auto": whatever it runs on); recorded in the report.
    gpu: str = "auto"
    variant: str | None = None
    dtype: str = "auto"
    # A shape preset of the op, a YAML shape file, or the shapes themselves. An external target may leave
    # them out: its benchmark command runs its own set, and the baseline's CSV names them.
    shapes: str | list[Shape] | None = None
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
    # "auto": optimize/<campaign>; "none": the branch checked out at the start; or a branch name.
    branch: str = "auto"
    # false: no accepted round is left committed on a branch of yours: the campaign's commits are kept
    # under refs/turbo-opt/<campaign>, and the best version of the mutable files is left uncommitted in
    # the working tree at the end (kernel-optimize's `git_commit: false`).
    git_commit: bool = True
    max_iterations: int = Field(default=10, ge=1, lt=120)
    max_duration_min: float = Field(default=240.0, gt=0)
    timing: TimingChoice = "auto"
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
    # A command that must pass on the candidate (the target's focused tests): run at BASELINE, before
    # every candidate is timed, and at REPORT, in the target's checkout; a failure is a FAIL.
    test_command: str | None = Field(default=None, min_length=1)

    # --- an external target: a kernel in another git repository (all empty: turbo-opt's kernels/<op>) ---
    # The target's git checkout; the campaign's branch and commits live there.
    repo: Path | None = None
    # The files a candidate may change, relative to `repo`.
    kernel_source: list[str] = []
    # Writes the frozen summary CSV to {csv}, for every shape (or those in the YAML file {shapes}).
    benchmark_command: str | None = None
    # The same on the representative shapes (default: benchmark_command with {shapes}, or all shapes).
    quick_command: str | None = None
    # Rebuilds compiled sources (C++/HIP/CUDA) before anything is tested or measured.
    rebuild_command: str | None = None
    # repo: work in the checkout itself (it is switched to the campaign branch). workspace: work in a git
    # worktree of it in the campaign dir, and sync the best files back into the checkout at the end.
    execution_mode: Literal["repo", "workspace"] = "repo"
    # The target's tuned table (a file of kernel_source with TUNABLE_SPACE and TUNED_TABLE literals and
    # `buckets_for(dims, variant)`, as turbo-opt's kernels/<op>/tuning.py): what the search proposer rewrites.
    tuned_table: str | None = None
    # The CSV's schema: a declared name (gemm, attention, ...) or a declaration; default: any declared
    # schema whose columns the CSV holds.
    csv_schema: str | SchemaDeclaration | None = None
    # What a kernel-optimize manifest said that turbo-opt does not act on (kept for the report).
    metadata: dict[str, Any] = {}

    @field_validator("proposer", mode="before")
    @classmethod
    def _proposer_by_name(cls, value: Any) -> Any:
        """`proposer: manual` is short for `proposer: {kind: manual}`."""
        return {"kind": value} if isinstance(value, str) else value

    @field_validator("repo")
    @classmethod
    def _absolute_repo(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser().resolve()

    @model_validator(mode="after")
    def _check_against_the_op(self) -> Manifest:
        if self.max_iterations > load_rules().max_iterations:
            raise ValueError(f"max_iterations exceeds the rules' limit of {load_rules().max_iterations}")
        if self.csv_schema is not None:
            self.schema  # noqa: B018 (an unknown name, or a declaration clashing with a declared schema, fails here)
        if self.repo is not None:
            return self._check_external()
        external = [f for f in ("kernel_source", "benchmark_command", "quick_command", "rebuild_command", "tuned_table")
                    if getattr(self, f)]
        if external or self.execution_mode != "repo":
            raise ValueError(f"{', '.join(external) or 'execution_mode'} needs `repo` (an external target)")
        if self.shapes is None:
            raise ValueError("shapes: a preset, a YAML shape file or a list of shapes is required")
        try:
            spec = get_spec(self.op)
        except UserError as exc:
            raise ValueError(str(exc)) from None
        if self.variant is not None and self.variant not in spec.variants:
            raise ValueError(f"variant '{self.variant}' is not one of {', '.join(spec.variants)}")
        outside = [f for f in self.mutable_files if f not in spec.mutable_files]
        if outside:
            raise ValueError(f"mutable_files {outside} are not mutable files of {self.op}: {list(spec.mutable_files)}")
        return self

    def _check_external(self) -> Manifest:
        assert self.repo is not None
        if not self.kernel_source:
            raise ValueError("an external target (repo) needs kernel_source: the files a candidate may change")
        for path in self.kernel_source:
            if Path(path).is_absolute() or ".." in Path(path).parts:
                raise ValueError(f"kernel_source '{path}' must be a path inside repo, relative to it")
        if not self.benchmark_command:
            raise ValueError("an external target (repo) needs benchmark_command, writing the summary CSV to {csv}")
        for field in ("benchmark_command", "quick_command"):
            command = getattr(self, field)
            if command is not None and CSV_PLACEHOLDER not in command:
                raise ValueError(f"{field} must write the summary CSV to the path turbo-opt gives it: "
                                 f"put {CSV_PLACEHOLDER} in it")
        if self.shapes is None and SHAPES_PLACEHOLDER in self.benchmark_command:
            raise ValueError(f"benchmark_command takes {SHAPES_PLACEHOLDER}: list the shapes it is to run")
        if self.mutable_files:
            raise ValueError("mutable_files is for turbo-opt's own ops: an external target lists kernel_source")
        if self.tuned_table is not None and self.tuned_table not in self.kernel_source:
            raise ValueError(f"tuned_table '{self.tuned_table}' must be one of kernel_source (the search rewrites it)")
        if isinstance(self.shapes, str):
            raise ValueError("shapes: an external target lists its shapes (or leaves them to its benchmark)")
        return self

    @property
    def external(self) -> bool:
        return self.repo is not None

    @property
    def in_workspace(self) -> bool:
        """An external target worked on in a worktree of its repository inside the campaign dir."""
        return self.repo is not None and self.execution_mode == "workspace"

    @property
    def schema(self) -> CsvSchema | None:
        """The summary CSV schema the campaign reads (None: any declared one)."""
        if isinstance(self.csv_schema, SchemaDeclaration):
            return register_schema(self.csv_schema.schema())
        if self.csv_schema is not None and self.csv_schema not in SCHEMAS:
            raise ValueError(f"csv_schema '{self.csv_schema}' is not declared ({', '.join(SCHEMAS)}): "
                             "declare it as {name, dims, metric, outputs}")
        return SCHEMAS.get(self.csv_schema) if self.csv_schema else None

    @property
    def name(self) -> str:
        if self.campaign is None:
            raise ValueError("the manifest has no campaign name yet")
        return self.campaign

    @property
    def files(self) -> list[str]:
        if self.external:
            return list(self.kernel_source)
        return self.mutable_files or list(get_spec(self.op).mutable_files)

    @property
    def resolved_variant(self) -> str:
        if self.external:
            return self.variant or "default"
        return self.variant or get_spec(self.op).variants[0]


def default_campaign_name(op: str) -> str:
    return f"{op}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def load_manifest(path: Path, warn: Callable[[str], None] | None = None) -> Manifest:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise UserError(f"cannot read manifest {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    return parse_manifest(data, str(path), warn)


def parse_manifest(data: object, source: str, warn: Callable[[str], None] | None = None) -> Manifest:
    """A manifest from its YAML data, in turbo-opt's field names or kernel-optimize's (agent/template.py);
    what the latter says that turbo-opt does not act on is kept in `metadata` and reported to `warn`."""
    from agent.template import from_template, is_template

    if is_template(data):
        assert isinstance(data, dict)
        data, notes = from_template(data, Path(source).parent if source.endswith((".yaml", ".yml")) else Path.cwd())
        for note in notes if warn else []:
            warn(f"{source}: {note}")
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise UserError(first_error(exc, source)) from None


def manifest_text(manifest: Manifest) -> str:
    return yaml.safe_dump(manifest.model_dump(mode="json"), sort_keys=False)


def write_manifest(manifest: Manifest, path: Path) -> Path:
    return atomic_write_text(path, manifest_text(manifest))
