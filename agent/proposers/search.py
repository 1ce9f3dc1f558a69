"""The built-in search proposer: one knob of one tuned-table bucket per round.

It reads the op's `kernels/<op>/tuning.py` (TUNABLE_SPACE, TUNED_TABLE, `buckets_for`, which
says which buckets the campaign's shapes use, and `fits`, which rejects configs the GPU cannot
run), proposes moving one knob of one used bucket to a
neighbouring value of its declared space, never a value already evaluated, ordered by expected
gain, and applies it by rewriting the TUNED_TABLE literal in place: a one-line source diff.
"""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

from agent.proposers import Proposal, ProposalContext
from agent.state import Change

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


def tuning_file(op: str) -> str:
    return f"kernels/{op}/tuning.py"


def _assignment(tree: ast.Module, name: str) -> ast.Assign | ast.AnnAssign:
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node
    raise ValueError(f"no top-level assignment to {name}")


def read_tuning(path: Path) -> tuple[dict[str, tuple[int, ...]], dict[str, dict[str, int]]]:
    """TUNABLE_SPACE and TUNED_TABLE as the file on disk holds them (literals, read without importing)."""
    tree = ast.parse(path.read_text())
    space = ast.literal_eval(_assignment(tree, "TUNABLE_SPACE").value)
    table = ast.literal_eval(_assignment(tree, "TUNED_TABLE").value)
    return space, table


def rewrite_table(path: Path, table: dict[str, dict[str, int]]) -> None:
    """Replace the TUNED_TABLE literal in `path`, one bucket a line, leaving the rest untouched."""
    source = path.read_text()
    node = _assignment(ast.parse(source), "TUNED_TABLE")
    lines = source.splitlines(keepends=True)
    head = lines[node.lineno - 1].split("=", 1)[0].rstrip()
    body = "".join(f"    {json.dumps(bucket)}: {json.dumps(cfg)},\n" for bucket, cfg in table.items())
    new = f"{head} = {{\n{body}}}\n"
    path.write_text("".join(lines[: node.lineno - 1]) + new + "".join(lines[node.end_lineno :]))


class SearchProposer:
    def buckets(self, context: ProposalContext) -> set[str]:
        buckets_for = importlib.import_module(f"kernels.{context.op}.tuning").buckets_for
        return set().union(*(buckets_for(dims, context.variant) for dims in context.shape_dims))

    def candidates(self, context: ProposalContext) -> list[Proposal]:
        """Every untried one-step move of a knob of the current direction that fits the GPU (the tuning
        module's `fits`, e.g. shared memory), best expected gain first."""
        file = tuning_file(context.op)
        space, table = read_tuning(context.root / file)
        fits = getattr(importlib.import_module(f"kernels.{context.op}.tuning"), "fits", lambda cfg: True)
        proposals = []
        for bucket in sorted(self.buckets(context) & set(table)):
            for knob in DIRECTIONS[context.direction]:
                allowed = space.get(knob, ())
                current = table[bucket][knob]
                if current not in allowed:
                    continue
                i = allowed.index(current)
                for step in (+1, -1):
                    if not 0 <= i + step < len(allowed):
                        continue
                    new = allowed[i + step]
                    if (file, bucket, knob, new) in context.visited or not fits(table[bucket] | {knob: new}):
                        continue
                    prior = PRIOR_GAIN_PCT[(knob, step)]
                    learned = context.learned_gain_pct.get((knob, step))
                    expected = prior if learned is None else (prior + learned) / 2
                    change = Change(file=file, bucket=bucket, knob=knob, old=current, new=new,
                                    direction=context.direction)
                    verb = "raise" if step > 0 else "lower"
                    hypothesis = (
                        f"{verb} {knob} of the '{bucket}' bucket from {current} to {new}: "
                        f"expected {expected:+.1f}% ({'learned' if learned is not None else 'prior'})"
                    )
                    proposals.append(Proposal(hypothesis, change, expected))
        return sorted(proposals, key=lambda p: (-p.expected_gain_pct, p.change.bucket, p.change.knob, p.change.new))

    def propose(self, context: ProposalContext) -> Proposal | None:
        ranked = self.candidates(context)
        return ranked[0] if ranked else None

    def apply(self, proposal: Proposal, root: Path) -> None:
        path = root / proposal.change.file
        _, table = read_tuning(path)
        change = proposal.change
        if table[change.bucket][change.knob] != change.old:
            raise ValueError(f"{change.file}: {change.bucket}.{change.knob} is not {change.old} any more")
        table[change.bucket][change.knob] = change.new
        rewrite_table(path, table)
