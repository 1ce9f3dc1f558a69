"""What a campaign writes for people: per-round summary.md, the append-only logs, report.md and
the plot of the primary metric by round."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from agent.manifest import Manifest
from agent.state import CampaignState, Measurement, RoundRecord
from harness.files import atomic_write_text
from harness.schema import read_summary

TREND_HEADER = (
    "| round | status | description | fwd geomean | bwd geomean | step geomean | vs baseline |\n"
    "|---|---|---|---|---|---|---|\n"
)


def _pct(new: float, old: float) -> str:
    return f"{(new / old - 1) * 100:+.1f}%" if old and math.isfinite(new) and math.isfinite(old) else "n/a"


def _describe(record: RoundRecord) -> str:
    return record.description or ("baseline" if record.number == 1 else "-")


def init_logs(run_dir: Path, manifest: Manifest) -> None:
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if not (logs / "optimize.md").exists():
        (logs / "optimize.md").write_text(f"# Campaign {manifest.campaign}: {manifest.op} ({manifest.backend})\n\n")
    if not (logs / "performance_trend.md").exists():
        (logs / "performance_trend.md").write_text(
            f"# Performance trend: {manifest.op}, primary metric {manifest.primary_metric}\n\n" + TREND_HEADER
        )


def round_summary(
    run_dir: Path, record: RoundRecord, manifest: Manifest, best_before: Measurement | None, baseline: Measurement
) -> str:
    """summary.md of a closed round: hypothesis, change, per-shape table, SNR, decision and why."""
    metric = manifest.primary_metric
    lines = [f"# Round {record.number}: {record.status}", ""]
    if record.number > 1:
        lines += [f"- Direction: {record.direction}", f"- Hypothesis: {record.hypothesis}",
                  f"- Change: `{_describe(record)}` in `{record.change.file if record.change else '-'}`",
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
    return "\n".join(lines) + "\n"


def close_round(
    run_dir: Path, state: CampaignState, record: RoundRecord, manifest: Manifest, best_before: Measurement | None
) -> None:
    """Write the round's summary and append it to both logs."""
    assert state.baseline is not None
    round_dir = run_dir / "rounds" / f"round-{record.number}"
    atomic_write_text(round_dir / "summary.md", round_summary(run_dir, record, manifest, best_before, state.baseline))
    m = record.measurements[-1] if record.measurements else None
    g = m.geomeans if m else {}
    base = state.rounds[0].measurements[0].geomeans[manifest.primary_metric]  # baseline, representative shapes
    optimize_log = run_dir / "logs" / "optimize.md"
    if f"## Round {record.number}:" in optimize_log.read_text():  # closed before a kill: append once only
        return
    with optimize_log.open("a") as log:
        log.write(f"## Round {record.number}: {record.status}\n\n- {_describe(record)}: {record.hypothesis or '-'}\n"
                  f"- {record.reason}\n" + (f"- commit {record.commit}\n" if record.commit else "") + "\n")
    with (run_dir / "logs" / "performance_trend.md").open("a") as trend:
        cells = [f"{g.get(k, math.nan):.4g}" for k in ("forward", "backward", "step")]
        if m and not m.all_pass:  # geomeans over the shapes that still pass would flatter a broken candidate
            cells, vs = ["FAIL"] * 3, f"FAIL on {len(m.failed)} shape(s)"
        else:
            vs = _pct(g.get(manifest.primary_metric, math.nan), base) if m else "n/a"
        trend.write(f"| {record.number} | {record.status} | {_describe(record)} | {' | '.join(cells)} | {vs} |\n")


def plot_rounds(run_dir: Path, state: CampaignState, manifest: Manifest, path: Path) -> Path:
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
    ax.set_title(f"{manifest.campaign}: {manifest.op} ({'green accept, red rollback'})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _vendor_columns(run_dir: Path, metric: str) -> dict[str, dict[str, float]]:
    """The vendor baselines measured at BASELINE, by name: label -> primary metric (forward if absent)."""
    vendors = {}
    for csv in sorted((run_dir / "rounds" / "round-1" / "artifacts").glob("benchmark.baseline-*.csv")):
        summary = read_summary(csv)
        values = summary.metric(metric)
        if values.isna().all():
            values = summary.metric("forward")
        vendors[csv.stem.removeprefix("benchmark.baseline-")] = values.to_dict()
    return vendors


def write_report(run_dir: Path, state: CampaignState, manifest: Manifest, final: Measurement, next_steps: str) -> Path:
    assert state.baseline is not None
    metric = manifest.primary_metric
    vendors = _vendor_columns(run_dir, metric)
    base = state.baseline
    opt = state.optimization_rounds()
    accepted = [r for r in opt if r.status == "ACCEPT"]
    lines = [
        f"# Campaign report: {manifest.campaign}", "",
        f"- Op: `{manifest.op}` ({manifest.backend}), variant `{manifest.resolved_variant}`, device {state.device}",
        f"- Primary metric: {metric}; branch `{state.branch}`; best commit `{state.best_commit[:12]}`",
        f"- Rounds: {len(opt)} ({len(accepted)} accepted); stopped because: {state.stop_reason}",
        f"- {metric} geomean over all shapes: baseline {base.geomeans[metric]:.4g}, best {final.geomeans[metric]:.4g} "
        f"({_pct(final.geomeans[metric], base.geomeans[metric])}); every shape "
        f"{'PASS' if final.all_pass else 'NOT PASS: ' + ', '.join(final.failed)}",
        "", f"![{metric} by round](metric_by_round.png)", "",
        f"## Baseline vs best, per shape ({metric})", "",
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
              "| round | status | direction | change | expected | measured vs best | reason | commit |",
              "|---|---|---|---|---|---|---|---|"]
    for r in opt:
        measured = f"{r.gain_pct:+.2f}%" if r.gain_pct is not None else "n/a"
        lines.append(f"| {r.number} | {r.status} | {r.direction} | {_describe(r)} | {r.expected_gain_pct:+.1f}% | "
                     f"{measured} | {r.reason} | {(r.commit or '')[:10]} |")
    ineffective = sorted({f"{r.change.bucket} {r.change.knob} -> {r.change.new}" for r in opt
                          if r.status != "ACCEPT" and r.change})
    lines += ["", "## Ineffective directions", ""] + [f"- {x}" for x in ineffective or ["none"]]
    lines += ["", f"Exhausted knob families: {', '.join(state.exhausted_directions) or 'none'}", "",
              "## Next steps", "", next_steps, ""]
    plot_rounds(run_dir, state, manifest, run_dir / "metric_by_round.png")
    return atomic_write_text(run_dir / "report.md", "\n".join(lines))
