import dataclasses
import io
import itertools
import json
import math

import pytest
from rich.console import Console
from typer.testing import CliRunner

import kernels.gemm
from harness.__main__ import app
from harness.cli import HOST_MARK, render_bench
from harness.meta import harness_hash, read_meta
from harness.quick_test_bench import run_bench, write_bench
from harness.registry import get_spec, op_names
from harness.schema import GEMM_HEADER, read_summary
from harness.shapes import Shape, load_shapes
from harness.timing import timing_note
from kernels.common.device import interpreter_mode


def test_registry_discovers_gemm():
    assert "gemm" in op_names()
    spec = get_spec("gemm")
    assert spec.schema == "gemm" and spec.outputs == ("out", "da", "db")
    assert all(f.startswith("kernels/gemm/") for f in spec.mutable_files)


def test_smoke_bench_writes_frozen_csv_and_sidecar(tmp_path):
    run = run_bench(get_spec("gemm"), load_shapes("dense_gemm", "smoke"), shapes_source="smoke",
                    repeats=1, warmup=0, compare_baselines=True)
    assert run.all_pass
    written = write_bench(run, tmp_path / "out.csv")
    assert (tmp_path / "out.csv").read_text().splitlines()[0] == GEMM_HEADER
    summary = read_summary(tmp_path / "out.csv")
    assert set(summary.frame["Check"]) == {"PASS"}
    assert (summary.frame[["out_snr", "da_snr", "db_snr"]] > 50).all().all()
    meta = read_meta(tmp_path / "out.csv")
    on_gpu = not interpreter_mode()
    assert meta.timing.mode == ("cuda-events" if on_gpu else "interpreter-wallclock")
    assert meta.timing.note == timing_note(meta.timing.mode) and ("interpreter" in meta.timing.note) != on_gpu
    assert meta.harness_hash == harness_hash() and meta.dtype == ("bf16" if on_gpu else "fp16")
    baseline = tmp_path / meta.baseline_csvs["torch.matmul"]
    assert baseline in written and read_summary(baseline).labels == summary.labels
    assert json.loads((tmp_path / "out.meta.json").read_text())["op"] == "gemm"


def test_baselines_are_checked_on_the_inputs_their_reference_is_of():
    """Every runner is checked on the values the shape's reference was computed on before any re-check
    refills the inputs (else every baseline FAILs)."""
    run = run_bench(get_spec("gemm"), load_shapes("dense_gemm", "smoke")[:1], shapes_source="smoke",
                    repeats=1, warmup=0, compare_baselines=True)
    assert [r.check for results in run.results.values() for r in results] == ["PASS", "PASS"]


def _logged(runner, log, fail_after=None):
    """The runner with each forward and backward call logged under its name; with `fail_after`, its forward
    raises from that call on."""
    def forward(problem, inputs, outputs):
        log.append(runner.name)
        if fail_after is not None and log.count(runner.name) > fail_after:
            raise RuntimeError("illegal memory access")
        return runner.forward(problem, inputs, outputs)

    def backward(problem, inputs, outputs):
        log.append(runner.name)
        return runner.backward(problem, inputs, outputs)
    return dataclasses.replace(runner, forward=forward, backward=backward)


def test_ours_and_the_baselines_are_timed_in_interleaved_rounds():
    """Timed one after the other, the runner timed later reads faster or slower (up to 8% on the H100):
    the runners take turns, round after round, and the sidecar says how many rounds."""
    gemm, log = get_spec("gemm"), []
    spec = dataclasses.replace(gemm, runner=_logged(gemm.runner, log),
                               baselines=tuple(_logged(b, log) for b in gemm.baselines))
    run = run_bench(spec, load_shapes("dense_gemm", "smoke")[:1], shapes_source="smoke", repeats=10, warmup=1,
                    compare_baselines=True, checks="basic")
    assert run.all_pass
    turns = sum(1 for before, after in itertools.pairwise(log) if before != after)
    assert turns >= 5, log  # back to back: ours' calls, then the baseline's (one turn)


def test_a_baseline_that_fails_while_timed_fails_alone(tmp_path):
    gemm = get_spec("gemm")
    spec = dataclasses.replace(gemm, baselines=tuple(_logged(b, [], fail_after=3) for b in gemm.baselines))
    run = run_bench(spec, load_shapes("dense_gemm", "smoke")[:1], shapes_source="smoke", repeats=6, warmup=1,
                    compare_baselines=True, checks="basic")
    ours, (baseline,) = run.ours[0], run.results["torch.matmul"]
    assert ours.check == "PASS" and math.isfinite(ours.fwd.median_ms) and math.isfinite(ours.bwd.median_ms)
    assert baseline.check == "FAIL" and "illegal memory access" in baseline.error
    write_bench(run, tmp_path / "out.csv")
    assert read_meta(tmp_path / "out.csv").timing.rounds == 5


