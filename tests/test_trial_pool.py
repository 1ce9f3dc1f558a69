"""Trials fanned out over N workers (simulated GPUs on the CPU): each worker's scores over its own
measurement of the reference config; a worker serves every batch of its pool; one that hangs or dies
costs its configs a NaN, leaves nothing running, and is started afresh for the next batch."""

import dataclasses
import io
import json
import math
import subprocess
import sys
import textwrap
import time

import pytest

from agent import trials
from agent.processes import ChildRegistry
from agent.trial_pool import Share, TrialPool, shares, visible_gpus
from agent.trials import TrialJob, run_trials
from harness.files import REPO_ROOT
from harness.quick_test_bench import Screen, ShapeResult, prepare_bench
from harness.registry import get_spec
from harness.schema import FAIL, PASS
from harness.shapes import Shape, load_shapes
from harness.timing import Timing
from kernels.gemm import tuning as gemm_tuning
from tests.test_processes import alive, wait_dead

# A stand-in worker serving jobs as agent.trials does (one "JOB SCORES" line in, "done" out, its scores
# written after every config): "GPU" k runs (1 + k/10) times as fast; BLOCK_M 999 hangs (after starting a
# grandchild), GROUP_M -1 dies; with FAKE_TILT set, BLOCK_M 128 gains (1 + k/10) more on "GPU" k. It notes its
# pid once, when it starts.
FAKE_WORKER = textwrap.dedent("""
    import json, os, subprocess, sys, time
    gpu = os.environ["CUDA_VISIBLE_DEVICES"]
    starts = os.path.join(os.environ["FAKE_DIR"], "starts-" + gpu)
    open(starts, "a").write(f"{os.getpid()}\\n")
    for line in sys.stdin:
        job_path, out = line.split()
        job = json.load(open(job_path))
        found = {"scores": [], "errors": []}
        for cfg in job["configs"]:
            if cfg["BLOCK_M"] == 999:
                grandchild = subprocess.Popen(["sleep", "600"])
                open(os.path.join(os.environ["FAKE_DIR"], "grandchild"), "w").write(str(grandchild.pid))
                time.sleep(600)
            if cfg["GROUP_M"] == -1:
                os._exit(3)
            tilt = 1 + int(gpu) / 10 if os.environ.get("FAKE_TILT") and cfg["BLOCK_M"] == 128 else 1
            found["scores"].append(cfg["BLOCK_M"] * (1 + int(gpu) / 10) * tilt)
            found["errors"].append(None)
            json.dump(found, open(out, "w"))
        print("done", flush=True)
""")
SHAPE = Shape(label="t", dims={"B": 1, "M": 64, "N": 64, "K": 64})


def job(**overrides) -> TrialJob:
    return TrialJob(op="gemm", variant="default", shapes=[SHAPE], bucket="small", configs=[], repeats=1) \
        .model_copy(update=overrides)


