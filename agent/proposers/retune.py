"""A round that tries many configs and validates one: the search proposer with an `algorithm`.

Each round retunes one bucket of the op's tuned table, one retuned least so far (breadth first): the
algorithm (agent/search_algorithms.py) searches the op's config space from the bucket's current config,
every config it asks for measured by trials (agent/trials.py, over every GPU: agent/trial_pool.py) on
the representative shapes that use the bucket; the winner, if it beat the current config by the noise
floor in its trials, is written into the table and proposed: the runner validates and decides it like
any candidate. Where nothing beat the bucket's config on its shapes together and those shapes span
several classes (the op's `shape_class`: the layer), each class is searched alone, and the classes
whose own winner beats the bucket's config are proposed as split entries `<bucket> <class>`: a config
tuned by hand for all of a bucket's layers is a compromise one layer may not want. A bucket where
neither found anything, or whose proposal was rolled back (in this campaign, or, as a tip says, from
the same config in the same context), is settled and not retuned again; one whose proposal was
accepted is retuned again from there, once the others had their turn.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

from agent.config_space import Config, load_space
from agent.knowledge import Tip, shape_class, similarity
from agent.proposers import Exhausted, Failed, Outcome, Proposed, RoundContext
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


def known_ineffective(context: RoundContext, bucket: str, base: Config, winner: Config, split: str = "") -> bool:
    """A tip recorded this very retune (the bucket, or its `split` entry, from this config to that one) as
    not paying, measured in this very context: the same variant and shape class (`similarity` 1)."""
    variant, shapes = context.manifest.resolved_variant, shape_class(context.manifest)

    def proposed(tip: Tip) -> Config | None:
        return tip.params.get("split", {}).get(split) if split else tip.params.get("new")

    return any(t.outcome != "ACCEPT" and t.params.get("algorithm") and t.params.get("bucket") == bucket
               and proposed(t) == winner and similarity(t, variant, shapes, base) == 1.0
               for t in context.tips)


def pays(result: SearchResult, base: Config, floor_pct: float) -> bool:
    """The search's winner is another config, and it beat the starting one by the noise floor in its trials."""
    return result.best != base and result.gain_pct >= floor_pct


def describe(old: Config, new: Config) -> str:
    return ", ".join(f"{k} {old[k]} -> {v}" for k, v in new.items() if old.get(k) != v)


def record(context: RoundContext, entry: str, result: SearchResult, base: Config) -> None:
    """Every config tried and its score, in the round dir: trials.json (one trial a line; `base`: the entry's
    own config, timed in every batch beside the others) and trials.md, what they read against it."""
    rows = [{"config": t.config, "score": t.score, "fidelity": t.fidelity, "base": t.config == base}
            for t in result.trials]
    path = context.round_dir / "trials.json"
    every = (json.loads(path.read_text()) if path.exists() else {}) | {entry: rows}
    entries = [f" {json.dumps(key)}: [\n" + ",\n".join(f"  {json.dumps(row)}" for row in tried) + "\n ]"
               for key, tried in every.items()]
    atomic_write_text(path, "{\n" + ",\n".join(entries) + "\n}\n")
    atomic_write_text(context.round_dir / "trials.md", trials_digest(every))


def trials_digest(every: dict[str, list[dict]]) -> str:
    """Each entry's trials against its own config (the median of its timings, one a batch): the configs tried,
    the best one's change and ratio, and the others' range; a campaign that accepts nothing shows here how
    flat the space around its table is."""
    lines = ["# What the search tried", "",
             "Each config's score over the entry's own config (its median over the batches it was timed in).", "",
             "| entry | configs tried | best change | its ratio | the others | failed |", "|---|---|---|---|---|---|"]
    for entry, rows in every.items():
        own = [row for row in rows if row.get("base")]
        own_score = statistics.median([r["score"] for r in own if math.isfinite(r["score"])] or [math.nan])
        if not own or not own_score > 0:
            lines.append(f"| {entry} | {len(rows)} | its own config was not measured | - | - | - |")
            continue
        ratios: dict[str, float] = {}
        failed = 0
        for row in rows:
            if row.get("base"):
                continue
            if not math.isfinite(row["score"]):
                failed += 1
                continue
            change = describe(own[0]["config"], row["config"])
            ratios[change] = max(ratios.get(change, 0.0), row["score"] / own_score)
        ranked = sorted(ratios.items(), key=lambda item: -item[1])
        best = f"{ranked[0][0]} | {ranked[0][1]:.3f}x" if ranked else "- | -"
        others = [ratio for _, ratio in ranked[1:]]
        spread = f"{min(others):.3f}-{max(others):.3f}x" if others else "-"
        lines.append(f"| {entry} | {len(ratios) + failed} | {best} | {spread} | {failed} |")
    return "\n".join(lines) + "\n"


