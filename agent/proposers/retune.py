"""A round that tries many configs and validates one: the search proposer with an `algorithm`.

Each round retunes one bucket of the op's tuned table, one retuned least so far (breadth first): the
algorithm (agent/search_algorithms.py) searches the op's config space from the bucket's current config,
every config it asks for measured by trials (agent/trials.py, over every GPU: agent/trial_pool.py) on
the representative shapes that use the bucket; the winner, if it beat the current config by the noise
floor in its trials, is written into the table and proposed: the runner validates and decides it like
any candidate. A bucket whose search found nothing better, or whose winner was rolled back (in this
campaign, or, as a tip says, from the same config in the same context), is settled and not retuned
again; one whose winner was accepted is retuned again from there, once the others had their turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

from agent.config_space import Config, load_space
from agent.knowledge import shape_class, similarity
from agent.proposers import Exhausted, Outcome, Proposed, RoundContext
from agent.search_algorithms import Measure, SearchResult, make_search
from agent.state import Proposal
from agent.trial_pool import TrialPool
from agent.trials import TrialJob, trial_repeats
from agent.tuning_table import read_tuning, rewrite_table, tuning_file, tuning_module
from harness.files import atomic_write_text
from harness.rules import load_rules
from harness.shapes import Shape

# Configs an algorithm may try per round (halving: its first rung). With halving on the headline grouped
# shapes, a round's trials took 30-55 s on an H200 (one GPU; 2026-11-24), the whole round 64-97 s.
BUDGET = 16


class ShapesMeasure(Protocol):
    """The search's measure on the shapes that use a bucket (the trial pool, or a fake), and `on` some of
    them: the same workers, whose inputs and references are made already."""

    def __call__(self, configs: Sequence[Config], fidelity: int) -> list[float]: ...

    def on(self, shapes: Sequence[Shape]) -> Measure: ...


# (context, bucket, the shapes that use it) -> the measure the search calls
MeasureFactory = Callable[[RoundContext, str, Sequence[Shape]], ShapesMeasure]


def opened(measure: ShapesMeasure) -> AbstractContextManager[ShapesMeasure]:
    """A measure to use in a `with` block: one that holds workers (the trial pool) ends them there."""
    return measure if isinstance(measure, AbstractContextManager) else nullcontext(measure)


def trial_pool(context: RoundContext, bucket: str, shapes: Sequence[Shape]) -> TrialPool:
    m = context.manifest
    job = TrialJob(op=m.op, variant=m.resolved_variant, dtype=m.dtype, metric=m.primary_metric, shapes=list(shapes),
                   bucket=bucket, configs=[], repeats=trial_repeats())
    trials = context.round_dir / "trials"
    # a directory per pool: a round's later pools (the split checks) number their batches from 1 again
    work_dir = trials / f"pool-{len(list(trials.glob('pool-*'))) + 1}"
    return TrialPool(context.root, job, work_dir, context.children, limit_s=m.compile_timeout_s + m.run_timeout_s)


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


def retunes(context: RoundContext) -> dict[str, int]:
    """How many rounds of this campaign retuned each bucket: the next round goes to one retuned least, so
    every bucket gets its first search before any gets its second (on the H100, a second round on the
    dgrad bucket gained 4% while the forward's, never reached, held the step at 0.58x of the tuned table)."""
    counts: dict[str, int] = {}
    for r in context.history:
        if r.candidate and r.candidate.params.get("algorithm"):
            bucket = r.candidate.params["bucket"]
            counts[bucket] = counts.get(bucket, 0) + 1
    return counts


def known_ineffective(context: RoundContext, bucket: str, base: Config, winner: Config) -> bool:
    """A tip recorded this very retune (the bucket from this config to that one) as not paying, measured in
    this very context: the same variant and shape class (`similarity` 1)."""
    variant, shapes = context.manifest.resolved_variant, shape_class(context.manifest)
    return any(t.outcome != "ACCEPT" and t.params.get("algorithm") and t.params.get("bucket") == bucket
               and t.params.get("new") == winner and similarity(t, variant, shapes, base) == 1.0
               for t in context.tips)


def describe(old: Config, new: Config) -> str:
    return ", ".join(f"{k} {old[k]} -> {v}" for k, v in new.items() if old.get(k) != v)


def record(context: RoundContext, bucket: str, result: SearchResult) -> None:
    """Every config tried and its score, in the round dir (trials.json)."""
    rows = [{"config": t.config, "score": t.score, "fidelity": t.fidelity} for t in result.trials]
    path = context.round_dir / "trials.json"
    every = (json.loads(path.read_text()) if path.exists() else {}) | {bucket: rows}
    entries = [f" {json.dumps(key)}: [\n" + ",\n".join(f"  {json.dumps(row)}" for row in tried) + "\n ]"
               for key, tried in every.items()]
    atomic_write_text(path, "{\n" + ",\n".join(entries) + "\n}\n")  # one trial a line


def split_disagreeing(context: RoundContext, algorithm: str, budget: int, measure: ShapesMeasure, bucket: str,
                      shapes: Sequence[Shape], base: Config, winner: Config,
                      shape_class: Callable[[dict[str, int]], str] | None) -> dict[str, Config]:
    """Buckets that follow the shapes: where the bucket's shapes span several classes (the op's
    `shape_class`, e.g. the layer) and the winner slows one class down past the per-shape regression
    limit in its own trials, that class gets an entry `<bucket> <class>` of its own: the best its own
    search finds, or the bucket's config as it was."""
    if shape_class is None:
        return {}
    classes: dict[str, list[Shape]] = {}
    for shape in shapes:
        classes.setdefault(shape_class(dict(shape.dims)), []).append(shape)
    if len(classes) < 2:
        return {}
    rules = load_rules()
    splits = {}
    for cls, members in sorted(classes.items()):
        on_class = measure.on(members)
        as_was, with_winner = on_class([base, winner], 1)
        if with_winner >= (1.0 - rules.per_shape_regression_pct / 100.0) * as_was:  # NaN (it failed): split
            continue
        own = make_search(algorithm, load_space(context.root, context.manifest), budget, seed=context.number)
        found = own.search(base, on_class)
        record(context, f"{bucket} {cls}", found)
        splits[f"{bucket} {cls}"] = found.best if found.gain_pct >= rules.noise_floor_pct else base
    return splits


def with_entries(table: dict[str, Config], bucket: str, config: Config, splits: dict[str, Config]
                 ) -> dict[str, Config]:
    """The table with `bucket` set to `config` and its split entries right after it (one line each)."""
    out: dict[str, Config] = {}
    for key, value in table.items():
        out[key] = config if key == bucket else value
        if key == bucket:
            out.update(splits)
    return out


def retune(context: RoundContext, algorithm: str, measure_for: MeasureFactory = trial_pool,
           budget: int = BUDGET) -> Outcome:
    variant = context.manifest.resolved_variant
    file = tuning_file(context.manifest)
    module = tuning_module(context.root, context.manifest)
    space = load_space(context.root, context.manifest)
    floor = load_rules().noise_floor_pct
    done: list[str] = context.scratch.setdefault("settled", [])
    used = bucket_shapes(context, lambda s: module.buckets_for(dict(s.dims), variant))
    for bucket in sorted(used, key=lambda b: retunes(context).get(b, 0)):  # breadth first: stable by name
        shapes = used[bucket]
        _, table = read_tuning(context.root / file)
        if bucket in settled(context) or bucket not in table:
            continue
        base = table[bucket]
        search = make_search(algorithm, space, budget, seed=context.number)
        with opened(measure_for(context, bucket, shapes)) as measure:
            result = search.search(base, measure)
            record(context, bucket, result)
            if result.best == base or not result.gain_pct >= floor or known_ineffective(context, bucket, base,
                                                                                       result.best):
                done.append(bucket)
                continue
            splits = split_disagreeing(context, algorithm, budget, measure, bucket, shapes, base, result.best,
                                       getattr(module, "shape_class", None))
        rewrite_table(context.root / file, with_entries(table, bucket, result.best, splits))
        tried = len({json.dumps(s.config, sort_keys=True) for s in result.trials})
        split_text = "".join(f"; split '{key}': {describe(base, cfg) or 'kept'}" for key, cfg in splits.items())
        return Proposed(Proposal(
            hypothesis=(f"retune the '{bucket}' bucket ({algorithm} search, {tried} configs tried on "
                        f"{', '.join(s.label for s in shapes)}): the best tried {result.gain_pct:+.1f}% over the "
                        "current config there" + (", and the layers it would slow down keep a config of their own"
                                                  if splits else "")),
            summary=f"{bucket}: {describe(base, result.best)}{split_text}"[:200],
            expected_gain_pct=result.gain_pct,
            params={"file": file, "bucket": bucket, "old": base, "new": result.best, "algorithm": algorithm,
                    "tried": tried, "trial_gain_pct": round(result.gain_pct, 2), "split": splits},
        ))
    return Exhausted(f"{algorithm} search: no bucket left whose trials beat its config by the "
                     f"{floor:g}% noise floor")
