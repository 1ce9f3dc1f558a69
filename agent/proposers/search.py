"""The built-in search proposer: one knob of one tuned-table bucket per round (with an `algorithm`,
a bucket retuned per round instead: retune.py).

It reads the op's `kernels/<op>/tuning.py` (TUNABLE_SPACE, TUNED_TABLE, `buckets_for`, which
says which buckets the campaign's shapes use, and `fits`, which rejects configs the GPU cannot
run), proposes moving one knob of one used bucket to a neighbouring value of its declared space,
never a value already evaluated, ordered by expected gain, and applies it by rewriting the
TUNED_TABLE literal in place: a one-line source diff.

Knobs come in families (tile, pipeline, warps, launch order); the search works one family at a
time, starting where the roofline analysis points (compute-bound shapes: tiles and pipelining
first; memory-bound ones: launch order), and moves on when a family has nothing left or the
runner reports stagnation. Everything about buckets and knobs lives here: the rest of the runner
sees a Proposal with params.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from agent.analysis import ShapeAnalysis
from agent.knowledge import Tip, shape_class, similarity
from agent.manifest import Manifest, ProposerConfig, SearchConfig
from agent.proposers import Exhausted, Outcome, Proposed, Proposer, RoundContext
from agent.proposers.retune import BUDGET, MeasureFactory, retune, trial_pool
from agent.state import CampaignState, Proposal, RoundRecord
from agent.tuning_table import read_tuning, rewrite_table, tuning_file, tuning_module
from harness.errors import UserError

# Knob families: a campaign works one direction at a time and switches on stagnation.
DIRECTIONS: dict[str, tuple[str, ...]] = {
    "tile": ("BLOCK_M", "BLOCK_N", "BLOCK_K"),
    "pipeline": ("num_stages",),
    "warps": ("num_warps",),
    "launch-order": ("GROUP_M",),
}
# Expected gain (%) of moving a knob up (+1) or down (-1) one step, before anything is learned.
PRIOR_GAIN_PCT: dict[tuple[str, int], float] = {
    ("BLOCK_N", +1): 3.0, ("BLOCK_N", -1): 2.0,
    ("BLOCK_M", +1): 3.0, ("BLOCK_M", -1): 2.0,
    ("BLOCK_K", +1): 2.0, ("BLOCK_K", -1): 1.5,
    ("num_stages", +1): 2.5, ("num_stages", -1): 1.5,
    ("num_warps", +1): 1.5, ("num_warps", -1): 1.0,
    ("GROUP_M", +1): 1.0, ("GROUP_M", -1): 1.0,
}
Move = tuple[str, str, str, int]  # (file, bucket, knob, value)


def preferred_directions(analyses: Sequence[ShapeAnalysis]) -> list[str]:
    """Compute-bound shapes gain from bigger tiles and deeper pipelines first; memory-bound ones from
    launch order (L2 reuse) and tile shape."""
    compute = sum(a.bound == "compute" for a in analyses) >= len(analyses) / 2
    return ["tile", "pipeline", "warps", "launch-order"] if compute else ["launch-order", "tile", "warps", "pipeline"]


def _is_move(params: dict) -> bool:
    return {"file", "bucket", "knob", "old", "new"} <= set(params)


def tried_moves(history: Iterable[RoundRecord]) -> frozenset[Move]:
    """Moves already evaluated in this campaign (either end of each)."""
    seen: set[Move] = set()
    for record in history:
        params = record.candidate.params if record.candidate else {}
        if record.status != "OPEN" and _is_move(params):
            seen |= {(params["file"], params["bucket"], params["knob"], v) for v in (params["old"], params["new"])}
    return frozenset(seen)


def known_ineffective(tips: Iterable[Tip], move: Move, variant: str, shapes: str, config: Mapping[str, int]) -> bool:
    """A tip recorded this very move as not paying, measured in this very context: the same variant, shape
    class and whole bucket config (a move measured from another config may pay from this one)."""
    return any(t.outcome != "ACCEPT" and _is_move(t.params) and
               (t.params["file"], t.params["bucket"], t.params["knob"], t.params["new"]) == move and
               similarity(t, variant, shapes, config) == 1.0 for t in tips)


def learned_gains(tips: Iterable[Tip], variant: str, shapes: str, config: Mapping[str, int]
                  ) -> dict[tuple[str, int], float]:
    """Accepted gain (%) by (knob, +1 up / -1 down), averaged with each tip weighted by how similar its context
    is to this one (`similarity`)."""
    weighted: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for t in tips:
        if t.outcome == "ACCEPT" and t.gain_pct is not None and _is_move(t.params):
            key = (t.params["knob"], 1 if t.params["new"] > t.params["old"] else -1)
            weighted[key].append((similarity(t, variant, shapes, config), t.gain_pct))
    return {k: sum(w * g for w, g in v) / sum(w for w, _ in v) for k, v in weighted.items() if sum(w for w, _ in v)}


class SearchProposer(Proposer):
    """Without an algorithm: one knob of one bucket per round. With one: a bucket retuned per round by
    that algorithm, many configs tried and the winner proposed (retune.py)."""

    name = "search"

    def __init__(self, algorithm: str | None = None, measure_for: MeasureFactory = trial_pool,
                 budget: int = BUDGET) -> None:
        self.algorithm, self.measure_for, self.budget = algorithm, measure_for, budget

    @classmethod
    def from_config(cls, config: ProposerConfig) -> Proposer:
        assert isinstance(config, SearchConfig)
        return cls(config.algorithm)

    def check(self, manifest: Manifest) -> None:
        if manifest.external and manifest.tuned_table is None:
            raise UserError("the search proposer rewrites a tuned table: an external target names it as tuned_table")
        if tuning_file(manifest) not in manifest.files:
            raise UserError(f"the search proposer rewrites {tuning_file(manifest)}: keep it in mutable_files")
        if manifest.external and self.algorithm:
            raise UserError(f"algorithm '{self.algorithm}' screens configs through turbo-opt's harness; an external "
                            "target's search is the one-knob walk (leave algorithm out)")

    def candidates(self, context: RoundContext, direction: str) -> list[Proposal]:
        """Every untried one-step move of a knob of `direction` that fits the GPU (the tuning module's
        `fits`, e.g. shared memory), best expected gain first."""
        variant = context.manifest.resolved_variant
        file = tuning_file(context.manifest)
        space, table = read_tuning(context.root / file)
        module = tuning_module(context.root, context.manifest)
        fits = getattr(module, "fits", lambda cfg: True)
        used = set().union(*(module.buckets_for(dict(s.dims), variant) for s in context.shapes))
        visited = tried_moves(context.history)
        shapes = shape_class(context.manifest)
        proposals = []
        for bucket in sorted(used & set(table)):
            learned_pct = learned_gains(context.tips, variant, shapes, table[bucket])
            for knob in DIRECTIONS[direction]:
                allowed = space.get(knob, ())
                current = table[bucket].get(knob)  # a table may tune only some knobs (an external one)
                if current not in allowed:
                    continue
                i = allowed.index(current)
                for step in (+1, -1):
                    if not 0 <= i + step < len(allowed):
                        continue
                    new = allowed[i + step]
                    move = (file, bucket, knob, new)
                    if (move in visited or not fits(table[bucket] | {knob: new})
                            or known_ineffective(context.tips, move, variant, shapes, table[bucket])):
                        continue
                    prior = PRIOR_GAIN_PCT[(knob, step)]
                    learned = learned_pct.get((knob, step))
                    expected = prior if learned is None else (prior + learned) / 2
                    verb = "raise" if step > 0 else "lower"
                    proposals.append(Proposal(
                        hypothesis=(f"{verb} {knob} of the '{bucket}' bucket from {current} to {new}: expected "
                                    f"{expected:+.1f}% ({'learned' if learned is not None else 'prior'})"),
                        summary=f"{bucket} {knob} {current} -> {new}",
                        expected_gain_pct=expected,
                        params={"file": file, "bucket": bucket, "knob": knob, "old": current, "new": new,
                                "direction": direction, "config": table[bucket]},
                    ))
        return sorted(proposals, key=lambda p: (-(p.expected_gain_pct or 0.0), p.params["bucket"], p.params["knob"],
                                                p.params["new"]))

    def propose(self, context: RoundContext) -> Outcome:
        if self.algorithm:
            return retune(context, self.algorithm, self.measure_for, self.budget)
        exhausted: list[str] = context.scratch.setdefault("exhausted", [])
        current = context.scratch.get("direction")
        if context.after_stagnation and current and current not in exhausted:
            exhausted.append(current)  # this family stalled: switch
        for direction in preferred_directions(context.analyses):
            if direction in exhausted:
                continue
            ranked = self.candidates(context, direction)
            if not ranked:
                exhausted.append(direction)
                continue
            context.scratch["direction"] = direction
            self.apply(ranked[0], context.root)
            return Proposed(ranked[0])
        return Exhausted("search space exhausted: every knob family was tried")

    def apply(self, proposal: Proposal, root: Path) -> None:
        p = proposal.params
        path = root / p["file"]
        _, table = read_tuning(path)
        if table[p["bucket"]][p["knob"]] != p["old"]:
            raise ValueError(f"{p['file']}: {p['bucket']}.{p['knob']} is not {p['old']} any more")
        table[p["bucket"]][p["knob"]] = p["new"]
        rewrite_table(path, table)

    def next_steps(self, state: CampaignState) -> list[str]:
        if self.algorithm:
            done = ", ".join(state.proposer_state.get("settled", [])) or "none"
            return [f"Buckets the {self.algorithm} search settled (nothing better found, or its winner rolled "
                    f"back): {done}.",
                    f"What each round's trials read against the table's configs: rounds/round-<n>/trials.md (the "
                    f"last search: round {state.round})."]
        exhausted = state.proposer_state.get("exhausted", [])
        open_families = [d for d in DIRECTIONS if d not in exhausted]
        lines = [f"Knob families not exhausted: {', '.join(open_families) or 'none'}; a new campaign on this "
                 "manifest continues from the accepted tuned tables and skips what this one found ineffective."]
        if not open_families:
            lines.append("The tuned tables are at a local optimum: the next gains need kernel changes "
                         "(a `command` or `manual` proposer), not tuning.")
        return lines