def layer_classes(shapes: Sequence[Shape], shape_class: Callable[[dict[str, int]], str] | None
                  ) -> dict[str, list[Shape]]:
    """The bucket's shapes by class (the op's `shape_class`, e.g. the layer), in name order; one class (all
    of them) for an op that has none."""
    if shape_class is None:
        return {"": list(shapes)}
    classes: dict[str, list[Shape]] = {}
    for shape in shapes:
        classes.setdefault(shape_class(dict(shape.dims)), []).append(shape)
    return dict(sorted(classes.items()))


def class_search(context: RoundContext, algorithm: str, budget: int, measure: ShapesMeasure, bucket: str,
                 cls: str, members: Sequence[Shape], base: Config) -> SearchResult:
    """The algorithm's search from the bucket's config on one class's shapes alone, recorded as its entry."""
    found = make_search(algorithm, load_space(context.root, context.manifest), budget, seed=context.number) \
        .search(base, measure.on(members))
    record(context, f"{bucket} {cls}", found, base)
    return found


def split_disagreeing(context: RoundContext, algorithm: str, budget: int, measure: ShapesMeasure, bucket: str,
                      classes: dict[str, list[Shape]], base: Config, winner: Config) -> dict[str, Config]:
    """Buckets that follow the shapes: where the winner slows a class down past the per-shape regression
    limit in its own trials, that class gets an entry `<bucket> <class>` of its own: the best its own
    search finds, or the bucket's config as it was."""
    rules = load_rules()
    splits = {}
    for cls, members in classes.items():
        as_was, with_winner = measure.on(members)([base, winner], 1)
        if with_winner >= (1.0 - rules.per_shape_regression_pct / 100.0) * as_was:  # NaN (it failed): split
            continue
        found = class_search(context, algorithm, budget, measure, bucket, cls, members, base)
        splits[f"{bucket} {cls}"] = found.best if pays(found, base, rules.noise_floor_pct) else base
    return splits