def test_host_bound_passes_are_marked_in_the_table_and_named_in_the_sidecar(tmp_path):
    """A pass whose samples were mostly its host time (Timing.host_bound, set by the timer on a GPU) gets
    the table's mark and its caption, and the sidecar names it; the other passes get neither."""
    run = run_bench(get_spec("gemm"), load_shapes("dense_gemm", "smoke")[:2], shapes_source="smoke", repeats=1,
                    warmup=0, compare_baselines=True, checks="basic")
    # Set by hand: on a GPU, the smoke shapes' passes are host-bound in fact.
    run.ours[:] = [dataclasses.replace(r, fwd=dataclasses.replace(r.fwd, host_bound=0.8 if i == 0 else 0.0),
                                       bwd=dataclasses.replace(r.bwd, host_bound=0.0)) for i, r in enumerate(run.ours)]
    first = run.ours[0]
    console = Console(file=io.StringIO(), width=400)
    console.print(render_bench(run))
    table = console.file.getvalue()
    marked = [line for line in table.splitlines() if HOST_MARK in line]
    assert len(marked) == 2 and first.shape.label in marked[0] and "host-bound" in marked[1]
    write_bench(run, tmp_path / "out.csv")
    assert read_meta(tmp_path / "out.csv").host_bound == {first.shape.label: ["fwd"]}
    baseline = read_meta(tmp_path / "out.baseline-torch_matmul.csv").host_bound
    assert baseline == {r.shape.label: r.host_bound for r in run.results["torch.matmul"] if r.host_bound}


def test_a_shape_that_raises_is_a_fail_row_and_the_run_goes_on(tmp_path):
    shapes = [
        Shape(label="ok", dims={"M": 40, "N": 24, "K": 16}),
        Shape(label="batched", dims={"B": 3, "M": 40, "N": 24, "K": 16}),  # dense gemm refuses B != 1
        Shape(label="ok-too", dims={"M": 24, "N": 40, "K": 32}),
    ]
    run = run_bench(get_spec("gemm"), shapes, shapes_source="test", repeats=1, warmup=0)
    assert [r.check for r in run.ours] == ["PASS", "FAIL", "PASS"]
    write_bench(run, tmp_path / "out.csv")
    row = read_summary(tmp_path / "out.csv").frame.set_index("label").loc["batched"]
    assert all(math.isnan(row[c]) for c in ("Forward TFLOPS", "Backward Time (ms)", "out_snr"))
    assert "B must be 1" in read_meta(tmp_path / "out.csv").errors["batched"]


def test_wrong_results_fail_the_check():
    spec = get_spec("gemm")

    def forward_that_skips_the_last_row(problem, inputs, outputs):
        spec.runner.forward(problem, inputs, outputs)
        outputs["out"][-1].zero_()

    broken = dataclasses.replace(spec, runner=dataclasses.replace(spec.runner, forward=forward_that_skips_the_last_row))
    shape = Shape(label="s", dims={"M": 64, "N": 48, "K": 32})
    run = run_bench(broken, [shape], shapes_source="t", repeats=1, warmup=0)
    (result,) = run.ours
    assert result.check == "FAIL" and result.snrs["out"] < 40 and result.snrs["da"] > 50


def test_outputs_are_poisoned_before_the_checked_run():
    spec = get_spec("gemm")

    def backward_that_forgets_db(problem, inputs, outputs):
        spec.runner.backward(problem, inputs, {"da": outputs["da"], "db": outputs["db"].clone()})

    lazy = dataclasses.replace(spec, runner=dataclasses.replace(spec.runner, backward=backward_that_forgets_db))
    run = run_bench(lazy, [Shape(label="s", dims={"M": 32, "N": 32, "K": 32})], shapes_source="t", repeats=1, warmup=0)
    assert run.ours[0].check == "FAIL" and run.ours[0].snrs["db"] == -math.inf


def test_unsupported_dtype_is_refused():
    from harness.errors import UserError

    with pytest.raises(UserError, match="does not support dtype 'fp32'"):
        run_bench(get_spec("gemm"), load_shapes("dense_gemm", "smoke"), shapes_source="smoke", dtype="fp32")


@pytest.mark.parametrize(("op", "variant"), [("grouped_gemm", None), ("grouped_gemm_fp8", "hybrid-blockwise")])
def test_grouped_smoke_bench_passes_on_skewed_and_empty_groups(op, variant):
    shapes = load_shapes("grouped_gemm", "smoke")
    assert any(0 in s.group_lens for s in shapes) and any(max(s.group_lens) >= sum(s.group_lens) / 2 for s in shapes)
    run = run_bench(get_spec(op), shapes, shapes_source="smoke", variant=variant, repeats=1, warmup=0)
    assert run.all_pass, [(r.shape.label, r.snrs, r.error) for r in run.ours]


def test_unknown_variant_is_refused():
    from harness.errors import UserError

    with pytest.raises(UserError, match="no variant 'e4m3-columnwise'"):
        run_bench(get_spec("grouped_gemm_fp8"), load_shapes("grouped_gemm", "smoke"), shapes_source="smoke",
                  variant="e4m3-columnwise")


