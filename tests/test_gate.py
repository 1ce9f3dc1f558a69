import pytest

from harness.errors import UserError
from harness.gate import compare
from harness.schema import GEMM, read_summary, write_summary
from tests.test_schema import gemm_row

LABELS = ("a", "b", "c")


def summary(tmp_path, name, rows):
    return read_summary(write_summary(tmp_path / name, GEMM, rows))


def rows(scale=None, checks=None):
    scale, checks = scale or {}, checks or {}
    return [
        gemm_row(label, check=checks.get(label, "PASS"), fwd=100.0 * s, bwd=90.0 * s)
        for label, s in ((label, scale.get(label, 1.0)) for label in LABELS)
    ]


def test_identical_copy_passes(tmp_path):
    result = compare(summary(tmp_path, "b.csv", rows()), summary(tmp_path, "c.csv", rows()))
    assert result.passed and result.geomean == pytest.approx(1.0)


def test_fail_row_fails(tmp_path):
    result = compare(summary(tmp_path, "b.csv", rows()), summary(tmp_path, "c.csv", rows(checks={"b": "FAIL"})))
    assert not result.passed
    assert result.failures == ("b: candidate is FAIL",)


@pytest.mark.parametrize("metric", ["forward", "backward", "step"])
def test_ten_percent_slower_shape_fails_at_five(tmp_path, metric):
    base, cand = summary(tmp_path, "b.csv", rows()), summary(tmp_path, "c.csv", rows(scale={"c": 0.9}))
    result = compare(base, cand, metric=metric, max_regression_pct=5)
    assert not result.passed and len(result.failures) == 1 and result.failures[0].startswith("c: 0.900x")
    assert compare(base, cand, metric=metric, max_regression_pct=15).passed


def test_small_slowdown_within_limit_passes_and_geomean_counts_pass_rows_only(tmp_path):
    base = summary(tmp_path, "b.csv", rows(checks={"a": "FAIL"}))
    cand = summary(tmp_path, "c.csv", rows(scale={"a": 5.0, "b": 0.96, "c": 1.21}))
    result = compare(base, cand, max_regression_pct=5)
    assert result.passed
    assert result.geomean == pytest.approx((0.96 * 1.21) ** 0.5)


def test_mismatched_shapes_are_a_user_error(tmp_path):
    base = summary(tmp_path, "b.csv", rows())
    with pytest.raises(UserError, match="different shapes"):
        compare(base, summary(tmp_path, "c.csv", rows()[:2]))
    other_dims = rows()
    other_dims[1]["M"] = 4096
    with pytest.raises(UserError, match="'b' has different dims"):
        compare(base, summary(tmp_path, "d.csv", other_dims))
    with pytest.raises(UserError, match="unknown metric"):
        compare(base, base, metric="latency")
