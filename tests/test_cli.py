import shutil

import pytest
from typer.testing import CliRunner

from agent.cli import app
from harness.schema import GEMM_HEADER

runner = CliRunner()


@pytest.fixture(scope="module")
def smoke_csv(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "out.csv"
    args = ["bench", "--op", "gemm", "--shapes", "smoke", "--summary-csv", str(out), "--repeats", "1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return out


def test_ops_lists_gemm_and_presets():
    result = runner.invoke(app, ["ops"])
    assert result.exit_code == 0
    assert "gemm" in result.output and "llama3-8b" in result.output and "torch.matmul" in result.output


def test_bench_writes_the_frozen_header(smoke_csv):
    assert smoke_csv.read_text().splitlines()[0] == GEMM_HEADER
    assert smoke_csv.with_suffix(".meta.json").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bench", "--op", "gemmm"], "error: unknown op 'gemmm' (registered: attention, gemm"),
        (["bench", "--op", "gemm", "--shapes", "llama9"], "error: unknown shape preset 'llama9'"),
        (["bench", "--op", "gemm", "--timing", "cuda-events"], "error: timing mode 'cuda-events' needs a CUDA device"),
    ],
)
def test_bad_bench_arguments_exit_2_with_one_line(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [result.output.strip()] and result.output.startswith(message)


def _gate(*args):
    return runner.invoke(app, ["gate", *map(str, args)])


def test_gate_passes_on_identical_copy(smoke_csv, tmp_path):
    copy = shutil.copy(smoke_csv, tmp_path / "cand.csv")
    result = _gate(smoke_csv, copy)
    assert result.exit_code == 0, result.output
    assert "gate PASS" in result.output


def test_gate_fails_on_a_fail_row(smoke_csv, tmp_path):
    lines = smoke_csv.read_text().splitlines()
    lines[2] = lines[2].replace(",PASS,", ",FAIL,")
    (tmp_path / "cand.csv").write_text("\n".join(lines) + "\n")
    result = _gate(smoke_csv, tmp_path / "cand.csv")
    assert result.exit_code == 1 and "candidate is FAIL" in result.output


def test_gate_fails_on_a_shape_ten_percent_slower(smoke_csv, tmp_path):
    import pandas as pd

    frame = pd.read_csv(smoke_csv)
    row = frame.index[1]
    for rate, time in (("Forward TFLOPS", "Forward Time (ms)"), ("Backward TFLOPS", "Backward Time (ms)")):
        frame.loc[row, rate] *= 0.9
        frame.loc[row, time] /= 0.9
    frame.to_csv(tmp_path / "cand.csv", index=False)
    result = _gate(smoke_csv, tmp_path / "cand.csv", "--max-regression", 5)
    assert result.exit_code == 1 and "10.0% slower" in result.output
    assert _gate(smoke_csv, tmp_path / "cand.csv", "--max-regression", 12).exit_code == 0


def test_gate_exits_2_on_a_renamed_column(smoke_csv, tmp_path):
    text = smoke_csv.read_text().replace("Backward TFLOPS,", "Bwd TFLOPS,", 1)
    (tmp_path / "cand.csv").write_text(text)
    result = _gate(smoke_csv, tmp_path / "cand.csv")
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: {tmp_path / 'cand.csv'}: header is not the 'gemm' schema: "
        "column 9 is 'Bwd TFLOPS', expected 'Backward TFLOPS'"
    )


def test_gate_exits_2_on_missing_file_and_different_shapes(smoke_csv, tmp_path):
    assert _gate(smoke_csv, tmp_path / "nope.csv").exit_code == 2
    lines = smoke_csv.read_text().splitlines()
    (tmp_path / "cand.csv").write_text("\n".join(lines[:-1]) + "\n")
    result = _gate(smoke_csv, tmp_path / "cand.csv")
    assert result.exit_code == 2 and "different shapes" in result.output
