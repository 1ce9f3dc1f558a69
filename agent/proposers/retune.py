"""A round that tries many configs and validates one: the search proposer with an `algorithm`.

Each round retunes one bucket of the op's tuned table: the algorithm (agent/search_algorithms.py)
searches the op's config space from the bucket's current config, every config it asks for measured
by trials (agent/trials.py, over every GPU: agent/trial_pool.py) on the representative shapes that
use the bucket; the winner, if it beat the current config by the noise floor in its trials, is
written into the table and proposed: the runner validates and decides it like any candidate. A bucket
whose search found nothing better, or whose winner was rolled back, is settled and not retuned again;
one whose winner was accepted is retuned again from there.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence

from agent.config_space import Config, load_space
from agent.proposers import Exhausted, Outcome, Proposed, RoundContext
from agent.search_algorithms import Measure, SearchResult, make_search
from agent.state import Proposal
from agent.trial_pool import TrialPool
from agent.trials import TrialJob
from agent.tuning_table import read_tuning, rewrite_table, tuning_file
from harness.files import atomic_write_text
from harness.rules import load_rules
from harness.shapes import Shape
from kernels.common.device import interpreter_mode

# Configs an algorithm may try per round (halving: the first rung).
BUDGET = 24
# (context, bucket, the shapes that use it) -> the measure the search calls
MeasureFactory = Callable[[RoundContext, str, Sequence[Shape]], Measure]


def trial_pool(context: RoundContext, bucket: str, shapes: Sequence[Shape]) -> Measure:
    m = context.manifest
    job = TrialJob(op=m.op, variant=m.resolved_variant, dtype=m.dtype, metric=m.primary_metric, shapes=list(shapes),
                   bucket=bucket, configs=[], repeats=1 if interpreter_mode() else 10)
    return TrialPool(context.root, job, context.round_dir / "trials", context.children,
                     limit_s=m.compile_timeout_s + m.run_timeout_s)


def bucket_shapes(context: RoundContext, used_by: Callable[[Shape], set[str]]) -> dict[str, list[Shape]]:
    """Each used bucket's trial shapes: the representative shapes that use it, else up to two that do."""
    reps = set(context.manifest.representative_shapes)
    out: dict[str, list[Shape]] = {}
    for shape in context.shapes:
        for bucket in used_by(shape):
            out.setdefault(bucket, []).append(shape)
    return {b: ([s for s in shapes if s.label in reps] or shapes[:2]) for b, shapes in sorted(out.items())}


def settled(context: RoundContext) -> set[str]:
    """Buckets not to retune: the search found nothing there, or its winner was rolled back."""
    rolled_back = {r.candidate.params["bucket"] for r in context.history
                   if r.candidate and r.candidate.params.get("algorithm") and r.status != "ACCEPT"}
    return set(context.scratch.get("settled", [])) | rolled_back


def describe(old: Config, new: Config) -> str:
    return ", ".join(f"{k} {old[k]} -> {v}" for k, v in new.items() if old.get(k) != v)


def record(context: RoundContext, bucket: str, result: SearchResult) -> None:
    """Every config tried and its score, in the round dir (trials.json)."""
    rows = [{"config": s.config, "score": s.score, "fidelity": s.fidelity} for s in result.screened]
    path = context.round_dir / "trials.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    atomic_write_text(path, json.dumps(previous | {bucket: rows}, indent=1) + "\n")


def retune(context: RoundContext, algorithm: str, measure_for: MeasureFactory = trial_pool,
           budget: int = BUDGET) -> Outcome:
    op, variant = context.manifest.op, context.manifest.resolved_variant
    file = tuning_file(op)
    module = importlib.import_module(f"kernels.{op}.tuning")
    space = load_space(context.root, op)
    floor = load_rules().noise_floor_pct
    done: list[str] = context.scratch.setdefault("settled", [])
    for bucket, shapes in bucket_shapes(context, lambda s: module.buckets_for(dict(s.dims), variant)).items():
        _, table = read_tuning(context.root / file)
        if bucket in settled(context) or bucket not in table:
            continue
        base = table[bucket]
        search = make_search(algorithm, space, budget, seed=context.number)
        result = search.search(base, measure_for(context, bucket, shapes))
        record(context, bucket, result)
        if result.best == base or not result.gain_pct >= floor:
            done.append(bucket)
            continue
        table[bucket] = result.best
        rewrite_table(context.root / file, table)
        tried = len({json.dumps(s.config, sort_keys=True) for s in result.screened})
        return Proposed(Proposal(
            hypothesis=(f"retune the '{bucket}' bucket ({algorithm} search, {tried} configs tried on "
                        f"{', '.join(s.label for s in shapes)}): the best tried {result.gain_pct:+.1f}% over the "
                        "current config there"),
            summary=f"{bucket}: {describe(base, result.best)}",
            expected_gain_pct=result.gain_pct,
            params={"file": file, "bucket": bucket, "old": base, "new": result.best, "algorithm": algorithm,
                    "tried": tried, "trial_gain_pct": round(result.gain_pct, 2)},
        ))
    return Exhausted(f"{algorithm} search: no bucket left whose trials beat its config by the "
                     f"{floor:g}% noise floor")
