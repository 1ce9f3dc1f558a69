"""One screening round of the search on 1 GPU and on several: the search a campaign round runs (the
algorithm, its budget and seed, from the same starting config of one tuned-table bucket, on the same
shapes), through the trial pool with its workers on the first N visible GPUs. Per N: the round's wall
time (workers started, inputs and references made, every batch) and each batch's, the winner, its gain
in the trials and the verdict a round would reach (propose it, or the bucket is settled: under the
noise floor). Issue 20 asks the winner and the verdict to be the same on every N, and the 2-GPU round
>= 1.8x faster than the 1-GPU one (>= 3.4x on 4).

    python benchmarks/screening.py --op grouped_gemm_fp8 --variant e4m3-rowwise --bucket dgrad/large \\
        --start detuned --gpus 1 --gpus 2 --csv screening.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import tempfile
import time
from pathlib import Path

from agent.config_space import load_space
from agent.manifest import Manifest
from agent.processes import ChildRegistry
from agent.search_algorithms import make_search
from agent.trial_pool import TrialPool, visible_gpus
from agent.trials import TrialJob, trial_repeats
from agent.tuning_table import read_tuning, tuning_file
from harness.files import REPO_ROOT
from harness.registry import get_spec
from harness.rules import load_rules
from harness.shapes import load_shapes

# The three representative shapes of the headline preset that the grouped_gemm_fp8 campaigns screen on.
HEADLINE_SCREEN = ("deepseek-v3/gateup/ep32/m4096/hot", "qwen3-235b/down/ep32/m4096/uniform",
                   "gpt-oss-120b/gateup/ep32/m4096/hot")
# Where scripts/gpu_search.sh starts its campaign: every bucket at this config.
DETUNED = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 2}


def screen(manifest: Manifest, job: TrialJob, base: dict[str, int], algorithm: str, budget: int, seed: int,
           gpus: list[str | None], work_dir: Path) -> dict[str, object]:
    """One search over `gpus`: the row of the CSV. As in a campaign's round, the kernels at the starting
    config are in the compiler's cache (BASELINE ran them) and the configs tried are not: each run gets a
    Triton cache of its own, warmed by one trial of `base` before the clock starts."""
    os.environ["TRITON_CACHE_DIR"] = str(work_dir / "triton-cache")  # the workers' environment is this one's
    space = load_space(REPO_ROOT, manifest)
    registry = ChildRegistry(work_dir / "children.json")
    with TrialPool(REPO_ROOT, job, work_dir / "warm-up", registry, workers=gpus[:1]) as warm:
        warm([base], 1)
    started = time.monotonic()
    with TrialPool(REPO_ROOT, job, work_dir, registry, workers=gpus,
                   limit_s=manifest.compile_timeout_s + manifest.run_timeout_s) as pool:
        result = make_search(algorithm, space, budget, seed=seed).search(base, pool)
    wall_s = time.monotonic() - started  # the workers' ends included: a round waits for them
    floor = load_rules().noise_floor_pct
    proposes = result.best != base and result.gain_pct >= floor
    return {
        "gpus": len(gpus), "wall_s": round(wall_s, 2), "batches": len(pool.batch_seconds),
        "batch_s": " ".join(f"{s:.1f}" for s in pool.batch_seconds),
        "measured": len(result.trials), "winner": json.dumps(result.best, sort_keys=True),
        "gain_pct": round(result.gain_pct, 2),
        "verdict": "propose" if proposes else f"settled (under the {floor:g}% floor)",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", default="grouped_gemm_fp8")
    parser.add_argument("--variant", default="e4m3-rowwise")
    parser.add_argument("--shapes", default="headline", help="the preset the screened shapes come from")
    parser.add_argument("--shape", action="append", help="a label to screen on (repeat; default: "
                        "the headline campaign's three representative shapes)")
    parser.add_argument("--bucket", default="dgrad/large")
    parser.add_argument("--start", default="detuned", help="'detuned' or 'table' (the bucket's tuned config)")
    parser.add_argument("--algorithm", default="halving")
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--seed", type=int, default=2, help="a campaign seeds round N's search with N")
    parser.add_argument("--gpus", type=int, action="append", help="workers (GPUs) per run; repeat")
    parser.add_argument("--csv", type=Path, required=True)
    args = parser.parse_args()

    manifest = Manifest.model_validate({"campaign": "screening", "op": args.op, "variant": args.variant,
                                        "shapes": args.shapes})
    wanted = args.shape or list(HEADLINE_SCREEN)
    shapes = [s for s in load_shapes(get_spec(args.op).shape_family, args.shapes) if s.label in wanted]
    if len(shapes) != len(wanted):
        raise SystemExit(f"shapes not in preset '{args.shapes}': {sorted(set(wanted) - {s.label for s in shapes})}")
    _, table = read_tuning(REPO_ROOT / tuning_file(manifest))
    base = DETUNED if args.start == "detuned" else table[args.bucket]
    job = TrialJob(op=args.op, variant=manifest.resolved_variant, metric=manifest.primary_metric, shapes=shapes,
                   bucket=args.bucket, configs=[], repeats=trial_repeats())
    available = visible_gpus()
    rows = []
    with tempfile.TemporaryDirectory(prefix="screening-") as tmp:
        for n in args.gpus or [len(available)]:
            if n > len(available):
                raise SystemExit(f"--gpus {n}: only {len(available)} visible")
            row = screen(manifest, job, base, args.algorithm, args.budget, args.seed, available[:n],
                         Path(tmp) / f"gpus-{n}")
            rows.append(row)
            print(json.dumps(row), flush=True)
    for row in rows:
        row["speedup"] = round(rows[0]["wall_s"] / row["wall_s"], 3)
        row["same_as_first"] = row["winner"] == rows[0]["winner"] and row["verdict"] == rows[0]["verdict"]
    with args.csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for row in rows:
        print(f"{row['gpus']} GPU(s): {row['wall_s']:.1f} s ({row['speedup']:.2f}x the first), "
              f"winner {row['winner']} {row['gain_pct']:+.1f}%, {row['verdict']}, same: {row['same_as_first']}")


if __name__ == "__main__":
    main()
