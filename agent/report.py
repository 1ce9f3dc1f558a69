"""What a campaign writes for people and agents: per-round summary.md and decision.json, the
append-only logs, report.md and the plot of the primary metric by round."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from agent.decision import DecisionRecord
from agent.knowledge import Tip, shape_class
from agent.manifest import Manifest
from agent.standings import ShapeStanding
from agent.state import CampaignState, Measurement, RoundRecord, Termination
from harness.files import atomic_write_text
from harness.meta import read_meta
from harness.schema import read_summary
from harness.stats import geomean

# "vs best (decided)" is the gain the decision was made on (A/B pairs, per-shape medians), with the spread of
# the pairs' own gains; "accepted, compounded" chains the accepted ones: the basis of REPORT's reproduction
# check. The geomeans are the last measurement's, unpaired.
TREND_HEADER = (
    "| round | status | change | fwd geomean | bwd geomean | step geomean | vs baseline | vs best (decided) "
    "| spread | accepted, compounded |\n"
    "|---|---|---|---|---|---|---|---|---|---|\n"
)


def _pct(new: float, old: float) -> str:
    return f"{(new / old - 1) * 100:+.1f}%" if old and math.isfinite(new) and math.isfinite(old) else "n/a"


def _ratio_pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.1f}%" if math.isfinite(ratio) else "n/a"


def campaign_tips(state: CampaignState) -> list[Tip]:
    """What each closed round taught, as tips with their context (REPORT writes them to tips.yaml)."""
    m = state.manifest
    return [
        Tip(op=m.op, backend=m.backend, device=state.device, variant=m.resolved_variant,
            shape_class=shape_class(m), summary=r.summary, hypothesis=r.candidate.hypothesis,
            params=r.candidate.params, proposer=r.candidate.proposer, outcome=r.status, gain_pct=r.gain_pct,
            reason=r.reason, campaign=m.name, commit=r.commit,
            evidence=f"campaigns/runs/{m.name}/rounds/round-{r.number}/decision.json")
        for r in state.closed_rounds() if r.candidate is not None
    ]


def compounded_gain(state: CampaignState, through: int) -> float:
    """The accepted rounds' decided gains up to round `through`, compounded (a ratio: 1.0 is no gain)."""
    return math.prod(1.0 + r.gain_pct / 100.0 for r in state.optimization_rounds()
                     if r.number <= through and r.status == "ACCEPT" and r.gain_pct is not None)


def init_logs(run_dir: Path, manifest: Manifest) -> None:
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if not (logs / "optimize.md").exists():
        (logs / "optimize.md").write_text(f"# Campaign {manifest.campaign}: {manifest.op} ({manifest.backend})\n\n")
    if not (logs / "performance_trend.md").exists():
        (logs / "performance_trend.md").write_text(
            f"# Performance trend: {manifest.op}, primary metric {manifest.primary_metric}\n\n" + TREND_HEADER
        )


def attribution_lines(ratios: dict[str, dict[str, float]]) -> list[str]:
    """Which passes and shapes moved: a table of candidate over best per shape and pass, geomean last."""
    if not ratios:
        return []
    lines = ["| shape | forward | backward | step |", "|---|---|---|---|"]
    for label, by_pass in ratios.items():
        lines.append(f"| {label} | " + " | ".join(_ratio_pct(by_pass.get(p, math.nan))
                                                   for p in ("forward", "backward", "step")) + " |")
    lines.append("| geomean | " + " | ".join(_ratio_pct(geomean(r.get(p, math.nan) for r in ratios.values()))
                                            for p in ("forward", "backward", "step")) + " |")
    return lines


def attribution_details(ratios: dict[str, dict[str, float]]) -> str:
    """One line for the commit message: the passes' geomeans and the shape that moved most."""
    if not ratios:
        return "no paired measurement"
    passes = ", ".join(f"{p} {_ratio_pct(geomean(r.get(p, math.nan) for r in ratios.values()))}"
                       for p in ("forward", "backward", "step"))
    moved = max(ratios, key=lambda label: abs(math.log(ratios[label].get("step", 1.0))))
    return (f"{passes} (vs the best measured next to it); most moved: {moved} "
            f"{_ratio_pct(ratios[moved].get('step', math.nan))} step")