def config(block_m: int, group_m: int = 8) -> dict[str, int]:
    return {"BLOCK_M": block_m, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": group_m, "num_warps": 4, "num_stages": 2}


def fake_pool(tmp_path, monkeypatch, gpus: list[str]) -> TrialPool:
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    registry = ChildRegistry(tmp_path / "children.json")
    return TrialPool(REPO_ROOT, job(), tmp_path, registry, workers=gpus, limit_s=5,
                     command=[sys.executable, "-u", "-c", FAKE_WORKER])


def starts(tmp_path, gpu: str) -> list[int]:
    path = tmp_path / f"starts-{gpu}"
    return [int(pid) for pid in path.read_text().split()] if path.exists() else []


def test_configs_are_dealt_round_robin_and_the_reference_goes_to_every_worker():
    assert [s.indices for s in shares(7, 3)] == [[1, 4], [2, 5], [3, 6]]
    assert [s.indices for s in shares(3, 8)] == [[1], [2]] and [s.indices for s in shares(1, 4)] == [[]]
    assert [s.fidelity for s in shares(17, 2, 1)] == [1, 1]  # a fidelity of one is not split
    assert [len(s.indices) for s in shares(9, 2, 2)] == [4, 4]  # many configs: dealt


def test_halvings_last_rungs_split_their_fidelity_over_the_workers():
    assert shares(2, 2, 16) == [Share([1], 8.0), Share([1], 8.0)]  # one config on one GPU would take twice as long
    assert shares(3, 4, 8) == [Share([1, 2], 2.0)] * 4
    assert shares(5, 2, 4) == [Share([1, 3], 4), Share([2, 4], 4)]  # as quick either way: dealt
    assert shares(1, 2, 16) == [Share([], 16)]  # the reference alone: one worker


def test_a_split_config_scores_the_geomean_of_its_ratios_on_each_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TILT", "1")
    with fake_pool(tmp_path, monkeypatch, ["0", "5"]) as pool:
        scores = pool([config(64), config(128)], 16)
        assert scores[0] == 1.0 and scores[1] == pytest.approx((2.0 * 3.0) ** 0.5)  # 2x on GPU 0, 3x on GPU 5
        jobs = [TrialJob.model_validate_json((tmp_path / f"trials-1-w{w}.job.json").read_text()) for w in (0, 1)]
        assert [(j.repeats, len(j.configs)) for j in jobs] == [(8, 2), (8, 2)]


def test_n_workers_each_score_against_their_own_reference_and_a_hung_or_dead_one_costs_only_its_configs(
        tmp_path, monkeypatch):
    with fake_pool(tmp_path, monkeypatch, ["0", "1", "2"]) as pool:
        batch = [config(64), config(128), config(32), config(256), config(999), config(16, group_m=-1),
                 config(64, 4)]
        scores = pool(batch, 1)
        # worker 0: 128, 999 (hangs); worker 1: 32, 16 (dies); worker 2: 256, 64
        assert scores[0] == 1.0 and scores[1] == 2.0 and scores[2] == 0.5 and scores[3] == 4.0 and scores[6] == 1.0
        assert math.isnan(scores[4]) and math.isnan(scores[5])
        assert "limit of 5 s" in pool.errors[4] and pool.errors[5] == "worker 1 exited 3"
        written = json.loads((tmp_path / "trials-1.errors.json").read_text())
        assert list(written.values()) == [pool.errors[4], pool.errors[5]]
        assert wait_dead(int((tmp_path / "grandchild").read_text()))
        assert [len(starts(tmp_path, g)) for g in "012"] == [1, 1, 1]
        # the next batch: the killed and the dead worker start afresh, the third serves it as it did the first
        assert pool([config(64), config(128), config(32), config(256)], 2) == [1.0, 2.0, 0.5, 4.0]
        assert [len(starts(tmp_path, g)) for g in "012"] == [2, 2, 1] and pool.errors == {}
        serving = [starts(tmp_path, g)[-1] for g in "012"]
        assert all(alive(pid) for pid in serving)
    assert all(wait_dead(pid) for pid in serving)  # the pool's end is its workers'
    assert json.loads((tmp_path / "children.json").read_text()) == []
    assert len(pool.batch_seconds) == 2


def test_a_worker_serves_every_batch_of_its_pool_with_one_screen(monkeypatch, tmp_path):
    """agent.trials' serving loop in-process: one Screen (inputs and references) for jobs on its shapes or
    some of them, a new one for other shapes."""
    made = []
    real = trials.make_screen
    monkeypatch.setattr(trials, "make_screen", lambda j: made.append([s.label for s in j.shapes]) or real(j))
    other = SHAPE.model_copy(update={"label": "u"})
    jobs = [job(configs=[config(32)]), job(configs=[config(64)], repeats=2), job(configs=[config(32)], shapes=[other]),
            job(configs=[config(32)], shapes=[SHAPE, other]), job(configs=[config(64)], shapes=[other])]
    lines = []
    for i, j in enumerate(jobs):
        (tmp_path / f"{i}.json").write_text(j.model_dump_json())
        lines.append(f"{tmp_path / f'{i}.json'} {tmp_path / f'{i}.scores.json'}\n")
    answers = io.StringIO()
    trials.serve(io.StringIO("".join(lines)), answers)
    assert answers.getvalue() == "done\n" * 5 and made == [["t"], ["u"], ["t", "u"]]
    assert all(json.loads((tmp_path / f"{i}.scores.json").read_text())["scores"][0] > 0 for i in range(5))


def test_trials_time_the_kernels_alone_on_a_gpu(monkeypatch):
    """A worker's screen times configs as CUDA-graph replays on a GPU (a config cannot change the host time, whose
    noise ranked configs when the trials timed it), and keeps the interpreter's wall clock on the CPU."""
    asked = []
    monkeypatch.setattr(trials, "prepare_bench", lambda *args, **kwargs: asked.append(kwargs["timing_mode"]))
    monkeypatch.setattr(trials, "Screen", lambda run: run)
    for on_cpu in (False, True):
        monkeypatch.setattr(trials, "interpreter_mode", lambda on_cpu=on_cpu: on_cpu)
        trials.make_screen(job())
    assert asked == ["cuda-graph", None]


def test_a_screen_makes_each_reference_once_and_still_fails_a_wrong_result():
    spec = get_spec("gemm")
    references = []
    counted = dataclasses.replace(spec, reference=lambda inputs: references.append(1) or spec.reference(inputs))
    screen = Screen(prepare_bench(counted, [SHAPE], shapes_source="test", dtype="fp16", checks="basic"))
    assert [r.check for r in screen.measure(1)] == ["PASS"] and [r.check for r in screen.measure(2)] == ["PASS"]
    assert len(references) == 1

    def halved(problem, inputs, outputs):
        spec.runner.forward(problem, inputs, outputs)
        outputs["out"].mul_(0.5)
    screen.run.spec = dataclasses.replace(counted, runner=dataclasses.replace(spec.runner, forward=halved))
    wrong = screen.measure(1)[0]
    assert wrong.check == "FAIL" and len(references) == 1


def test_a_real_worker_serves_two_batches_and_its_prints_stay_out_of_its_answers(tmp_path):
    """agent.trials' main under the interpreter, through the pool, with a job that prints as a compiler
    might: the print goes to the worker's log, the answers still reach the pool."""
    chatty = ("import sys; from agent import trials; real = trials.run_trials; "
              "trials.run_trials = lambda *a: print('compiler chatter') or real(*a); sys.exit(trials.main())")
    registry = ChildRegistry(tmp_path / "children.json")
    with TrialPool(REPO_ROOT, job(), tmp_path, registry, workers=[None], limit_s=300,
                   command=[sys.executable, "-c", chatty]) as pool:
        assert pool([config(64), config(32)], 1)[1] > 0 and pool([config(64), config(32)], 2)[1] > 0
        assert pool.errors == {}
    assert (tmp_path / "worker-0.log").read_text().count("compiler chatter") == 2
    assert json.loads((tmp_path / "children.json").read_text()) == []


def test_a_real_trial_under_the_interpreter_scores_each_config(tmp_path):
    """agent.trials itself, in-process: the bigger tile does less work per element on the interpreter."""
    before = dict(gemm_tuning.TUNED_TABLE["small"])
    found = run_trials(job(configs=[config(32), {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}]), tmp_path / "s.json")
    assert len(found.scores) == 2 and all(s > 0 for s in found.scores) and found.errors == [None, None]
    broken = run_trials(job(configs=[{"BLOCK_M": 48}]), tmp_path / "b.json")  # outside the declared space
    assert math.isnan(broken.scores[0]) and "outside the tunable space" in broken.errors[0]
    assert gemm_tuning.TUNED_TABLE["small"] == before  # the table is the module's again


class ColdScreen:
    """A screen that times a measurement at 0.8x where the GPU idled before it: its first, and the first of each
    config it has not run before (a compile on the CPU); otherwise at the config's speed (ms a pass by BLOCK_M:
    64 twice as fast as 32, 16 at 0.67x, 128 at 0.2x); the BLOCK_M values in `wrong` fail their check."""

    def __init__(self, ms: dict[int, float] | None = None, wrong: frozenset[int] = frozenset()):
        self.calls, self.seen, self.wrong = 0, set(), wrong
        self.ms = ms or {32: 1.0, 64: 0.5, 16: 1.5, 128: 5.0}

    def measure(self, repeats, labels):
        self.calls += 1
        block_m = gemm_tuning.TUNED_TABLE["small"]["BLOCK_M"]
        cold = self.calls == 1 or block_m not in self.seen
        self.seen.add(block_m)
        ms = self.ms[block_m] / (0.8 if cold else 1.0)
        timing = Timing(median_ms=ms, stddev_ms=0.0, samples=repeats)
        check, error = (FAIL, "wrong output") if block_m in self.wrong else (PASS, None)
        result = ShapeResult(shape=SHAPE, dims=SHAPE.dims, check=check, snrs={}, fwd=timing, bwd=timing,
                             work=(1.0, 1.0), error=error)
        return [result]


def test_no_config_is_scored_on_a_cold_gpu(tmp_path):
    """Each config runs once unscored before it is scored: the batch's first (the one the others are scored
    against, after the GPU idled between batches) and each new one (after its compile) would otherwise be timed
    cold, and the ratios the search ranks by would be the GPU's idling."""
    screen = ColdScreen()
    found = run_trials(job(configs=[config(32), config(64), config(32)]), tmp_path / "s.json", screen)
    assert screen.calls == 6 and found.scores[0] == found.scores[2] and found.scores[1] == 2 * found.scores[0]


def test_a_config_far_behind_the_reference_is_scored_from_its_first_call(tmp_path):
    """A config whose first call rates below HOPELESS_BELOW of the job's first config (the reference) is not timed
    further: its cold first call at 0.16x scores it (1 timed call); one at 0.53x cold (0.67x in fact) is timed in
    full. A reference that failed cuts nothing, and a config that computes wrong is never cut: its failure is
    recorded as every failure is."""
    screen = ColdScreen()
    found = run_trials(job(configs=[config(32), config(128), config(16)], repeats=4), tmp_path / "s.json", screen)
    assert screen.calls == 5 and found.repeats == [4, 1, 4] and found.errors == [None] * 3
    assert found.scores[1] == pytest.approx(0.8 / 5.0 * found.scores[0])
    assert found.scores[2] == pytest.approx(found.scores[0] / 1.5)
    found = run_trials(job(configs=[config(32), config(128)], repeats=4), tmp_path / "f.json",
                       ColdScreen({32: math.nan, 128: 5.0}))
    assert math.isnan(found.scores[0]) and found.repeats == [4, 4] and found.scores[1] > 0
    found = run_trials(job(configs=[config(32), config(128)], repeats=4), tmp_path / "w.json",
                       ColdScreen(wrong=frozenset({128})))
    assert math.isnan(found.scores[1]) and found.repeats == [4, 4] and found.errors[1] == "t: wrong output"


# A worker that takes 2 GiB on its GPU and runs a kernel loop, then hangs (BLOCK_M 999) or dies (GROUP_M -1)
# with the memory still held.
GPU_HOG = textwrap.dedent("""
    import os, sys, time, torch
    held = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    for line in sys.stdin:
        cfg = __import__("json").load(open(line.split()[0]))["configs"][-1]
        for _ in range(100):
            held.add_(1)
        torch.cuda.synchronize()
        if cfg["GROUP_M"] == -1:
            os._exit(3)
        time.sleep(600)
""")


def gpu_processes() -> set[int]:
    """Pids with a context on any GPU of the machine (as nvidia-smi sees them)."""
    listed = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                            text=True, check=True).stdout
    return {int(pid) for pid in listed.split()}


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["gemm", "gemm_fp8", "grouped_gemm", "grouped_gemm_fp8", "attention"])
def test_trials_time_every_tuned_op_as_graph_replays(tmp_path, op):
    """Trials capture each op's runner in a CUDA graph (trial_timing): every op with a tuned table, its table's
    own config on a smoke shape, checked and scored (a capture that fails would score it NaN)."""
    import importlib

    spec = get_spec(op)
    shape = load_shapes(spec.shape_family, "smoke")[0]
    module = importlib.import_module(f"kernels.{op}.tuning")
    bucket = sorted(module.buckets_for(dict(shape.dims), spec.variants[0]))[0]
    job = TrialJob(op=op, variant=spec.variants[0], shapes=[shape], bucket=bucket,
                   configs=[module.TUNED_TABLE[bucket]], repeats=trials.trial_repeats())
    found = run_trials(job, tmp_path / "scores.json")
    assert trials.trial_timing() == "cuda-graph"
    assert found.errors == [None] and math.isfinite(found.scores[0]) and found.scores[0] > 0


