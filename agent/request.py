"""The request: everything an agent or a person needs to propose one round's change, as
`rounds/round-N/request.json` (a pydantic model whose JSON schema is published in docs/schemas/)
and `request.md` (the same, for reading).

It holds the target and metric; best vs baseline vs the vendor libraries per shape; the roofline
analysis; every earlier round with its hypothesis, verdict and measured effect; what proved
ineffective; the files that may change; the rules and checks that will judge; the knowledge files
and tips that apply; and exactly how to hand the change back.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel

from agent.analysis import ShapeAnalysis
from agent.audit import RULES as AUDIT_RULES
from agent.knowledge import KnowledgeFile, Tip
from agent.standings import ShapeStanding
from agent.state import CampaignState, Proposal, RoundRecord, Termination
from harness.rules import IterationRules

SCHEMA_VERSION = 1


class RoundSummary(BaseModel):
    number: int
    status: str
    summary: str
    hypothesis: str
    proposer: str
    gain_pct: float | None
    fresh_gain_pct: float | None
    reason: str
    commit: str | None

    @classmethod
    def of(cls, record: RoundRecord) -> RoundSummary:
        c = record.candidate
        return cls(number=record.number, status=record.status, summary=record.summary,
                   hypothesis=c.hypothesis if c else "", proposer=c.proposer if c else "",
                   gain_pct=record.gain_pct, fresh_gain_pct=record.fresh_gain_pct, reason=record.reason,
                   commit=record.commit)


class RoofPoint(BaseModel):
    label: str
    bound: str
    flop_per_byte: float
    forward_tflops: float
    roofline_tflops: float | None

    @classmethod
    def of(cls, a: ShapeAnalysis) -> RoofPoint:
        roof = a.roofline_tflops if math.isfinite(a.roofline_tflops) else None
        return cls(label=a.label, bound=a.bound, flop_per_byte=a.intensity, forward_tflops=a.achieved_tflops,
                   roofline_tflops=roof)


class Judging(BaseModel):
    """The rules a candidate is judged by (rules/iteration_rules.yaml) and the checks that enforce them."""

    rules_doc: str = "rules/iteration_rules.md"
    numbers: IterationRules
    audit_rules: dict[str, str]
    checks: list[str]


class Submission(BaseModel):
    """How the change comes back to the runner."""

    how: Literal["submit", "proposal-file", "built-in"]
    command: str | None = None
    proposal_file: str | None = None
    proposal_fields: dict[str, str] = {}
    must_not: list[str]


class Request(BaseModel):
    schema_version: int = SCHEMA_VERSION
    campaign: str
    round: int
    op: str
    op_description: str
    variant: str
    backend: str
    device: str
    proposer: str
    primary_metric: str
    metric_unit: str
    after_stagnation: bool
    full_validation: bool
    stop_conditions: list[Termination]
    representative_shapes: list[str]
    shapes_file: str
    baseline_geomean: float
    best_geomean: float
    best_round: int
    best_commit: str
    standings: list[ShapeStanding]
    roofline: list[RoofPoint]
    rounds: list[RoundSummary]
    ineffective: list[str]
    mutable_files: list[str]
    check_command: str
    judging: Judging
    knowledge: list[KnowledgeFile]
    tips: list[Tip]
    submission: Submission


VALIDATE_CHECKS = [
    "every output (forward and every gradient) against a float64 reference by SNR, outputs NaN-poisoned first",
    "through the op's autograd API as a training step calls it, twice with both results kept alive (aliasing)",
    "the outputs of the timed calls, and a re-check on refilled inputs after timing (caches keyed on tensors)",
    "inputs unchanged, no near-zero output, no thread left running when the call returns",
    "grouped ops on skewed and empty group splits",
    "fresh random ragged shapes every measurement that the campaign does not announce, and large magnitudes "
    "with long K and fp32 outputs where the op promises fp32 accumulation",
    "timed with fresh input tensors too: a gain must survive them; a gap between reused and fresh tensors "
    "larger than the best's is a result cache",
    "the best commit re-measured next to the candidate; noise floor, per-shape regression limit, "
    "implausible speedups re-measured, rates above the roofline rejected",
]


def submission(proposer: str, campaign: str, proposal_file: str, home: str | None = None) -> Submission:
    """How the change is handed back; `home` is turbo-opt's checkout when the proposer works in another one
    (an external target), so that `turbo-opt submit` finds the campaign from there."""
    must_not = [
        "edit any file but the mutable files (harness/, rules/, tests/, the campaign dir: refused and undone)",
        "create new files (refused and removed)",
        "commit, reset, switch branches or stash (an ERROR round; HEAD must stay at the best commit)",
    ]
    fields = {name: str(info.description or info.annotation) for name, info in Proposal.model_fields.items()}
    if proposer == "manual":
        return Submission(how="submit", must_not=must_not, proposal_fields=fields,
                          command=(f"TURBO_OPT_HOME={home} " if home else "")
                          + f'turbo-opt submit {campaign} --hypothesis "..." --summary "..." '
                                  "[--risk high] [--expected-gain PCT] [--json]")
    if proposer == "command":
        return Submission(how="proposal-file", proposal_file=proposal_file, proposal_fields=fields, must_not=must_not)
    return Submission(how="built-in", must_not=must_not)


def _pct(value: float | None) -> str:
    return f"{value:+.2f}%" if value is not None and math.isfinite(value) else "n/a"


def _ratio(value: float | None) -> str:
    return f"{value:.3f}x" if value is not None and math.isfinite(value) else "n/a"


def render(request: Request) -> str:
    """request.md: the request for a reader (agent or person)."""
    r = request
    vendors = list(r.standings[0].vs_vendor) if r.standings else []
    lines = [
        f"# Round {r.round} of campaign {r.campaign}: propose one change", "",
        f"- Op: `{r.op}` ({r.op_description}), variant `{r.variant}`, backend {r.backend}, device {r.device}",
        f"- Primary metric: **{r.primary_metric}** ({r.metric_unit}, geomean over the representative shapes): "
        f"baseline {r.baseline_geomean:.4g}, best {r.best_geomean:.4g} "
        f"({_ratio(r.best_geomean / r.baseline_geomean if r.baseline_geomean else math.nan)}, "
        f"round {r.best_round}, commit `{r.best_commit[:12]}`)",
        f"- Proposer: {r.proposer}. The tree is at the best commit on the campaign branch.",
    ]
    if r.after_stagnation:
        lines.append("- The last rounds were all rolled back: try a different direction. This round is validated "
                     "on every shape.")
    elif r.full_validation:
        lines.append("- This round is validated on every shape.")
    lines += ["", "## Stop conditions", "", "| condition | threshold | now | met |", "|---|---|---|---|"]
    lines += [f"| {c.condition} | {c.threshold} | {c.value} | {'yes' if c.met else 'no'} |" for c in r.stop_conditions]
    lines += ["", f"## Per representative shape ({r.primary_metric}; vendors on their own metric)", "",
              "| shape | baseline | best | best/baseline | " + " | ".join(f"best/{v}" for v in vendors) + " |",
              "|---|---|---|---|" + "---|" * len(vendors)]
    for s in r.standings:
        cells = [f"{s.baseline:.4g}", f"{s.best:.4g}", _ratio(s.speedup)] + [_ratio(s.vs_vendor[v]) for v in vendors]
        lines.append(f"| {s.label} | " + " | ".join(cells) + " |")
    lines += ["", "## Roofline (forward, the best commit)", "",
              "| shape | FLOP/byte | bound | TFLOPS | roofline | efficiency |", "|---|---|---|---|---|---|"]
    for p in r.roofline:
        roof = f"{p.roofline_tflops:.4g}" if p.roofline_tflops else "n/a (no measured ceilings)"
        eff = f"{p.forward_tflops / p.roofline_tflops:.0%}" if p.roofline_tflops else "n/a"
        lines.append(f"| {p.label} | {p.flop_per_byte:.0f} | {p.bound} | {p.forward_tflops:.4g} | {roof} | {eff} |")
    lines += ["", "## Earlier rounds", "", "| round | status | change | hypothesis | gain | fresh | reason |",
              "|---|---|---|---|---|---|---|"]
    for h in r.rounds:
        lines.append(f"| {h.number} | {h.status} | {h.summary} | {h.hypothesis or '-'} | {_pct(h.gain_pct)} | "
                     f"{_pct(h.fresh_gain_pct)} | {h.reason} |")
    lines += ["", "## Ineffective so far (do not repeat as is)", ""] + [f"- {x}" for x in r.ineffective or ["none"]]
    lines += ["", "## What you may change", ""] + [f"- `{f}`" for f in r.mutable_files]
    lines += ["", f"Check a change yourself before handing it back (correctness and speed, representative shapes): "
              f"`{r.check_command}`"]
    lines += ["", "## How it will be judged", "",
              f"Rules: `{r.judging.rules_doc}` (numbers in rules/iteration_rules.yaml). SNR minimums (dB): "
              + ", ".join(f"{k} {v:g}" for k, v in r.judging.numbers.snr_thresholds_db.items())
              + f". Noise floor {r.judging.numbers.noise_floor_pct:g}%, no shape slower than the best by more than "
              f"{r.judging.numbers.per_shape_regression_pct:g}%, a gain must keep "
              f"{r.judging.numbers.fresh_gain_fraction:.0%} of itself with fresh tensors.", "",
              "Checked before it runs (the audit of the changed files, AST): "
              + "; ".join(f"`{k}` ({v})" for k, v in r.judging.audit_rules.items()) + ".", "",
              "Checked when it runs:"] + [f"- {c}" for c in r.judging.checks]
    lines += ["", "## Knowledge that applies", ""]
    lines += [f"- `{k.path}`: {k.title}. {k.summary}" for k in r.knowledge] or ["- none"]
    if r.tips:
        lines += ["", "Tips of this op, device and variant:", ""]
        lines += [f"- {t.outcome} {t.summary} ({_pct(t.gain_pct)}; {t.reason})" for t in r.tips]
    lines += ["", "## Handing the change back", ""]
    s = r.submission
    if s.how == "submit":
        lines.append(f"Edit the mutable files in this checkout, then run:\n\n    {s.command}\n")
    elif s.how == "proposal-file":
        lines.append(f"Edit the mutable files in this checkout, then write `{s.proposal_file}` (JSON, "
                     "docs/schemas/proposal.schema.json) and exit 0:\n")
    else:
        lines.append("The built-in search applies its own move; this request is its record.\n")
    lines += [f"- `{name}`: {what}" for name, what in s.proposal_fields.items()]
    lines += ["", "Do not:"] + [f"- {x}" for x in s.must_not]
    return "\n".join(lines) + "\n"


def build_request(
    state: CampaignState, record: RoundRecord, *, op_description: str, proposer: str, unit: str,
    stop: list[Termination], standing: list[ShapeStanding], analyses: list[ShapeAnalysis], rules: IterationRules,
    knowledge: list[KnowledgeFile], tips: list[Tip], representative_file: str, proposal_file: str, check_command: str,
    home: str | None = None,
) -> Request:
    """The request of round `record` of the campaign in `state` (paths repo-relative)."""
    assert state.best is not None
    m, metric = state.manifest, state.manifest.primary_metric
    return Request(
        campaign=m.name, round=record.number, op=m.op, op_description=op_description, variant=m.resolved_variant,
        backend=m.backend, device=state.device, proposer=proposer, primary_metric=metric, metric_unit=unit,
        after_stagnation=record.after_stagnation, full_validation=record.full_validation, stop_conditions=stop,
        representative_shapes=m.representative_shapes, shapes_file=representative_file,
        baseline_geomean=state.rounds[0].measurements[0].geomeans[metric], best_geomean=state.best.geomeans[metric],
        best_round=state.best_round, best_commit=state.best_commit, standings=standing,
        roofline=[RoofPoint.of(a) for a in analyses],
        rounds=[RoundSummary.of(r) for r in state.rounds if r.status != "OPEN"],
        ineffective=[f"round {r.number}: {r.summary} ({r.reason})" for r in state.closed_rounds() if r.ineffective],
        mutable_files=m.files,
        check_command=check_command,
        judging=Judging(numbers=rules, audit_rules=dict(AUDIT_RULES), checks=VALIDATE_CHECKS),
        knowledge=knowledge, tips=tips, submission=submission(proposer, m.name, proposal_file, home),
    )
