import pytest

from harness.errors import UserError
from harness.rules import RULES_PATH, load_rules


def test_rules_file_has_every_number_later_issues_read():
    rules = load_rules()
    assert {"fp16", "bf16", "e4m3", "e5m2"} <= set(rules.snr_thresholds_db)
    assert rules.noise_floor_pct > 0 and rules.remeasure_count >= 1
    assert rules.per_shape_regression_pct == 5.0
    assert rules.stagnation_rollbacks >= 1 and rules.max_iterations < 120


def test_rules_prose_names_every_number():
    prose = RULES_PATH.with_suffix(".md").read_text()
    for key in load_rules().model_dump():
        assert f"`{key}`" in prose, key


def test_bad_rules_field_is_named(tmp_path):
    bad = tmp_path / "rules.yaml"
    bad.write_text(RULES_PATH.read_text().replace("max_iterations: 119", "max_iterations: 500"))
    with pytest.raises(UserError, match="field 'max_iterations'"):
        load_rules(bad)
