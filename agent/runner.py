"""The campaign state machine:

    DEFINE_TARGET -> PREPARE_ENVIRONMENT -> BASELINE -> (ANALYZE -> OPTIMIZE -> VALIDATE -> DECIDE)* -> REPORT

state.json is written after every step. Each step can be re-run after a kill: OPTIMIZE and
VALIDATE first put the mutable files back at the best commit (VALIDATE then re-applies the
round's saved candidate.diff), DECIDE does not commit a round twice, and a round's log lines are
written once. The working tree is only ever at the best commit or at best + the candidate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml
from rich.console import Console

from agent.analysis import ShapeAnalysis, analyze, describe, measure_ceilings, preferred_directions
from agent.audit import audit_source, write_scope
from agent.knowledge import Tip, learned_gains, load_tips, verified_ineffective, write_tips
from agent.lineage import Lineage
from agent.manifest import Manifest, load_manifest, write_manifest
from agent.measure import BenchRequest, MeasureError, run_bench
from agent.proposers import ProposalContext, Proposer
from agent.proposers.search import DIRECTIONS, SearchProposer, tuning_file
from agent.report import close_round, init_logs, write_report
from agent.scoring import Decision, decide, measure, stagnated, termination_reason
from agent.state import CampaignState, RoundRecord, load_state, save_state
from harness.errors import UserError
from harness.files import atomic_write_text
from harness.meta import harness_hash, read_meta
from harness.registry import get_spec
from harness.rules import load_rules
from harness.schema import FAIL, Summary, read_summary
from harness.shapes import Shape, load_shapes
from kernels.common.device import default_device, interpreter_mode

Measurer = Callable[[BenchRequest], None]


def runs_dir(root: Path) -> Path:
    return root / "campaigns" / "runs"


def pick_representative(shapes: list[Shape], flops: dict[str, float], limit: int = 4) -> list[str]:
    """The smallest, median and largest shapes by forward FLOPs, and the largest skewed one if any."""
    by_work = sorted(shapes, key=lambda s: flops[s.label])
    picked = [by_work[0].label, by_work[len(by_work) // 2].label, by_work[-1].label]
    skewed = [s for s in by_work if s.group_lens and max(s.group_lens) - min(s.group_lens) > 1]
    if skewed:
        picked.append(skewed[-1].label)
    return list(dict.fromkeys(picked))[:limit]


def write_shapes(path: Path, shapes: list[Shape]) -> Path:
    return atomic_write_text(path, yaml.safe_dump({"shapes": [s.model_dump(mode="json") for s in shapes]}))


class Campaign:
    def __init__(
        self, root: Path, manifest: Manifest, state: CampaignState, measurer: Measurer | None = None,
        console: Console | None = None, proposer: Proposer | None = None,
    ) -> None:
        self.root = root
        self.manifest = manifest
        self.state = state
        self.run_dir = runs_dir(root) / manifest.campaign
        self.spec = get_spec(manifest.op)
        self.rules = load_rules()
        self.lineage = Lineage(root)
        self.proposer = proposer or SearchProposer()
        self.measurer = measurer or (lambda request: run_bench(root, manifest, request, self.state.harness_hash))
        self.console = console or Console()
        self.steps = {
            "DEFINE_TARGET": self._define_target, "PREPARE_ENVIRONMENT": self._prepare_environment,
            "BASELINE": self._baseline, "ANALYZE": self._analyze, "OPTIMIZE": self._optimize,
            "VALIDATE": self._validate, "DECIDE": self._decide, "REPORT": self._report,
        }

    # --- creation ---------------------------------------------------------------------------------

    @classmethod
    def create(cls, root: Path, manifest: Manifest, **kwargs: object) -> Campaign:
        """Check everything, then write the campaign dir: nothing is touched if anything is wrong."""
        Lineage(root).ensure_clean()
        if tuning_file(manifest.op) not in manifest.files:
            raise UserError(f"the search proposer rewrites {tuning_file(manifest.op)}: keep it in mutable_files")
        run_dir = runs_dir(root) / manifest.campaign
        if run_dir.exists():
            raise UserError(f"campaign '{manifest.campaign}' already exists: `turbo-opt resume {manifest.campaign}`")
        campaign = cls(root, manifest, CampaignState(campaign=manifest.campaign), **kwargs)
        campaign.shapes()  # an unknown preset or a bad shape file fails here, before anything is written
        run_dir.mkdir(parents=True)
        write_manifest(manifest, run_dir / "manifest.yaml")
        campaign.save()
        return campaign

    @classmethod
    def open(cls, root: Path, name: str, **kwargs: object) -> Campaign:
        run_dir = runs_dir(root) / name
        if not (run_dir / "state.json").exists():
            known = ", ".join(sorted(p.name for p in runs_dir(root).glob("*") if (p / "state.json").exists()))
            raise UserError(f"no campaign '{name}' in {runs_dir(root)} (campaigns: {known or 'none'})")
        return cls(root, load_manifest(run_dir / "manifest.yaml"), load_state(run_dir / "state.json"), **kwargs)

    # --- helpers ----------------------------------------------------------------------------------

    def save(self) -> None:
        save_state(self.state, self.run_dir / "state.json")

    def shapes(self) -> list[Shape]:
        source = self.manifest.shapes
        if isinstance(source, list):
            return source
        path = Path(source)
        if source.endswith((".yaml", ".yml")) and not path.is_absolute():
            source = str(self.root / path)
        return load_shapes(self.spec.shape_family, source)

    def round_dir(self, number: int) -> Path:
        return self.run_dir / "rounds" / f"round-{number}"

    def rel(self, path: Path) -> str:
        return path.relative_to(self.run_dir).as_posix()

    def say(self, message: str) -> None:
        prefix = f"[bold cyan]{self.manifest.campaign}[/] round {self.state.round}"
        self.console.print(f"{prefix} {message}", highlight=False)

    def _measure(self, request: BenchRequest, what: str) -> Summary:
        with self.console.status(f"measuring {what}..."):
            self.measurer(request)
        return read_summary(request.summary_csv)

    def speedup(self) -> float:
        """Best over baseline on the primary metric, both on the representative shapes (nan before BASELINE)."""
        if self.state.best is None or not self.state.rounds:
            return math.nan
        metric = self.manifest.primary_metric
        return self.state.best.geomeans[metric] / self.state.rounds[0].measurements[0].geomeans[metric]

    def _tips(self) -> list[Tip]:
        return load_tips(self.root, self.manifest.op, self.state.device, self.manifest.resolved_variant)

    # --- the loop ---------------------------------------------------------------------------------

    def run(self) -> CampaignState:
        while self.state.phase != "DONE":
            started = time.monotonic()
            self.steps[self.state.phase]()
            self.state.elapsed_s += time.monotonic() - started
            self.save()
        return self.state

    def _define_target(self) -> None:
        init_logs(self.run_dir, self.manifest)
        m = self.manifest
        self.say(f"target: {m.op} ({m.resolved_variant}), {m.primary_metric} metric, {m.max_iterations} rounds at most")
        self.state.phase = "PREPARE_ENVIRONMENT"

    def _prepare_environment(self) -> None:
        if not self.state.start_commit:
            self.lineage.ensure_clean()
            self.state.start_commit = self.lineage.head()
        self.state.branch = self.manifest.branch_name
        self.lineage.checkout_branch(self.state.branch, self.state.start_commit)
        self.state.best_commit = self.state.best_commit or self.state.start_commit
        self.state.harness_hash = harness_hash(self.root / "harness")
        device = default_device()
        self.state.device = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)"
        self.state.ceilings = measure_ceilings(device)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the measurements run in subprocesses: leave them the memory
        if interpreter_mode():
            self.say("[yellow]CPU interpreter: timings prove the loop, never performance[/]")
        self.say(f"branch {self.state.branch}, device {self.state.device}, ceilings {self.state.ceilings or 'n/a'}")
        self.state.phase = "BASELINE"

    def _baseline(self) -> None:
        rd = self.round_dir(1)
        shapes = self.shapes()
        write_shapes(self.run_dir / "shapes.yaml", shapes)
        csv = rd / "artifacts" / "benchmark.csv"
        summary = self._measure(
            BenchRequest(self.run_dir / "shapes.yaml", csv, rd / "artifacts" / "bench.log", compare_baselines=True),
            f"the baseline on {len(shapes)} shapes",
        )
        failed = [label for label, check in summary.checks().items() if check == FAIL]
        if failed:
            raise UserError(f"the baseline has FAIL rows ({', '.join(failed[:3])}): a campaign starts from a correct "
                            f"kernel; see {csv}")
        flops = dict(zip(summary.labels, summary.metric("forward") * summary.frame.set_index("label")[
            summary.schema.fwd_ms] * 1e9, strict=True))
        reps = self.manifest.representative_shapes or pick_representative(shapes, flops)
        self.manifest = self.manifest.model_copy(update={"representative_shapes": reps})
        write_manifest(self.manifest, self.run_dir / "manifest.yaml")
        write_shapes(self.run_dir / "representative.yaml", [s for s in shapes if s.label in reps])
        metric = self.manifest.primary_metric
        fresh_ms = read_meta(csv).fresh_ms
        self.state.baseline = measure(summary, metric, self.rel(csv), None, fresh_ms)
        self.state.best = measure(summary, metric, self.rel(csv), reps, fresh_ms)
        (rd / "candidate.diff").write_text("")  # the baseline changes nothing
        # Round 1 records the representative shapes, like every later round: the trend compares like with like.
        record = RoundRecord(number=1, status="ACCEPT", reason=f"baseline: {len(shapes)} shapes, every one PASS",
                             measurements=[self.state.best], commit=self.state.start_commit)
        self.state.rounds = [record]
        close_round(self.run_dir, self.state, record, self.manifest, None)
        self.say(f"baseline {metric} geomean {self.state.baseline.geomeans[metric]:.4g}; representative: {reps}")
        self.state.round = 2
        self.state.phase = "ANALYZE"

    def _analyze(self) -> None:
        assert self.state.baseline is not None and self.state.best is not None
        if self.state.rounds[-1].number == self.state.round:  # back from an OPTIMIZE that found nothing
            self.state.rounds.pop()
        reason = termination_reason(
            rounds_done=self.state.round - 2, max_iterations=self.manifest.max_iterations,
            elapsed_s=self.state.elapsed_s, max_duration_s=self.manifest.max_duration_min * 60, speedup=self.speedup(),
            target_speedup=self.manifest.target_speedup, stop_requested=(self.run_dir / "STOP").exists(),
        )
        analyses = self._analyses()
        full = False
        if reason is None and stagnated(self.state.consecutive_rollbacks, self.rules):
            # The direction has stalled: switch, and validate the next round on every shape.
            self.state.exhausted_directions.append(self._direction(analyses) or "")
            self.state.consecutive_rollbacks = 0
            full = True
        direction = self._direction(analyses)
        if reason is None and direction is None:
            reason = "search space exhausted: every knob family was tried"
        if reason is not None:
            self.state.stop_reason = reason
            self.say(f"stop: {reason}")
            self.state.phase = "REPORT"
            return
        self.state.rounds.append(RoundRecord(number=self.state.round, direction=direction,
                                             analysis=describe(analyses), full_validation=full))
        self.state.phase = "OPTIMIZE"

    def _analyses(self) -> list[ShapeAnalysis]:
        """The representative shapes on the roofline, from the best measurement."""
        assert self.state.best is not None
        csv = self.run_dir / self.state.best.csv
        reps = self.manifest.representative_shapes
        return analyze(self.spec, [s for s in self.shapes() if s.label in reps], read_summary(csv),
                       read_meta(csv).dtype, self.manifest.resolved_variant, self.state.ceilings)

    def _direction(self, analyses: list[ShapeAnalysis]) -> str | None:
        return next((d for d in preferred_directions(analyses) if d not in self.state.exhausted_directions), None)

    def _visited(self) -> frozenset[tuple[str, str, str, int]]:
        seen = verified_ineffective(self._tips())
        for r in self.state.rounds:
            if r.change and r.status != "OPEN":
                seen |= {(r.change.file, r.change.bucket, r.change.knob, v) for v in (r.change.old, r.change.new)}
        return frozenset(seen)

    def _optimize(self) -> None:
        record = self.state.current
        self.lineage.discard_changes(self.state.best_commit)  # the tree exactly at the best commit
        context = ProposalContext(
            op=self.manifest.op, variant=self.manifest.resolved_variant, root=self.root,
            shape_dims=tuple(dict(s.dims) for s in self.shapes()), direction=record.direction,
            visited=self._visited(), learned_gain_pct=learned_gains(self._tips()),
        )
        proposal = self.proposer.propose(context)
        if proposal is None:
            self.say(f"no untried move left in the '{record.direction}' direction")
            self.state.exhausted_directions.append(record.direction)
            self.state.phase = "ANALYZE"
            return
        self.proposer.apply(proposal, self.root)
        rd = self.round_dir(record.number)
        rd.mkdir(parents=True, exist_ok=True)
        record.hypothesis = proposal.hypothesis
        record.description = proposal.summary
        record.change = proposal.change
        record.expected_gain_pct = proposal.expected_gain_pct
        record.full_validation = record.full_validation or proposal.risk == "high"
        self.say(f"OPTIMIZE: {proposal.hypothesis}")
        # The whole candidate is kept (out-of-scope edits too), then judged before it is ever run.
        atomic_write_text(rd / "candidate.diff", self.lineage.diff() + "\n")
        rejection = self._static_rejection()
        if rejection:
            record.status, record.reason = "ROLLBACK", rejection
            self.lineage.discard_changes(self.state.best_commit)
            self.state.phase = "DECIDE"
            return
        self.state.phase = "VALIDATE"

    def _static_rejection(self) -> str | None:
        """Why a candidate is rejected unseen: a path outside the mutable files, or an audit finding."""
        changed = self.lineage.dirty_paths()
        outside = write_scope(changed, self.manifest.files)
        if outside:
            return f"write scope: touched {', '.join(outside)} (mutable: {', '.join(self.manifest.files)})"
        findings = [f for path in changed if path.endswith(".py")
                    for f in audit_source(path, (self.root / path).read_text())]
        return f"audit: {'; '.join(map(str, findings))}" if findings else None

    def _validate(self) -> None:
        record = self.state.current
        rd = self.round_dir(record.number)
        self.lineage.restore(self.state.best_commit, self.manifest.files)
        self.lineage.apply(rd / "candidate.diff")
        n = len(record.measurements)
        csv = rd / "artifacts" / ("benchmark.csv" if n == 0 else f"benchmark.remeasure-{n}.csv")
        shapes_file = self.run_dir / ("shapes.yaml" if record.full_validation else "representative.yaml")
        request = BenchRequest(shapes_file, csv, csv.with_suffix(".log"))
        try:
            which = "all" if record.full_validation else "representative"
            summary = self._measure(request, f"round {record.number} ({which} shapes)")
        except MeasureError as exc:
            record.status, record.reason = "ERROR", str(exc)
            self.state.phase = "DECIDE"
            return
        crashes = {label: e for label, e in read_meta(csv).errors.items() if not e.startswith("check:")}
        if crashes:  # the candidate did not run (it raised), as opposed to running and being wrong
            label, error = next(iter(crashes.items()))
            record.status, record.reason = "ERROR", f"raised on {label}: {error}"
            self.state.phase = "DECIDE"
            return
        metric = self.manifest.primary_metric
        shapes = self.manifest.representative_shapes
        candidate = measure(summary, metric, self.rel(csv), shapes, read_meta(csv).fresh_ms)
        if self.manifest.paired_reference and candidate.all_pass:
            reference_csv = csv.with_name(csv.name.replace("benchmark", "reference"))
            # The decision reads the representative shapes only: the best is re-measured on those.
            request = BenchRequest(self.run_dir / "representative.yaml", reference_csv,
                                   reference_csv.with_suffix(".log"))
            self.lineage.restore(self.state.best_commit, self.manifest.files)
            try:
                reference = self._measure(request, f"the best (round {self.state.best_round}) next to it")
            except MeasureError as exc:
                record.status, record.reason = "ERROR", f"re-measuring the best failed: {exc}"
                self.state.phase = "DECIDE"
                return
            self.lineage.apply(rd / "candidate.diff")
            record.references.append(measure(reference, metric, self.rel(reference_csv), shapes,
                                             read_meta(reference_csv).fresh_ms))
        record.measurements.append(candidate)
        if record.full_validation:
            record.reason = self._full_validation_problem(summary) or ""
        self.state.phase = "DECIDE"

    def _full_validation_problem(self, summary: Summary) -> str | None:
        """On every shape: all PASS and none slower than the baseline past the regression limit."""
        everything = measure(summary, self.manifest.primary_metric, "", None)
        if not everything.all_pass:
            return f"full validation: FAIL on {', '.join(everything.failed)}"
        assert self.state.baseline is not None
        limit = 1.0 - self.rules.per_shape_regression_pct / 100.0
        worse = [label for label, v in everything.per_shape.items() if v < limit * self.state.baseline.per_shape[label]]
        return f"full validation: slower than the baseline on {', '.join(worse)}" if worse else None

    def _decide(self) -> None:
        record = self.state.current
        best_before = self.state.best
        assert best_before is not None
        if record.status == "OPEN":
            verdict = decide(record.measurements, record.references or [best_before], self.manifest.primary_metric,
                             self.rules, self.manifest.representative_shapes)
            if record.reason.startswith("full validation"):
                verdict = Decision("ROLLBACK", record.reason, verdict.gain_pct)
            above = self._above_roofline(record) if verdict.verdict == "ACCEPT" else None
            if above:
                verdict = Decision("ROLLBACK", above, verdict.gain_pct)
            if verdict.verdict == "REMEASURE":
                self.say(f"DECIDE: {verdict.reason}: re-measuring")
                self.state.phase = "VALIDATE"
                return
            record.status = "ACCEPT" if verdict.verdict == "ACCEPT" else "ROLLBACK"
            record.reason = verdict.reason + self._check_details(record)
            record.gain_pct = verdict.gain_pct if math.isfinite(verdict.gain_pct) else None
        if record.status == "ACCEPT":
            self._accept(record)
        else:
            self.lineage.discard_changes(self.state.best_commit)
            self.state.consecutive_rollbacks += 1
        close_round(self.run_dir, self.state, record, self.manifest, best_before)
        self.say(f"DECIDE: [{'green' if record.status == 'ACCEPT' else 'red'}]{record.status}[/] {record.reason}")
        self.state.round += 1
        self.state.phase = "ANALYZE"

    def _above_roofline(self, record: RoundRecord) -> str | None:
        """A forward rate above `roofline_margin` times the shape's measured roofline cannot be real."""
        if not self.state.ceilings:
            return None
        summary = read_summary(self.run_dir / record.measurements[-1].csv)
        forward = summary.metric("forward")
        analyses = analyze(self.spec, [s for s in self.shapes() if s.label in self.manifest.representative_shapes],
                           summary, read_meta(self.run_dir / record.measurements[-1].csv).dtype,
                           self.manifest.resolved_variant, self.state.ceilings)
        margin = self.rules.roofline_margin
        over = [f"{a.label} {forward[a.label]:.0f} > {margin:g} x {a.roofline_tflops:.0f} TFLOPS" for a in analyses
                if forward[a.label] > margin * a.roofline_tflops]
        return f"above the roofline (a measurement that cannot be real): {', '.join(over)}" if over else None

    def _check_details(self, record: RoundRecord) -> str:
        """Why rows FAILed: the harness's check message (an input written, a stale re-check...) or the SNRs."""
        if not record.measurements or record.measurements[-1].all_pass:
            return ""
        csv = self.run_dir / record.measurements[-1].csv
        errors = read_meta(csv).errors
        summary = read_summary(csv)
        snrs = summary.frame.set_index("label")[list(summary.schema.snr_columns)]
        details = []
        for label in record.measurements[-1].failed:
            snr_text = ", ".join(f"{c.removesuffix('_snr')} {v:.1f} dB" for c, v in snrs.loc[label].items())
            why = errors.get(label) or snr_text
            details.append(f"; {label}: {why}")
        return "".join(details)

    def _accept(self, record: RoundRecord) -> None:
        subject = f"[optimize] {self.manifest.op} {self.manifest.backend} round-{record.number}:"
        if self.lineage.head_message().startswith(subject):  # committed before a kill: do not commit twice
            record.commit = self.lineage.head()
        else:
            message = (f"{subject} {record.description}\n\nHypothesis: {record.hypothesis}\n"
                       f"Result: {record.reason}\n")
            record.commit = self.lineage.commit(self.manifest.files, message)
        metric = self.manifest.primary_metric
        ranked = sorted(record.measurements, key=lambda m: m.geomeans[metric])
        self.state.best = ranked[(len(ranked) - 1) // 2]  # the median (lower) measurement, not the luckiest
        self.state.best_commit = record.commit
        self.state.best_round = record.number
        self.state.consecutive_rollbacks = 0

    def _report(self) -> None:
        self.lineage.discard_changes(self.state.best_commit)
        final_dir = self.run_dir / "final"
        csv = final_dir / "benchmark.csv"
        summary = self._measure(BenchRequest(self.run_dir / "shapes.yaml", csv, final_dir / "bench.log"),
                                "the best on every shape")
        final = measure(summary, self.manifest.primary_metric, self.rel(csv))
        tips = [
            Tip(op=self.manifest.op, backend=self.manifest.backend, device=self.state.device,
                variant=self.manifest.resolved_variant, file=r.change.file, bucket=r.change.bucket,
                knob=r.change.knob, old=r.change.old, new=r.change.new, outcome=r.status, gain_pct=r.gain_pct,
                reason=r.reason, campaign=self.manifest.campaign)
            for r in self.state.optimization_rounds() if r.change and r.status != "OPEN"
        ]
        write_tips(self.run_dir / "tips.yaml", tips)
        write_report(self.run_dir, self.state, self.manifest, final, self._next_steps())
        self.say(f"REPORT: {self.run_dir / 'report.md'}")
        self.state.phase = "DONE"

    def _next_steps(self) -> str:
        open_families = [d for d in DIRECTIONS if d not in self.state.exhausted_directions]
        lines = [f"- Knob families not exhausted: {', '.join(open_families) or 'none'}; "
                 f"`turbo-opt start --manifest {self.rel(self.run_dir / 'manifest.yaml')}` with a new name continues "
                 "from the accepted tuned tables and skips what this campaign found ineffective."]
        if len(self.state.exhausted_directions) == len(DIRECTIONS):
            lines.append("- The tuned tables are at a local optimum: the next gains need kernel changes "
                         "(a `command` or `manual` proposer), not tuning.")
        return "\n".join(lines)

