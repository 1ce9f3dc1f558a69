import csv
import math

import pytest
from typer.testing import CliRunner

from agent.cli import app
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


def template_csv(path, rows, extra_after=("label",), unlabel=None, fail=()):
    """A summary written the way kernel-optimize's quick_test_bench.py writes one: csv.DictWriter on the
    header (CRLF line endings, Python float reprs), extra columns beside the frozen ones, and a shape
    that failed before it had a label written as "?"."""
    columns = list(GEMM.columns)
    for anchor in extra_after:
        columns.insert(columns.index(anchor) + 1, f"note_{anchor}")
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            row = dict(row)
            if row["label"] in fail:
                row |= {"Check": "FAIL", "Forward TFLOPS": math.nan, "Backward TFLOPS": math.inf}
            if row["label"] == unlabel:
                row |= {"label": "?", "Check": "FAIL"}
            writer.writerow(row | {c: "deepseek-v3 gateup" for c in columns if c.startswith("note_")})
    return path


def test_a_template_written_csv_is_read_and_gated(tmp_path):
    base = summary(tmp_path, "b.csv", rows())
    same = read_summary(template_csv(tmp_path / "c.csv", rows(), extra_after=("label", "db_snr")))
    assert b"\r\n" in (tmp_path / "c.csv").read_bytes()
    assert same.extra_columns == ("note_label", "note_db_snr") and same.labels == list(LABELS)
    assert compare(base, same).passed
    failed = read_summary(template_csv(tmp_path / "d.csv", rows(), fail=("c",)))
    assert compare(base, failed).failures == ("c: candidate is FAIL",)


def test_an_unlabeled_fail_row_is_a_failing_verdict_not_a_shape_mismatch(tmp_path):
    base = summary(tmp_path, "b.csv", rows())
    cand = read_summary(template_csv(tmp_path / "c.csv", rows(), unlabel="b"))
    assert cand.unlabeled_failures == 1 and cand.labels == ["a", "c"]
    result = compare(base, cand)
    assert not result.passed
    assert result.failures == ("b: missing from the candidate, which has unlabeled FAIL rows",
                               "1 candidate row(s) FAIL without a label ('?')")
    assert [s.label for s in result.shapes] == ["a", "c"]
    with pytest.raises(UserError, match="different shapes"):  # a missing shape with no FAIL row to explain it
        compare(base, summary(tmp_path, "e.csv", rows()[:2]))


def test_the_gate_command_exits_1_on_a_template_fail_and_names_the_ignored_columns(tmp_path):
    base = write_summary(tmp_path / "b.csv", GEMM, rows())
    cand = template_csv(tmp_path / "c.csv", rows(), unlabel="a")
    result = CliRunner().invoke(app, ["gate", str(base), str(cand)])
    assert result.exit_code == 1, result.output
    assert "ignored: note_label" in result.output and "gate FAIL" in result.output


def forward_only_csv(path, rates):
    """A memory-bound kernel's summary that no turbo-opt op declares, forward only, written the template's way."""
    # Dims and outputs no test declares (a campaign's manifest registers its schema for the whole process).
    columns = ["label", "elements", "Check", "Forward GB/s", "Forward GB/s_stddev", "Backward GB/s",
               "Backward GB/s_stddev", "Forward Time (ms)", "Backward Time (ms)", "z_snr"]
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=columns)
        writer.writeheader()
        for (label, n), rate in zip((("n384", 384), ("n640", 640)), rates, strict=True):
            writer.writerow({"label": label, "elements": n, "Check": "PASS", "Forward GB/s": rate,
                             "Forward GB/s_stddev": 0.0, "Backward GB/s": math.nan, "Backward GB/s_stddev": math.nan,
                             "Forward Time (ms)": 12 * n / rate / 1e6, "Backward Time (ms)": math.nan,
                             "z_snr": 150.0})
    return path


@pytest.mark.parametrize("rates, exit_code", [((100.0, 200.0), 0), ((100.0, 180.0), 1)])
def test_an_undeclared_forward_only_csv_is_gated_on_its_forward(tmp_path, rates, exit_code):
    base = forward_only_csv(tmp_path / "b.csv", (100.0, 200.0))
    cand = forward_only_csv(tmp_path / "c.csv", rates)
    result = CliRunner().invoke(app, ["gate", str(base), str(cand)])
    assert result.exit_code == exit_code, result.output
    assert "gated on forward, not step" in result.output
    with pytest.raises(UserError, match="header is not"):  # only the gate reads an undeclared header
        read_summary(base)
