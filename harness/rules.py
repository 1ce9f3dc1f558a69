"""rules/iteration_rules.yaml as a validated model: the numbers every verdict is made with."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError

from harness.errors import UserError
from harness.files import REPO_ROOT

RULES_PATH = REPO_ROOT / "rules" / "iteration_rules.yaml"


class IterationRules(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    snr_thresholds_db: dict[str, float]
    noise_floor_pct: float = Field(ge=0)
    remeasure_count: PositiveInt
    per_shape_regression_pct: float = Field(ge=0)
    fresh_gain_fraction: float = Field(ge=0, le=1)
    reproduction_fraction: float = Field(gt=0, le=1)
    fresh_input_sets: int = Field(ge=2)
    cache_gap_pct: float = Field(gt=0)
    probe_shapes: PositiveInt
    implausible_speedup: float = Field(gt=1)
    reference_outlier_pct: float = Field(gt=0)
    roofline_margin: float = Field(ge=1)
    stagnation_rollbacks: PositiveInt
    max_iterations: int = Field(gt=0, lt=120)

    def snr_threshold(self, fmt: str) -> float:
        try:
            return self.snr_thresholds_db[fmt]
        except KeyError:
            known = ", ".join(self.snr_thresholds_db)
            raise UserError(f"no SNR threshold for format '{fmt}' in rules (known: {known})") from None


def first_error(exc: ValidationError, source: str) -> str:
    """One line naming the first invalid field of a pydantic error."""
    err = exc.errors()[0]
    where = ".".join(str(part) for part in err["loc"]) or "(top level)"
    return f"{source}: field '{where}': {err['msg']}"


@lru_cache(maxsize=4)
def load_rules(path: Path = RULES_PATH) -> IterationRules:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise UserError(f"cannot read rules file {path}: {exc.strerror}") from None
    try:
        return IterationRules.model_validate(data)
    except ValidationError as exc:
        raise UserError(first_error(exc, str(path))) from None