def _cheating(spec, forward=None, backward=None):
    runner = dataclasses.replace(spec.runner, forward=forward or spec.runner.forward,
                                 backward=backward or spec.runner.backward)
    return dataclasses.replace(spec, runner=runner)


def _only(spec, checks="full", **cheat):
    shape = Shape(label="s", dims={"M": 64, "N": 48, "K": 32})
    (result,) = run_bench(_cheating(spec, **cheat), [shape], shapes_source="t", repeats=2, warmup=1,
                          checks=checks).ours
    return result


def test_a_runner_that_writes_into_its_input_fails():
    spec = get_spec("gemm")

    def forward(problem, inputs, outputs):
        spec.runner.forward(problem, inputs, outputs)
        inputs["a"].add_(1.0)

    result = _only(spec, forward=forward)
    assert result.check == "FAIL" and "wrote into its input(s) a" in result.error


def test_an_identity_keyed_cache_fails_the_recheck_after_timing():
    spec = get_spec("gemm")
    cache = {}

    def forward(problem, inputs, outputs):
        key = inputs["a"].data_ptr()
        if key not in cache:
            spec.runner.forward(problem, inputs, outputs)
            cache[key] = outputs["out"].clone()
        outputs["out"].copy_(cache[key])

    result = _only(spec, forward=forward)
    assert result.check == "FAIL" and "wrong after timing on refilled inputs: out" in result.error


@pytest.mark.parametrize(("checks", "message"), [("basic", "wrong after timing"), ("full", "check: timed output: out")])
def test_results_that_go_wrong_after_a_few_calls_fail(checks, message):
    spec = get_spec("gemm")
    calls = [0]

    def forward(problem, inputs, outputs):
        calls[0] += 1
        spec.runner.forward(problem, inputs, outputs)
        if calls[0] > 3:
            outputs["out"].mul_(0.5)

    # The full checks see the timed calls' outputs go wrong; the basic ones only the re-check after timing.
    assert message in _only(spec, checks=checks, forward=forward).error


def test_zeros_fail_with_their_own_reason():
    spec = get_spec("gemm")

    def forward(problem, inputs, outputs):
        outputs["out"].zero_()

    assert "output out is ~zero" in _only(spec, forward=forward).error


def test_grouped_checks_cover_skew_even_on_uniform_shapes():
    spec = get_spec("grouped_gemm")

    def uniform_only(problem, inputs, outputs):
        lens = inputs["group_lens_host"].tolist()
        if len(set(lens)) > 1:  # a shortcut that is only right when every group is the same size
            outputs["out"].zero_()
            return
        spec.runner.forward(problem, inputs, outputs)

    shape = Shape(label="u", dims={"B": 4, "M": 32, "N": 40, "K": 24}, group_lens=(32, 32, 32, 32))
    (result,) = run_bench(_cheating(spec, forward=uniform_only), [shape], shapes_source="t", repeats=1,
                          warmup=0).ours
    assert (result.check == "FAIL" and "wrong on split" in result.error) or "~zero" in result.error


def test_probes_go_to_the_sidecar_not_the_csv(tmp_path):
    shape = Shape(label="s", dims={"M": 64, "N": 48, "K": 32})
    run = run_bench(get_spec("gemm"), [shape], shapes_source="t", repeats=1, warmup=0, probe_seed=3)
    write_bench(run, tmp_path / "out.csv")
    meta = read_meta(tmp_path / "out.csv")
    assert meta.checks == "full" and meta.probe_errors == {}
    assert meta.probes == [p.label for p in run.probes] and meta.probes[0].startswith("probe/ragged-1 (B=1,M=")
    assert read_summary(tmp_path / "out.csv").labels == ["s"]


def test_a_failed_probe_fails_the_bench_unless_checks_are_basic(tmp_path, monkeypatch):
    real = kernels.gemm.matmul

    def matmul(a, b, out=None, out_dtype=None, config=None):  # right only when every dim is even
        result = real(a, b, out=out, out_dtype=out_dtype, config=config)
        return result.mul_(0.5) if any(d % 2 for d in (*a.shape, b.shape[1])) else result

    monkeypatch.setattr(kernels.gemm, "matmul", matmul)
    (tmp_path / "even.yaml").write_text("- {label: even, M: 64, N: 48, K: 32}\n")
    args = ["bench", "--op", "gemm", "--shapes", str(tmp_path / "even.yaml"), "--repeats", "1",
            "--summary-csv", str(tmp_path / "out.csv"), "--probe-seed", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "probe/ragged-1 (B=1," in result.output and "check: wrong: out" in result.output
    assert "1 PASS, 0 FAIL; probes:" in result.output
    assert read_meta(tmp_path / "out.csv").probe_errors
    basic = CliRunner().invoke(app, [*args, "--checks", "basic"])
    assert basic.exit_code == 0, basic.output
    assert read_meta(tmp_path / "out.csv").checks == "basic" and read_meta(tmp_path / "out.csv").probes == []
    bad = CliRunner().invoke(app, [*args, "--checks", "none"])
    assert bad.exit_code == 2 and "unknown check level 'none'" in bad.output