def rollback_analysis(record: RoundRecord, ratios: dict[str, dict[str, float]], run_dir: Path) -> list[str]:
    """What a rolled-back round did wrong: the check that fired, the shapes that regressed and by how much."""
    lines = [f"- Verdict: {record.reason}"]
    if record.measurements:
        meta = read_meta(run_dir / record.measurements[-1].csv)
        lines += [f"- Unannounced shape {label}: {error}" for label, error in meta.probe_errors.items()]
        lines += [f"- {label}: {error}" for label, error in meta.errors.items()]
    slower = sorted(((label, p, r) for label, by_pass in ratios.items() for p, r in by_pass.items()
                     if p != "step" and math.isfinite(r) and r < 1.0), key=lambda x: x[2])
    lines += [f"- {label} {p}: {(1 - r) * 100:.1f}% slower than the best" for label, p, r in slower[:6]]
    if not record.measurements:
        lines.append("- Never measured: rejected before it ran")
    return lines


def next_direction(record: RoundRecord, standings: list[ShapeStanding]) -> str:
    """Where the next round should look: the representative shape furthest below a vendor library."""
    gaps = [(ratio, s.label, vendor, s.host_bound) for s in standings for vendor, ratio in s.vs_vendor.items()
            if ratio is not None]
    gap = ""
    if gaps:
        ratio, label, vendor, host_bound = min(gaps)
        gap = f"the largest gap left is {label} at {ratio:.3f}x {vendor}"
        if host_bound:
            gap += f" ({'/'.join(host_bound)} host-bound: the host's time per call sets it, not the kernels')"
    if record.status == "ACCEPT":
        return f"build on this commit; {gap or 'no vendor baseline to compare with'}"
    return f"do not repeat '{record.summary}' as is; {gap or 'no vendor baseline to compare with'}"


def round_summary(run_dir: Path, record: RoundRecord, manifest: Manifest, best_before: Measurement | None,
                  baseline: Measurement, ratios: dict[str, dict[str, float]], next_step: str) -> str:
    """summary.md of a closed round: hypothesis, change, per-shape table, attribution, decision and why."""
    metric = manifest.primary_metric
    lines = [f"# Round {record.number}: {record.status}", ""]
    c = record.candidate
    if record.number > 1:
        lines += [f"- Proposer: {c.proposer if c else manifest.proposer.kind}",
                  f"- Hypothesis: {c.hypothesis if c else '-'}",
                  f"- Change: {record.summary} (`candidate.diff`; files: {', '.join(c.changed) if c else '-'})",
                  f"- Risk: {c.risk if c else '-'}; expected gain: "
                  + (f"{c.expected_gain_pct:+.1f}%" if c and c.expected_gain_pct is not None else "not stated"),
                  f"- Validation: {'all shapes' if record.full_validation else 'representative shapes'},"
                  f" {len(record.measurements)} measurement(s)"
                  + (", each next to a re-measurement of the best" if record.references else "")]
    lines += [f"- Decision: **{record.status}**: {record.reason}", ""]
    if record.analysis:
        lines += ["## Analysis", "", record.analysis, ""]
    if record.measurements:
        m = record.measurements[-1]
        summary = read_summary(run_dir / m.csv)
        snr = summary.frame.set_index("label")[list(summary.schema.snr_columns)].min(axis=1)
        lines += [f"## Per shape ({metric}, {summary.schema.metric})", "",
                  "| shape | Check | this round | vs best | vs baseline | min SNR (dB) |", "|---|---|---|---|---|---|"]
        checks = summary.checks()
        # "vs best" is against the best as measured next to this round when it was (a paired reference).
        reference = record.references[-1] if record.references else best_before
        for label, value in m.per_shape.items():
            best = reference.per_shape.get(label, math.nan) if reference else math.nan
            base = baseline.per_shape.get(label, math.nan)
            lines.append(f"| {label} | {checks[label]} | {value:.4g} | {_pct(value, best)} | {_pct(value, base)} "
                         f"| {snr[label]:.1f} |")
        lines.append("")
    if record.number > 1:
        lines += ["## Attribution", "", *(attribution_lines(ratios) or ["Not measured next to the best."]), ""]
        if record.status != "ACCEPT":
            lines += ["## Rollback analysis", "", *rollback_analysis(record, ratios, run_dir), ""]
        lines += ["## Next direction", "", next_step, ""]
    return "\n".join(lines)


