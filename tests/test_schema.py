import math

import pytest

from harness.errors import UserError
from harness.schema import GEMM, CsvSchema, get_schema, read_summary, register_schema, write_summary

FROZEN = (
    "label,B,M,N,K,Check,Forward TFLOPS,Forward TFLOPS_stddev,Backward TFLOPS,Backward TFLOPS_stddev,"
    "Forward Time (ms),Backward Time (ms),out_snr,da_snr,db_snr"
)


def gemm_row(label="s1", check="PASS", fwd=100.0, bwd=90.0, **dims):
    d = {"B": 1, "M": 64, "N": 32, "K": 16} | dims
    return {
        "label": label, **d, "Check": check,
        "Forward TFLOPS": fwd, "Forward TFLOPS_stddev": 1.5, "Backward TFLOPS": bwd, "Backward TFLOPS_stddev": 2.0,
        "Forward Time (ms)": 0.25, "Backward Time (ms)": 0.5, "out_snr": 55.0, "da_snr": math.inf, "db_snr": math.nan,
    }


def test_gemm_header_is_frozen_byte_for_byte():
    assert GEMM.header == FROZEN


# The memory-bound MoE ops: GB/s of the bytes they move, their dims and outputs.
FROZEN_MOE = {
    "moe_permute": "label,T,H,E,topk,pad_to,Check,Forward GB/s,Forward GB/s_stddev,Backward GB/s,Backward GB/s_stddev,"
                   "Forward Time (ms),Backward Time (ms),out_snr,out_probs_snr,dx_snr,dprobs_snr",
    "moe_unpermute": "label,T,H,E,topk,pad_to,Check,Forward GB/s,Forward GB/s_stddev,Backward GB/s,"
                     "Backward GB/s_stddev,Forward Time (ms),Backward Time (ms),out_snr,dh_snr,dprobs_snr",
    "moe_router": "label,T,E,topk,n_group,topk_group,sigmoid,Check,Forward GB/s,Forward GB/s_stddev,Backward GB/s,"
                  "Backward GB/s_stddev,Forward Time (ms),Backward Time (ms),probs_snr,aux_loss_snr,z_loss_snr,"
                  "dlogits_snr",
}
FROZEN_MOE_MLP = ("label,T,H,I,E,topk,Check,Forward TFLOPS,Forward TFLOPS_stddev,Backward TFLOPS,"
                  "Backward TFLOPS_stddev,Forward Time (ms),Backward Time (ms),out_snr,dx_snr,dprobs_snr,"
                  "dw_gate_up_snr,dw_down_snr")


def test_moe_headers_are_frozen_byte_for_byte_and_count_bytes():
    for name, header in FROZEN_MOE.items():
        schema = get_schema(name)
        assert schema.header == header and schema.counts_bytes and schema.unit == 1e9
    assert not GEMM.counts_bytes and GEMM.unit == 1e12
    assert get_schema("moe_mlp").header == FROZEN_MOE_MLP and not get_schema("moe_mlp").counts_bytes
    with pytest.raises(ValueError, match="metric must be one of TFLOPS, GB/s"):
        CsvSchema("bad", ("T",), "GiB/s", ("out",))


def test_round_trip(tmp_path):
    path = write_summary(tmp_path / "s.csv", GEMM, [gemm_row("a"), gemm_row("b", check="FAIL", M=7)])
    assert path.read_text().splitlines()[0] == FROZEN
    summary = read_summary(path)
    assert summary.schema is GEMM and summary.labels == ["a", "b"]
    frame = summary.frame
    assert list(frame["Check"]) == ["PASS", "FAIL"]
    assert frame.loc[1, "M"] == 7
    assert frame.loc[0, "da_snr"] == math.inf and math.isnan(frame.loc[0, "db_snr"])
    assert frame.loc[0, "Forward TFLOPS"] == pytest.approx(100.0)


def test_write_refuses_rows_with_other_columns(tmp_path):
    row = gemm_row()
    row.pop("db_snr")
    with pytest.raises(ValueError, match="columns"):
        write_summary(tmp_path / "s.csv", GEMM, [row])
    assert not (tmp_path / "s.csv").exists()


def test_renamed_column_is_rejected_with_its_name(tmp_path):
    path = write_summary(tmp_path / "s.csv", GEMM, [gemm_row()])
    path.write_text(path.read_text().replace("Forward TFLOPS,", "Fwd TFLOPS,", 1))
    with pytest.raises(UserError, match="column 7 is 'Fwd TFLOPS', expected 'Forward TFLOPS'"):
        read_summary(path)


def test_missing_column_and_bad_values_are_rejected(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text(FROZEN.rsplit(",", 1)[0] + "\n")
    with pytest.raises(UserError, match="it has 14 columns, the schema has 15"):
        read_summary(path)
    write_summary(path, GEMM, [gemm_row(check="MAYBE")])
    with pytest.raises(UserError, match="'Check' is 'MAYBE'"):
        read_summary(path)
    write_summary(path, GEMM, [gemm_row(fwd="fast")])
    with pytest.raises(UserError, match="'Forward TFLOPS' is 'fast'"):
        read_summary(path)
    write_summary(path, GEMM, [gemm_row("x"), gemm_row("x")])
    with pytest.raises(UserError, match="more than once"):
        read_summary(path)
    with pytest.raises(UserError, match="cannot read"):
        read_summary(tmp_path / "missing.csv")


def test_other_ops_declare_their_own_schema(tmp_path):
    attn = register_schema(CsvSchema("attn-test", ("B", "H", "S", "D"), "TFLOPS", ("out", "dq", "dk", "dv")))
    assert attn.header.startswith("label,B,H,S,D,Check,Forward TFLOPS,")
    assert attn.header.endswith("out_snr,dq_snr,dk_snr,dv_snr")
    with pytest.raises(ValueError, match="already declared"):
        register_schema(CsvSchema("attn-test", ("B", "S"), "TFLOPS", ("out",)))
    row = {c: 1 for c in attn.columns} | {"label": "a", "Check": "PASS"}
    path = write_summary(tmp_path / "a.csv", attn, [row])
    assert read_summary(path).schema is attn
    with pytest.raises(UserError, match="not the 'gemm' schema"):
        read_summary(path, GEMM)


def test_step_metric_is_6bmnk_over_total_time(tmp_path):
    B, M, N, K, fwd_ms, bwd_ms = 2, 64, 32, 16, 0.25, 0.5
    row = gemm_row(B=B)
    row["Forward TFLOPS"] = 2 * B * M * N * K / (fwd_ms * 1e-3) / 1e12
    row["Backward TFLOPS"] = 4 * B * M * N * K / (bwd_ms * 1e-3) / 1e12
    summary = read_summary(write_summary(tmp_path / "s.csv", GEMM, [row]))
    expected = 6 * B * M * N * K / ((fwd_ms + bwd_ms) * 1e-3) / 1e12
    assert summary.metric("step")["s1"] == pytest.approx(expected, rel=1e-5)
