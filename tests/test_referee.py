"""The referee's checks of issue 13, each proven on its own: a runner (or the op's inner matmul,
patched as a kernel edit would change it) that cheats in one way is FAILed with the check's named
message, and the honest op passes every check."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time

import pytest
import torch

import kernels.gemm
from harness.probes import draw_probes
from harness.quick_test_bench import run_bench
from harness.registry import get_spec
from harness.rules import load_rules
from harness.shapes import Shape
from harness.timing import Timer

GEMM = get_spec("gemm")
# Multiples of every tile the probes' cheats below assume (16): only unannounced shapes break them.
TILE = 16
SHAPE = Shape(label="s", dims={"M": 64, "N": 48, "K": 32})
PROBE_SEED = 5


def bench(spec=GEMM, **options):
    return run_bench(spec, [SHAPE], shapes_source="t", repeats=2, warmup=1, **options)


def only(spec=GEMM, **options):
    (result,) = bench(spec, **options).ours
    return result


def with_runner(forward=None, backward=None):
    runner = dataclasses.replace(GEMM.runner, forward=forward or GEMM.runner.forward,
                                 backward=backward or GEMM.runner.backward)
    return dataclasses.replace(GEMM, runner=runner)


@pytest.fixture
def patch_matmul(monkeypatch):
    """Replace the matmul behind gemm's public functions (the runner's and autograd's path alike) with
    `make(real_matmul)`, as an edit of kernels/gemm/kernel.py would."""
    def patch(make):
        monkeypatch.setattr(kernels.gemm, "matmul", make(kernels.gemm.matmul))
    return patch


def test_the_honest_op_passes_every_check_and_probe():
    run = bench(fresh_inputs=True, probe_seed=PROBE_SEED)
    assert run.all_pass and run.ours[0].error is None, run.ours[0].error
    assert len(run.probes) == load_rules().probe_shapes + 1 and run.probe_errors == {}


def test_a_result_that_depends_on_grad_mode_fails_autograd(patch_matmul):
    def make(real):
        def matmul(a, b, out=None, out_dtype=None, config=None):
            out = real(a, b, out=out, out_dtype=out_dtype, config=config)
            return out if torch.is_grad_enabled() else out.mul_(0.5)
        return matmul

    patch_matmul(make)
    assert only().error.startswith("check: autograd: wrong with grad disabled: out")


def test_a_result_wrong_only_through_the_autograd_api_fails_autograd(patch_matmul):
    def make(real):
        def matmul(a, b, out=None, out_dtype=None, config=None):
            result = real(a, b, out=out, out_dtype=out_dtype, config=config)
            # The harness's runner passes its buffers; a training step's forward lets the op allocate.
            return result if out is not None else result.mul_(0.5)
        return matmul

    patch_matmul(make)
    assert only().error.startswith("check: autograd: out")


def test_one_output_buffer_reused_with_grad_disabled_fails_aliasing(patch_matmul):
    buffers = {}

    def make(real):
        def matmul(a, b, out=None, out_dtype=None, config=None):
            if out is None and not torch.is_grad_enabled():
                out = buffers.setdefault((a.shape[0], b.shape[1]), a.new_empty(a.shape[0], b.shape[1]))
            return real(a, b, out=out, out_dtype=out_dtype, config=config)
        return matmul

    patch_matmul(make)
    assert only().error == "check: aliasing: the second call's out shares storage with the first's"


def test_a_result_updated_by_the_next_call_fails_aliasing(patch_matmul):
    returned = []

    def make(real):
        def matmul(a, b, out=None, out_dtype=None, config=None):
            result = real(a, b, out=out, out_dtype=out_dtype, config=config)
            if out is None:  # writes every new result back into the ones it returned before
                for earlier in returned:
                    earlier.copy_(result)
                returned.append(result)
            return result
        return matmul

    patch_matmul(make)
    assert only().error == "check: aliasing: the first call's out changed when the op was called again"


def test_skipping_work_when_the_output_is_not_nan_fails_the_timed_output_check():
    def forward(problem, inputs, outputs):
        if outputs["out"].isnan().any():  # "already holds an answer" otherwise
            GEMM.runner.forward(problem, inputs, outputs)

    assert only(with_runner(forward=forward)).error.startswith("check: timed output: out")


def test_skipping_work_while_the_timer_is_on_the_stack_fails_the_timed_output_check():
    def timed() -> bool:
        frame = sys._getframe()
        while frame is not None:
            if frame.f_globals.get("__name__") == "harness.timing":
                return True
            frame = frame.f_back
        return False

    def backward(problem, inputs, outputs):
        if not timed():
            GEMM.runner.backward(problem, inputs, outputs)

    assert only(with_runner(backward=backward)).error.startswith("check: timed output: da")


def test_returning_while_a_thread_still_writes_fails_the_thread_check():
    threads = []

    def forward(problem, inputs, outputs):
        def finish():
            time.sleep(0.2)
            GEMM.runner.forward(problem, inputs, outputs)
        threads.append(threading.Thread(target=finish, name="late-writer"))
        threads[-1].start()

    result = only(with_runner(forward=forward))
    for t in threads:
        t.join()
    assert result.error == "check: thread: left 1 thread(s) running after returning (late-writer)"


def test_the_fresh_timing_of_an_identity_cache_misses_on_every_timed_call_whatever_the_repeats(monkeypatch):
    computed = [0]
    cache = {}

    def forward(problem, inputs, outputs):
        key = id(inputs["a"])
        if key not in cache:
            computed[0] += 1
            GEMM.runner.forward(problem, inputs, outputs)
            cache[key] = outputs["out"].clone()
        outputs["out"].copy_(cache[key])

    passes = []
    real_time_each = Timer.time_each

    def time_each(self, calls):
        before = computed[0]
        timing = real_time_each(self, calls)
        passes.append((computed[0] - before, len(calls), timing.samples))
        return timing

    monkeypatch.setattr(Timer, "time_each", time_each)
    sets = load_rules().fresh_input_sets
    for repeats in (2, 8):
        passes.clear()
        cache.clear()
        spec = with_runner(forward=forward)
        run_bench(spec, [SHAPE], shapes_source="t", repeats=repeats, warmup=1, fresh_inputs=True, checks="basic")
        forward_pass = passes[0]
        assert forward_pass == (sets, sets, sets), (repeats, passes)  # every timed call did the real work


def _skips_partial_tiles(problem, inputs, outputs):
    full = {name: torch.empty_like(t) for name, t in outputs.items()}
    GEMM.runner.forward(problem, inputs, full)
    M, N = full["out"].shape
    m, n = M - M % TILE, N - N % TILE
    outputs["out"][:m, :n] = full["out"][:m, :n]


def _accumulates_in_fp16(problem, inputs, outputs):
    a, b = inputs["a"].float(), inputs["b"].float()
    acc = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float16)
    for k in range(0, a.shape[1], 32):
        acc += (a[:, k:k + 32] @ b[:, k:k + 32].t()).half()
    outputs["out"].copy_(acc)


def _right_for_the_announced_k_only(problem, inputs, outputs):
    if inputs["a"].shape[1] == SHAPE.dims["K"]:
        GEMM.runner.forward(problem, inputs, outputs)
    else:  # "unrolled" in steps of the campaign's K: the rest of the reduction is dropped
        K, step = inputs["a"].shape[1], SHAPE.dims["K"]
        k = K - K % step
        outputs["out"].copy_(inputs["a"][:, :k].float() @ inputs["b"][:, :k].float().t())


@pytest.mark.parametrize(("forward", "failing"), [
    (_skips_partial_tiles, "ragged"),
    (_accumulates_in_fp16, "accumulation"),
    (_right_for_the_announced_k_only, "ragged"),
], ids=["partial-tiles", "fp16-accumulation", "hard-coded-k"])
def test_unannounced_probes_catch_what_the_announced_shapes_cannot(forward, failing):
    run = bench(with_runner(forward=forward), probe_seed=PROBE_SEED)
    assert run.ours[0].check == "PASS", run.ours[0].error  # the campaign's own shape never shows it
    assert not run.all_pass and run.probe_errors
    assert all(failing in label for label in run.probe_errors), run.probe_errors
    assert all(error.startswith("check: ") for error in run.probe_errors.values()), run.probe_errors
    expected = [p.label for p in run.probes if failing in p.label]
    assert sorted(run.probe_errors) == sorted(expected), run.probe_errors


def test_basic_checks_run_none_of_the_new_ones():
    def forward(problem, inputs, outputs):
        if outputs["out"].isnan().any():
            GEMM.runner.forward(problem, inputs, outputs)

    run = bench(with_runner(forward=forward), checks="basic", probe_seed=PROBE_SEED)
    assert run.all_pass and run.probes == [] and run.checks == "basic"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ragged_probe_shapes_are_multiples_of_no_tile(seed):
    count = load_rules().probe_shapes
    dense = draw_probes("dense_gemm", True, seed, count, interpreter=True)
    assert dense == draw_probes("dense_gemm", True, seed, count, interpreter=True)  # reproducible from the seed
    *ragged, accumulation = dense
    assert len(ragged) == count and accumulation.accumulation and accumulation.dims["K"] >= 2048
    for probe in ragged:
        assert all(probe.dims[d] % TILE for d in "MNK"), probe
        assert all(d == 1 or 17 <= d <= 200 for d in probe.dims.values()), probe
        assert all(f"{d}={probe.dims[d]}" in probe.label for d in "BMNK")
    for probe in draw_probes("grouped_gemm", False, seed, count, interpreter=True):
        lens = probe.group_lens
        assert 3 <= len(lens) <= 6 and 0 in lens and 1 in lens and probe.dims["B"] == len(lens)
        assert all(n >= 17 for n in lens if n > 1) and probe.dims["M"] == sum(lens) // len(lens)
        assert probe.dims["N"] % TILE and probe.dims["K"] % TILE and not probe.accumulation
    attention = draw_probes("attention", True, seed, count, interpreter=True)
    assert len(attention) == count and not any(p.accumulation for p in attention)  # no GEMM-shaped probe
    for probe in attention:
        if probe.group_lens is None:  # odd lengths: a multiple of no block
            assert probe.dims["Sq"] % 2 and probe.dims["Sk"] % 2, probe
        else:  # packed: an empty and a one-token sequence among them
            assert {0, 1} <= set(probe.group_lens), probe
        assert probe.dims["Hq"] % probe.dims["Hkv"] == 0
    assert draw_probes("moe_permute", True, seed, count, interpreter=True) == []  # a family without a drawer
