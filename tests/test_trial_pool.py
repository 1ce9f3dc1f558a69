"""Trials fanned out over N workers (simulated GPUs on the CPU): each worker's scores over its own
measurement of the reference config; a worker that hangs or dies costs its configs a NaN, and leaves
nothing running."""

import json
import math
import sys
import textwrap

from agent.processes import ChildRegistry
from agent.trial_pool import TrialPool, shares
from agent.trials import TrialJob, run_trials
from harness.files import REPO_ROOT
from harness.shapes import Shape
from kernels.gemm import tuning as gemm_tuning
from tests.test_processes import wait_dead

# A stand-in worker: "GPU" k runs (1 + k/10) times as fast; BLOCK_M 999 hangs (after starting a grandchild),
# GROUP_M -1 dies. It writes its scores after every config, as agent.trials does.
FAKE_WORKER = textwrap.dedent("""
    import json, os, subprocess, sys, time
    job = json.load(open(sys.argv[1]))
    speed = 1 + int(os.environ["CUDA_VISIBLE_DEVICES"]) / 10
    found = {"scores": [], "errors": []}
    for cfg in job["configs"]:
        if cfg["BLOCK_M"] == 999:
            grandchild = subprocess.Popen(["sleep", "600"])
            open(os.path.join(os.path.dirname(sys.argv[2]), "grandchild"), "w").write(str(grandchild.pid))
            time.sleep(600)
        if cfg["GROUP_M"] == -1:
            os._exit(3)
        found["scores"].append(cfg["BLOCK_M"] * speed)
        found["errors"].append(None)
        json.dump(found, open(sys.argv[2], "w"))
""")
SHAPE = Shape(label="t", dims={"B": 1, "M": 64, "N": 64, "K": 64})


def job(**overrides) -> TrialJob:
    return TrialJob(op="gemm", variant="default", shapes=[SHAPE], bucket="small", configs=[], repeats=1) \
        .model_copy(update=overrides)


def config(block_m: int, group_m: int = 8) -> dict[str, int]:
    return {"BLOCK_M": block_m, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": group_m, "num_warps": 4, "num_stages": 2}


def test_configs_are_dealt_round_robin_and_the_reference_goes_to_every_worker():
    assert shares(7, 3) == [[1, 4], [2, 5], [3, 6]]
    assert shares(3, 8) == [[1], [2]] and shares(1, 4) == [[]]


def test_n_workers_each_score_against_their_own_reference_and_a_hung_or_dead_one_costs_only_its_configs(tmp_path):
    registry = ChildRegistry(tmp_path / "children.json")
    pool = TrialPool(REPO_ROOT, job(), tmp_path, registry, workers=["0", "1", "2"], limit_s=5,
                     command=[sys.executable, "-c", FAKE_WORKER])
    batch = [config(64), config(128), config(32), config(256), config(999), config(16, group_m=-1), config(64, 4)]
    scores = pool(batch, 1)
    # worker 0: 128, 999 (hangs); worker 1: 32, 16 (dies); worker 2: 256, 64
    assert scores[0] == 1.0 and scores[1] == 2.0 and scores[2] == 0.5 and scores[3] == 4.0 and scores[6] == 1.0
    assert math.isnan(scores[4]) and math.isnan(scores[5])
    assert "limit of 5 s" in pool.errors[4] and pool.errors[5] == "worker 1 exited 3"
    written = json.loads((tmp_path / "trials-1.errors.json").read_text())
    assert list(written.values()) == [pool.errors[4], pool.errors[5]]
    assert wait_dead(int((tmp_path / "grandchild").read_text()))
    assert json.loads((tmp_path / "children.json").read_text()) == []


def test_a_real_trial_under_the_interpreter_scores_each_config(tmp_path):
    """agent.trials itself, in-process: the bigger tile does less work per element on the interpreter."""
    before = dict(gemm_tuning.TUNED_TABLE["small"])
    found = run_trials(job(configs=[config(32), {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}]), tmp_path / "s.json")
    assert len(found.scores) == 2 and all(s > 0 for s in found.scores) and found.errors == [None, None]
    broken = run_trials(job(configs=[{"BLOCK_M": 48}]), tmp_path / "b.json")  # outside the declared space
    assert math.isnan(broken.scores[0]) and "outside the tunable space" in broken.errors[0]
    assert gemm_tuning.TUNED_TABLE["small"] == before  # the table is the module's again