def close_round(run_dir: Path, state: CampaignState, record: RoundRecord, best_before: Measurement | None,
                ratios: dict[str, dict[str, float]], next_step: str, next_action: str) -> None:
    """Write the round's summary.md and decision.json and append it to both logs (once, even after a kill)."""
    assert state.baseline is not None
    manifest = state.manifest
    round_dir = run_dir / "rounds" / f"round-{record.number}"
    atomic_write_text(round_dir / "summary.md",
                      round_summary(run_dir, record, manifest, best_before, state.baseline, ratios, next_step))
    decision = DecisionRecord.of(manifest.name, record, state.best_commit, ratios, next_action)
    atomic_write_text(round_dir / "decision.json", decision.model_dump_json(indent=2) + "\n")
    m = record.measurements[-1] if record.measurements else None
    g = m.geomeans if m else {}
    base = state.rounds[0].measurements[0].geomeans[manifest.primary_metric]  # baseline, representative shapes
    optimize_log = run_dir / "logs" / "optimize.md"
    if f"## Round {record.number}:" in optimize_log.read_text():  # closed before a kill: append once only
        return
    hypothesis = record.candidate.hypothesis if record.candidate else "-"
    with optimize_log.open("a") as log:
        log.write(f"## Round {record.number}: {record.status}\n\n- {record.summary}: {hypothesis}\n"
                  f"- {record.reason}\n" + (f"- commit {record.commit}\n" if record.commit else "") + "\n")
    with (run_dir / "logs" / "performance_trend.md").open("a") as trend:
        cells = [f"{g.get(k, math.nan):.4g}" for k in ("forward", "backward", "step")]
        if m and not m.all_pass:  # geomeans over the shapes that still pass would flatter a broken candidate
            cells, vs = ["FAIL"] * 3, f"FAIL on {len(m.failed)} shape(s)"
        else:
            vs = _pct(g.get(manifest.primary_metric, math.nan), base) if m else "n/a"
        decided = f"{record.gain_pct:+.2f}%" if record.gain_pct is not None else "n/a"
        spread = f"{record.spread_pct:.2f}%" if record.spread_pct is not None else "-"
        trend.write(f"| {record.number} | {record.status} | {record.summary} | {' | '.join(cells)} | {vs} | {decided} "
                    f"| {spread} | {_ratio_pct(compounded_gain(state, record.number))} |\n")