def own_class_configs(context: RoundContext, algorithm: str, budget: int, measure: ShapesMeasure, bucket: str,
                      classes: dict[str, list[Shape]], base: Config) -> dict[str, tuple[Config, float]]:
    """Where no config beat the bucket's on its classes together: each class's own search, and the winners
    that beat the bucket's config there by the noise floor (and are not known not to pay), with their
    gains."""
    floor = load_rules().noise_floor_pct
    found = {}
    for cls, members in classes.items():
        own = class_search(context, algorithm, budget, measure, bucket, cls, members, base)
        key = f"{bucket} {cls}"
        if pays(own, base, floor) and not known_ineffective(context, bucket, base, own.best, split=key):
            found[key] = own.best, own.gain_pct
    return found


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
    floor = load_rules().noise_floor_pct
    done: list[str] = context.scratch.setdefault("settled", [])
    used = bucket_shapes(context, lambda s: module.buckets_for(dict(s.dims), variant))
    for bucket in sorted(used, key=lambda b: retunes(context).get(b, 0)):  # breadth first: stable by name
        shapes = used[bucket]
        _, table = read_tuning(context.root / file)
        if bucket in settled(context) or bucket not in table:
            continue
        base = table[bucket]
        classes = layer_classes(shapes, getattr(module, "shape_class", None))
        with opened(measure_for(context, bucket, shapes)) as measure:
            result = make_search(algorithm, load_space(context.root, context.manifest), budget,
                                 seed=context.number).search(base, measure)
            record(context, bucket, result, base)
            if not math.isfinite(result.base_score):
                # Not "nothing beat it": the screen could not run the table's own config (the op's runner under
                # capture, the GPU's memory...), so it judged nothing. A round of its own says so.
                done.append(bucket)
                return Failed(f"the trials could not measure the '{bucket}' bucket at its own config, so they "
                              f"judged nothing there: the workers' logs and errors are in "
                              f"rounds/round-{context.number}/trials/")
            if pays(result, base, floor) and not known_ineffective(context, bucket, base, result.best):
                splits = split_disagreeing(context, algorithm, budget, measure, bucket, classes, base, result.best) \
                    if len(classes) > 1 else {}
                proposal = retuned(bucket, base, result, splits, algorithm, shapes, file)
            else:
                own = own_class_configs(context, algorithm, budget, measure, bucket, classes, base) \
                    if len(classes) > 1 else {}
                if not own:
                    done.append(bucket)
                    continue
                proposal = split_off(bucket, base, own, shapes, classes, algorithm, file)
        rewrite_table(context.root / file, with_entries(table, bucket, proposal.params["new"],
                                                        proposal.params["split"]))
        return Proposed(proposal)
    return Exhausted(f"{algorithm} search: no bucket left whose trials beat its config by the "
                     f"{floor:g}% noise floor, on its shapes together or on any one class of them")


def retuned(bucket: str, base: Config, result: SearchResult, splits: dict[str, Config], algorithm: str,
            shapes: Sequence[Shape], file: str) -> Proposal:
    """The proposal of a bucket's new config (and the split entries of the classes it would slow down)."""
    tried = len({json.dumps(s.config, sort_keys=True) for s in result.trials})
    split_text = "".join(f"; split '{key}': {describe(base, cfg) or 'kept'}" for key, cfg in splits.items())
    return Proposal(
        hypothesis=(f"retune the '{bucket}' bucket ({algorithm} search, {tried} configs tried on "
                    f"{', '.join(s.label for s in shapes)}): the best tried {result.gain_pct:+.1f}% over the "
                    "current config there" + (", and the layers it would slow down keep a config of their own"
                                              if splits else "")),
        summary=f"{bucket}: {describe(base, result.best)}{split_text}"[:200],
        expected_gain_pct=result.gain_pct,
        params={"file": file, "bucket": bucket, "old": base, "new": result.best, "algorithm": algorithm,
                "tried": tried, "trial_gain_pct": round(result.gain_pct, 2), "split": splits},
    )


def split_off(bucket: str, base: Config, own: dict[str, tuple[Config, float]], shapes: Sequence[Shape],
              classes: dict[str, list[Shape]], algorithm: str, file: str) -> Proposal:
    """The proposal of split entries for the classes whose own search beat the bucket's config, which stays
    as it is for the rest. Its expected gain is over the bucket's shapes together (a class's gain weighted
    by its share of them, as their geomean weighs it)."""
    members = {f"{bucket} {cls}": len(of) for cls, of in classes.items()}
    expected = 100.0 * (math.prod((1 + gain / 100.0) ** (members[key] / len(shapes))
                                  for key, (_, gain) in own.items()) - 1.0)
    gains = ", ".join(f"'{key}' {gain:+.1f}%" for key, (_, gain) in own.items())
    return Proposal(
        hypothesis=(f"split the '{bucket}' bucket: no config beat it on {', '.join(s.label for s in shapes)} "
                    f"together, but {algorithm} searches on one layer class each found {gains} over it there"),
        summary=(f"{bucket} kept; " + "; ".join(f"split '{key}': {describe(base, cfg)}"
                                                for key, (cfg, _) in own.items()))[:200],
        expected_gain_pct=expected,
        params={"file": file, "bucket": bucket, "old": base, "new": base, "algorithm": algorithm,
                "trial_gain_pct": round(expected, 2), "split": {key: cfg for key, (cfg, _) in own.items()}},
    )