@pytest.mark.gpu
def test_a_killed_or_dead_worker_leaves_no_gpu_busy_or_holding_memory(tmp_path):
    import torch
    gpus = visible_gpus()
    free_before = [torch.cuda.mem_get_info(i)[0] for i in range(len(gpus))]
    apps_before = gpu_processes()  # this test's own context among them (pids as the driver's namespace has them)
    registry = ChildRegistry(tmp_path / "children.json")
    with TrialPool(REPO_ROOT, job(), tmp_path, registry, workers=gpus, limit_s=20,
                   command=[sys.executable, "-c", GPU_HOG]) as pool:
        batch = [config(64), *[config(999) if w % 2 == 0 else config(16, group_m=-1) for w in range(len(gpus))]]
        scores = pool(batch, 1)
        assert all(math.isnan(s) for s in scores[1:])
        assert all(("limit of 20 s" if i % 2 == 1 else "exited 3") in pool.errors[i] for i in range(1, len(batch)))
    deadline = time.monotonic() + 10
    while gpu_processes() != apps_before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert gpu_processes() == apps_before
    for i, before in enumerate(free_before):
        assert torch.cuda.mem_get_info(i)[0] >= before - (256 << 20)
    assert json.loads((tmp_path / "children.json").read_text()) == []


def test_a_measure_on_some_shapes_goes_to_the_same_workers(tmp_path, monkeypatch):
    other = SHAPE.model_copy(update={"label": "u"})
    with fake_pool(tmp_path, monkeypatch, ["0", "1"]) as pool:
        pool.job = pool.job.model_copy(update={"shapes": [SHAPE, other]})
        assert pool([config(64), config(128), config(32)], 1) == [1.0, 2.0, 0.5]
        assert pool.on([other])([config(64), config(128), config(32)], 1) == [1.0, 2.0, 0.5]
        batch2 = TrialJob.model_validate_json((tmp_path / "trials-2-w1.job.json").read_text())
        assert [s.label for s in batch2.shapes] == ["u"] and [len(starts(tmp_path, g)) for g in "01"] == [1, 1]