def plot_rounds(run_dir: Path, state: CampaignState, path: Path) -> Path:
    manifest = state.manifest
    metric = manifest.primary_metric
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = {"ACCEPT": "tab:green", "ROLLBACK": "tab:red", "ERROR": "black", "OPEN": "grey"}
    best_line = []
    best = math.nan
    for r in state.rounds:
        if not r.measurements:
            continue
        if not r.measurements[-1].all_pass:
            ax.axvline(r.number, color="black", alpha=0.3, linestyle=":")  # a FAIL round has no honest value
            continue
        value = r.measurements[-1].geomeans[metric]
        ax.scatter(r.number, value, color=colors[r.status], zorder=3)
        if r.status == "ACCEPT":
            best = value
        best_line.append((r.number, best))
    if best_line:
        ax.step(*zip(*best_line, strict=True), where="post", color="tab:blue", label="best so far")
    unit = read_summary(run_dir / state.rounds[0].measurements[0].csv).schema.metric
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round (1 = baseline; dotted: a round with FAIL rows)")
    ax.set_ylabel(f"{metric} geomean, representative shapes ({unit})")
    ax.set_title(f"{manifest.campaign}: {manifest.op} (green accept, red rollback)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _headline(baseline: float, best: float, accepted: list[RoundRecord]) -> str:
    """Baseline vs best over all shapes; where no round was accepted the best is the start itself, and the
    two benches' difference is drift, not a gain (a campaign that changed nothing must not read +6%)."""
    change = _pct(best, baseline)
    if accepted:
        return f"baseline {baseline:.4g}, best {best:.4g} ({change})"
    return (f"no round was accepted, so the best is the start: its final bench {best:.4g} against the baseline "
            f"bench {baseline:.4g} ({change}) is two benches of the same code, drift and not a gain")


def write_report(run_dir: Path, state: CampaignState, vendors: dict[str, dict[str, float]],
                 termination: list[Termination], next_steps: list[str]) -> Path:
    """report.md: baseline vs best per shape and against the vendors, the rounds, the stop conditions."""
    assert state.baseline is not None and state.final is not None
    manifest, final, base = state.manifest, state.final, state.baseline
    metric = manifest.primary_metric
    opt = state.optimization_rounds()
    accepted = [r for r in opt if r.status == "ACCEPT"]
    lines = [
        f"# Campaign report: {manifest.campaign}", "",
        f"- Op: `{manifest.op}` ({manifest.backend}), variant `{manifest.resolved_variant}`, device {state.device}"
        + (f"; an external target in `{manifest.repo}` ({manifest.execution_mode} mode)" if manifest.repo else ""),
        f"- Proposer: {manifest.proposer.kind}; primary metric: {metric}; branch `{state.branch}`; best commit "
        f"`{state.best_commit[:12]}`",
        f"- Rounds: {len(opt)} ({len(accepted)} accepted); stopped because: {state.stop_reason}",
        f"- {metric} geomean over all shapes: {_headline(base.geomeans[metric], final.geomeans[metric], accepted)}"
        f"; every shape {'PASS' if final.all_pass else 'NOT PASS: ' + ', '.join(final.failed)}",
        f"- Reproduced in the final bench: {'yes' if state.reproduced else 'NO'} ({state.reproduction})",
        *[f"- Note: {note}" for note in state.notes],
        "", f"![{metric} by round](metric_by_round.png)", "",
        f"## Baseline vs best, per shape ({metric})", "",
        *([] if accepted else ["No round was accepted: both columns bench the start's code, minutes apart; their "
                               "ratio is the machine's drift.", ""]),
        "| shape | baseline | best | speedup | " + " | ".join(f"{v} | best / {v}" for v in vendors) + " |",
        "|---|---|---|---|" + "---|---|" * len(vendors),
    ]
    for label, value in final.per_shape.items():
        b = base.per_shape[label]
        cells = [f"{b:.4g}", f"{value:.4g}", f"{value / b:.3f}x" if b else "n/a"]
        for values in vendors.values():
            v = values.get(label, math.nan)
            cells += [f"{v:.4g}", f"{value / v:.3f}x" if v and math.isfinite(v) else "n/a"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "## Rounds", "",
              "| round | status | proposer | change | expected | measured vs best | spread | fresh tensors | reason "
              "| commit |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in opt:
        c = r.candidate
        expected = f"{c.expected_gain_pct:+.1f}%" if c and c.expected_gain_pct is not None else "-"
        measured = f"{r.gain_pct:+.2f}%" if r.gain_pct is not None else "n/a"
        fresh = f"{r.fresh_gain_pct:+.2f}%" if r.fresh_gain_pct is not None else "n/a"
        spread = f"{r.spread_pct:.2f}%" if r.spread_pct is not None else "-"
        lines.append(f"| {r.number} | {r.status} | {c.proposer if c else '-'} | {r.summary} | {expected} | "
                     f"{measured} | {spread} | {fresh} | {r.reason} | {(r.commit or '')[:10]} |")
    ineffective = sorted({f"{r.summary}: {r.reason}" for r in opt if r.ineffective})
    lines += ["", "## Ineffective directions", ""] + [f"- {x}" for x in ineffective or ["none"]]
    lines += ["", "## Termination check", "", "| condition | threshold | value | met |", "|---|---|---|---|"]
    lines += [f"| {t.condition} | {t.threshold} | {t.value} | {'yes' if t.met else 'no'} |" for t in termination]
    lines += ["", "## Next steps", "", *[f"- {s}" for s in next_steps], ""]
    plot_rounds(run_dir, state, run_dir / "metric_by_round.png")
    return atomic_write_text(run_dir / "report.md", "\n".join(lines))
