"""The campaign state machine:

    DEFINE_TARGET -> PREPARE_ENVIRONMENT -> BASELINE
        -> (ANALYZE -> OPTIMIZE [-> AWAITING_CANDIDATE] -> SCREEN -> VALIDATE -> DECIDE)* -> REPORT

state.json is written after every step, so a kill at any moment resumes where it was: every step
starts by putting the tree back where its state says (the best commit, or the best commit plus the
round's saved candidate.diff), DECIDE does not commit a round twice, and a round's log lines are
written once. The runner is the only one that measures and decides; proposers (agent/proposers)
only change the tree. The work of each phase lives in a module named for it: screening.py,
bench.py (VALIDATE's subprocess), scoring.py and decision.py (DECIDE), request.py, report.py.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from rich.console import Console

from agent import lock
from agent.analysis import ShapeAnalysis, analyze, describe, device_ceilings, efficiency_geomean
from agent.bench import BenchRequest, run_bench
from agent.decision import attribution, judge
from agent.knowledge import Tip, applicable, general_knowledge, load_tips, write_tips
from agent.lineage import Lineage
from agent.manifest import Manifest, SchemaDeclaration, manifest_text, write_manifest
from agent.processes import ChildRegistry
from agent.proposers import Awaiting, Exhausted, Failed, Proposed, Proposer, RoundContext, make_proposer
from agent.report import attribution_details, campaign_tips, close_round, init_logs, next_direction, write_report
from agent.request import Request, build_request, render
from agent.scoring import recorded_best, reproduction, score, stagnated
from agent.screening import capture, screen
from agent.standings import primary_vendor, standings, vendors
from agent.state import CampaignState, Proposal, RoundRecord, Termination, load_state, save_state
from agent.target import check_command, csv_schema, focused_test, measure, own_packages, shapes_of
from agent.termination import Progress, stop_conditions, stop_reason
from agent.validation import probe_seed, validate
from harness.errors import UserError
from harness.files import atomic_write_text
from harness.meta import harness_hash, read_meta
from harness.registry import get_spec
from harness.rules import load_rules
from harness.schema import FAIL, Summary, read_summary
from harness.shapes import Shape, load_shape_file, load_shapes, write_shape_file
from harness.stats import geomean
from kernels.common.device import default_device, interpreter_mode
from kernels.common.opspec import OpSpec

Measurer = Callable[[BenchRequest], None]
ROUND_PHASES = ("OPTIMIZE", "SCREEN", "VALIDATE", "DECIDE")


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


class Campaign:
    def __init__(
        self, root: Path, state: CampaignState, measurer: Measurer | None = None, console: Console | None = None,
        proposer: Proposer | None = None,
    ) -> None:
        self.root = root
        self.state = state
        self.manifest: Manifest = state.manifest
        self.run_dir = runs_dir(root) / self.manifest.name
        # turbo-opt's own op, or None for an external target (which has no OpSpec: its commands measure it)
        self.spec: OpSpec | None = None if self.manifest.external else get_spec(self.manifest.op)
        self.rules = load_rules()
        self.children = ChildRegistry(self.run_dir / "children.json")
        self.proposer = proposer or make_proposer(self.manifest.proposer)
        self.measurer = measurer or self._measure
        self.console = console or Console()
        self._lock_depth = 0
        self.steps = {
            "DEFINE_TARGET": self._define_target, "PREPARE_ENVIRONMENT": self._prepare_environment,
            "BASELINE": self._baseline, "ANALYZE": self._analyze, "OPTIMIZE": self._optimize,
            "SCREEN": self._screen, "VALIDATE": self._validate, "DECIDE": self._decide, "REPORT": self._report,
        }

    # --- creation ---------------------------------------------------------------------------------

    @classmethod
    def create(cls, root: Path, manifest: Manifest, *, measurer: Measurer | None = None, console: Console | None = None,
               proposer: Proposer | None = None) -> Campaign:
        """Check everything, then write the campaign dir: nothing is touched if anything is wrong."""
        if manifest.repo is not None:
            target = Lineage(manifest.repo)
            if target.root == Lineage(root).root:
                raise UserError(f"{target.root} is both the target and turbo-opt's home: run turbo-opt from its own "
                                "checkout (or set TURBO_OPT_HOME), so that the referee is outside the target's scope")
            target.ensure_clean()
        else:
            Lineage(root).ensure_clean()
        run_dir = runs_dir(root) / manifest.name
        if run_dir.exists():
            raise UserError(f"campaign '{manifest.name}' already exists: `turbo-opt resume {manifest.name}`")
        campaign = cls(root, CampaignState(campaign=manifest.name, manifest=manifest), measurer, console, proposer)
        campaign.proposer.check(manifest)
        campaign.shapes()  # an unknown preset or a bad shape file fails here, before anything is written
        run_dir.mkdir(parents=True)
        write_manifest(manifest, run_dir / "manifest.yaml")
        campaign.save()
        return campaign

    @classmethod
    def open(cls, root: Path, name: str, *, measurer: Measurer | None = None, console: Console | None = None,
             proposer: Proposer | None = None) -> Campaign:
        run_dir = runs_dir(root) / name
        if not (run_dir / "state.json").exists():
            known = ", ".join(sorted(p.name for p in runs_dir(root).glob("*") if (p / "state.json").exists()))
            raise UserError(f"no campaign '{name}' in {runs_dir(root)} (campaigns: {known or 'none'})")
        return cls(root, load_state(run_dir / "state.json"), measurer, console, proposer)

    # --- helpers ----------------------------------------------------------------------------------

    def save(self) -> None:
        save_state(self.state, self.run_dir / "state.json")

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """One process drives a campaign at a time (the OS drops the lock of a killed one); whoever takes it
        first ends the children a killed runner left behind, before anything is measured."""
        if self._lock_depth:
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
            return
        with lock.hold(self.run_dir, self.manifest.name):
            self.state = load_state(self.run_dir / "state.json")  # what the last holder left, not a stale copy
            self.manifest = self.state.manifest
            ended = self.children.reap()
            if ended:
                self.say(f"ended {len(ended)} process group(s) left by a killed runner: "
                         + ", ".join(c.command[:60] for c in ended))
            self._lock_depth = 1
            try:
                yield
            finally:
                self._lock_depth = 0

    @property
    def checkout(self) -> Path:
        """Where candidates are made, measured and committed: this repository for turbo-opt's own ops; the
        target's repository, or its worktree in the campaign dir (`workspace` mode), for an external one."""
        m = self.manifest
        if m.repo is None:
            return self.root
        return self.run_dir / "workspace" if m.in_workspace else m.repo

    @functools.cached_property
    def lineage(self) -> Lineage:
        return Lineage(self.checkout)

    def _measure(self, request: BenchRequest) -> None:
        if self.manifest.external:
            measure(self.manifest, self.checkout, request, home=self.root, expected_harness=self.state.harness_hash,
                    device=self.state.device, registry=self.children)
        else:
            run_bench(self.root, self.manifest, request, self.state.harness_hash, self.children)

    def focused_test(self, log: Path) -> str | None:
        return focused_test(self.manifest, self.checkout, log, self.children)

    def shapes(self) -> list[Shape]:
        source = self.manifest.shapes
        if isinstance(source, list):
            return source
        if source is None:  # an external target's benchmark chose them: its baseline CSV named them
            written = self.run_dir / "shapes.yaml"
            return load_shape_file(written) if written.exists() else []
        assert self.spec is not None
        path = Path(source)
        if source.endswith((".yaml", ".yml")) and not path.is_absolute():
            source = str(self.root / path)
        return load_shapes(self.spec.shape_family, source)

    def round_dir(self, number: int) -> Path:
        return self.run_dir / "rounds" / f"round-{number}"

    def rel(self, path: Path) -> str:
        return path.relative_to(self.run_dir).as_posix()

    def repo_path(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def shown_path(self, path: Path) -> str:
        """A path as the proposer sees it: relative to the checkout it works in, else absolute."""
        return path.relative_to(self.checkout).as_posix() if path.is_relative_to(self.checkout) else str(path)

    def say(self, message: str) -> None:
        prefix = f"[bold cyan]{self.manifest.campaign}[/] round {self.state.round}"
        self.console.print(f"{prefix} {message}", highlight=False)

    def _bench(self, request: BenchRequest, what: str) -> Summary:
        with self.console.status(f"measuring {what}..."):
            self.measurer(request)
        return read_summary(request.summary_csv, csv_schema(self.manifest, request.summary_csv))

    def speedup(self) -> float:
        """Best over baseline on the primary metric, both on the representative shapes (nan before BASELINE)."""
        if self.state.best is None or not self.state.rounds:
            return math.nan
        metric = self.manifest.primary_metric
        return self.state.best.geomeans[metric] / self.state.rounds[0].measurements[0].geomeans[metric]

    def _tips(self) -> list[Tip]:
        return load_tips(self.root, self.manifest.op, self.state.device, self.manifest.resolved_variant)

    def _protected(self) -> dict[str, str]:
        """Files outside git's view in the checkout that a candidate must not touch, with the text the runner
        wrote (an external target's campaign dir is outside its checkout: none)."""
        manifest = self.run_dir / "manifest.yaml"
        if not manifest.is_relative_to(self.checkout):
            return {}
        return {self.shown_path(manifest): manifest_text(self.manifest)}

    def at_best(self) -> None:
        """The tree exactly at the best commit on the campaign branch, and the campaign's own files as written."""
        self.lineage.restore_exactly(self.state.branch, self.state.best_commit)
        for path, text in self._protected().items():
            if not (self.checkout / path).exists() or (self.checkout / path).read_text() != text:
                atomic_write_text(self.checkout / path, text)

    def at_candidate(self, number: int) -> None:
        """The best commit plus round `number`'s candidate.diff."""
        self.at_best()
        self.lineage.apply(self.round_dir(number) / "candidate.diff")

    def _analyses(self, csv: Path | None = None) -> list[ShapeAnalysis]:
        """The representative shapes on the roofline, from a measurement (default: the best's); none for an
        external target, whose FLOPs and bytes turbo-opt does not know."""
        assert self.state.best is not None
        if self.spec is None:
            return []
        csv = csv or self.run_dir / self.state.best.csv
        reps = self.manifest.representative_shapes
        return analyze(self.spec, [s for s in self.shapes() if s.label in reps], read_summary(csv),
                       read_meta(csv).dtype, self.manifest.resolved_variant, self.state.ceilings)

    def _stop_conditions(self) -> list[Termination]:
        assert self.state.best is not None
        metric = self.manifest.primary_metric
        vendor = primary_vendor(self.run_dir, metric)
        vs_vendor = math.nan
        if vendor is not None:
            vs_vendor = geomean(v / vendor.per_shape[label] for label, v in self.state.best.per_shape.items()
                                if vendor.per_shape.get(label, math.nan) > 0)
        m = self.manifest
        progress = Progress(rounds_done=self.state.round - 2, elapsed_s=self.state.elapsed_s, speedup=self.speedup(),
                            best=self.state.best.geomeans, vs_vendor=vs_vendor,
                            efficiency=efficiency_geomean(self._analyses()),
                            stop_requested=(self.run_dir / "STOP").exists())
        return stop_conditions(progress, max_iterations=m.max_iterations, max_duration_min=m.max_duration_min,
                               target_speedup=m.target_speedup, target=m.target, target_vs_vendor=m.target_vs_vendor,
                               hardware_efficiency=m.hardware_efficiency)

    # --- the loop ---------------------------------------------------------------------------------

    def run(self) -> CampaignState:
        """Step until the campaign is done or waits for a candidate (the `manual` proposer)."""
        with self.locked():
            while self.state.phase not in ("DONE", "AWAITING_CANDIDATE"):
                phase = self.state.phase
                record = self.state.current if phase in ROUND_PHASES else None
                started = time.monotonic()
                self.steps[phase]()
                elapsed = time.monotonic() - started
                self.state.elapsed_s += elapsed
                if record is not None:
                    record.elapsed_s += elapsed
                self.save()
        return self.state

    def submit(self, proposal: Proposal) -> RoundRecord:
        """The candidate in the working tree, as `turbo-opt submit` hands it in: judged, and the next round's
        request written. Returns the judged round."""
        with self.locked():
            if self.state.phase != "AWAITING_CANDIDATE":
                raise UserError(f"campaign {self.manifest.name} is not waiting for a candidate "
                                f"(phase {self.state.phase}, round {self.state.round})")
            number = self.state.round
            self._capture(proposal, "manual")
            self.save()
            self.run()
        return next(r for r in self.state.rounds if r.number == number)

    def finish(self, discard: bool = False) -> CampaignState:
        """Stop waiting for candidates and write the report (`turbo-opt finish`)."""
        with self.locked():
            if self.state.phase != "AWAITING_CANDIDATE":
                raise UserError(f"campaign {self.manifest.name} is not waiting for a candidate "
                                f"(phase {self.state.phase}): `turbo-opt stop` stops a running one")
            dirty = self.lineage.dirty_paths()
            if dirty and not discard:
                raise UserError(f"the working tree has changes ({', '.join(dirty[:3])}): submit them, or finish "
                                "with --discard to drop them")
            self.state.rounds.pop()  # the round nobody proposed for
            self.state.stop_reason = "finished by the user"
            self.state.phase = "REPORT"
            self.save()
            return self.run()

    def _define_target(self) -> None:
        init_logs(self.run_dir, self.manifest)
        m = self.manifest
        self.say(f"target: {m.op} ({m.resolved_variant}), {m.primary_metric} metric, proposer {m.proposer.kind}, "
                 f"{m.max_iterations} rounds at most")
        self.state.phase = "PREPARE_ENVIRONMENT"

    def _prepare_environment(self) -> None:
        m = self.manifest
        if m.in_workspace and not self.checkout.exists():
            repo = Lineage(m.repo)
            repo.add_worktree(self.checkout, repo.head())
        if not self.state.start_commit:
            self.lineage.ensure_clean()
            self.state.start_commit = self.lineage.head()
            self.state.start_branch = Lineage(m.repo).branch() if m.repo else self.lineage.branch()
        if not self.state.branch:
            self.state.branch = self._branch_name()
        self.lineage.checkout_branch(self.state.branch, self.state.start_commit)
        self.state.best_commit = self.state.best_commit or self.state.start_commit
        self.state.harness_hash = harness_hash(self.root / "harness")
        device = default_device()
        self.state.device = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)"
        self.state.ceilings = device_ceilings(device)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the benchmarks run in subprocesses: leave them the memory
        if interpreter_mode():
            self.say("[yellow]CPU interpreter: timings prove the loop, never performance[/]")
        self.say(f"branch {self.state.branch}, device {self.state.device}, ceilings {self.state.ceilings or 'n/a'}")
        self.state.phase = "BASELINE"

    def _branch_name(self) -> str:
        """The campaign branch: optimize/<campaign> ("auto"), the branch checked out at the start ("none"), or
        the one the manifest names."""
        if self.manifest.branch == "auto" or (self.manifest.branch == "none" and not self.manifest.git_commit):
            return f"optimize/{self.manifest.name}"  # with git_commit false, a working branch REPORT takes away
        if self.manifest.branch == "none":
            if self.state.start_branch is None:
                raise UserError("branch none works on the branch checked out at the start, but HEAD is detached")
            return self.state.start_branch
        return self.manifest.branch

    def _baseline(self) -> None:
        rd = self.round_dir(1)
        shapes = self.shapes()
        if shapes:
            write_shape_file(self.run_dir / "shapes.yaml", shapes)
        csv = rd / "artifacts" / "benchmark.csv"
        failure = self.focused_test(rd / "artifacts" / "test.log")
        if failure is not None:
            raise UserError(f"the baseline fails its {failure}: a campaign starts from a correct kernel")
        summary = self._bench(
            BenchRequest(self.run_dir / "shapes.yaml", csv, rd / "artifacts" / "bench.log", compare_baselines=True,
                         probe_seed=probe_seed()),
            f"the baseline on {len(shapes)} shapes" if shapes else "the baseline on its benchmark's shapes",
        )
        failed = [label for label, check in summary.checks().items() if check == FAIL]
        probes = read_meta(csv).probe_errors
        if failed or probes or summary.unlabeled_failures:
            unlabeled = ["unlabeled ('?') rows"] if summary.unlabeled_failures else []
            shown = ", ".join([*failed[:3], *list(probes)[:3], *unlabeled])
            raise UserError(f"the baseline fails ({shown}): a campaign starts from a correct kernel; see {csv}")
        if not shapes:
            dims = summary.frame.set_index("label")[list(summary.schema.dims)].to_dict("index")
            shapes = shapes_of(summary.labels, dims)
            write_shape_file(self.run_dir / "shapes.yaml", shapes)
        if self.manifest.external and self.manifest.csv_schema is None:  # freeze the header the baseline wrote
            self._amend_manifest(csv_schema=SchemaDeclaration.of(summary.schema))
        self._forward_only(summary)
        flops = dict(zip(summary.labels, summary.metric("forward") * summary.frame.set_index("label")[
            summary.schema.fwd_ms] * 1e9, strict=True))
        reps = self.manifest.representative_shapes or pick_representative(shapes, flops)
        self._amend_manifest(representative_shapes=reps)
        write_manifest(self.manifest, self.run_dir / "manifest.yaml")
        write_shape_file(self.run_dir / "representative.yaml", [s for s in shapes if s.label in reps])
        metric = self.manifest.primary_metric
        fresh_ms = read_meta(csv).fresh_ms
        self.state.baseline = score(summary, metric, self.rel(csv), None, fresh_ms)
        self.state.best = score(summary, metric, self.rel(csv), reps, fresh_ms)
        atomic_write_text(rd / "candidate.diff", "")  # the baseline changes nothing
        # Round 1 records the representative shapes, like every later round: the trend compares like with like.
        record = RoundRecord(number=1, status="ACCEPT", reason=f"baseline: {len(shapes)} shapes, every one PASS",
                             measurements=[self.state.best], commit=self.state.start_commit)
        self.state.rounds = [record]
        close_round(self.run_dir, self.state, record, None, {}, "", "round 2")
        self.say(f"baseline {metric} geomean {self.state.baseline.geomeans[metric]:.4g}; representative: {reps}")
        self.state.round = 2
        self.state.phase = "ANALYZE"

    def _amend_manifest(self, **update: object) -> None:
        """What BASELINE learned, into the campaign's authoritative manifest (state.json's)."""
        self.manifest = self.manifest.model_copy(update=update)
        self.state.manifest = self.manifest

    def _forward_only(self, summary: Summary) -> None:
        """A kernel with no backward (no backward time in any row) is scored on its forward, with a note."""
        m = self.manifest
        if m.primary_metric == "forward" or summary.frame[summary.schema.bwd_ms].notna().any():
            return
        note = (f"{m.op} has no backward (the baseline times none): scored on the forward, not the "
                f"{m.primary_metric} the manifest asked for")
        self._amend_manifest(primary_metric="forward")
        self.state.notes.append(note)
        self.say(f"[yellow]{note}[/]")

    def _analyze(self) -> None:
        reason = stop_reason(self._stop_conditions())
        if reason is not None:
            self.state.stop_reason = reason
            self.say(f"stop: {reason}")
            self.state.phase = "REPORT"
            return
        changing_course = stagnated(self.state.consecutive_rollbacks, self.rules)
        if changing_course:  # validate the next round on every shape, and tell the proposer to change course
            self.state.consecutive_rollbacks = 0
        self.state.rounds.append(RoundRecord(number=self.state.round, analysis=describe(self._analyses()),
                                             full_validation=changing_course, after_stagnation=changing_course))
        self.state.phase = "OPTIMIZE"

    def _request(self, record: RoundRecord) -> Request:
        """Write the round's request.json and request.md: what the proposer (and anyone else) needs."""
        assert self.state.best is not None
        rd, m = self.round_dir(record.number), self.manifest
        representative = self.shown_path(self.run_dir / "representative.yaml")
        if self.spec is None:
            description = f"an external kernel in {m.repo}: {', '.join(m.files)}"
            knowledge = general_knowledge(self.root, self.state.device, [m.backend])
            check = check_command(m, self.checkout, BenchRequest(
                self.run_dir / "representative.yaml", rd / "check.csv", rd / "check.log", scope="representative"))
        else:
            description = self.spec.description
            knowledge = applicable(self.root, m.op, self.state.device)  # the op's backends (Gluon too)
            check = (f"turbo-opt bench --op {m.op} --variant {m.resolved_variant} --shapes {representative} "
                     "--fresh-inputs --probe-seed 1")
        if m.test_command:
            check += f" && {m.test_command}"
        request = build_request(
            self.state, record, op_description=description, proposer=self.proposer.name,
            unit=read_summary(self.run_dir / self.state.best.csv).schema.metric,
            stop=self._stop_conditions(), standing=standings(self.run_dir, self.state, m.primary_metric),
            analyses=self._analyses(), rules=self.rules, knowledge=knowledge, tips=self._tips(),
            representative_file=representative, proposal_file=self.shown_path(rd / "proposal.json"),
            check_command=check, home=str(self.root) if m.external else None,
        )
        atomic_write_text(rd / "request.json", request.model_dump_json(indent=2) + "\n")
        atomic_write_text(rd / "request.md", render(request))
        return request

    def _optimize(self) -> None:
        record = self.state.current
        rd = self.round_dir(record.number)
        rd.mkdir(parents=True, exist_ok=True)
        self.at_best()
        record.handed_at, record.stash_at = self.state.best_commit, self.lineage.stash()
        self._request(record)
        context = RoundContext(
            campaign=self.manifest.name, number=record.number, root=self.checkout, round_dir=rd, manifest=self.manifest,
            shapes=tuple(self.shapes()), analyses=tuple(self._analyses()), history=tuple(self.state.closed_rounds()),
            tips=tuple(self._tips()), after_stagnation=record.after_stagnation, request_md=rd / "request.md",
            request_json=rd / "request.json", children=self.children, scratch=self.state.proposer_state,
            home=self.root,
        )
        outcome = self.proposer.propose(context)
        if isinstance(outcome, Proposed):
            self._capture(outcome.proposal, self.proposer.name)
        elif isinstance(outcome, Awaiting):
            self.state.phase = "AWAITING_CANDIDATE"
            self.say(f"awaiting a candidate: {self.repo_path(rd / 'request.md')}")
        elif isinstance(outcome, Exhausted):
            self.state.rounds.pop()
            self.state.stop_reason = outcome.reason
            self.say(f"stop: {outcome.reason}")
            self.state.phase = "REPORT"
        elif isinstance(outcome, Failed):
            atomic_write_text(rd / "candidate.diff", self.lineage.diff_from(self.state.best_commit) + "\n")
            self.at_best()
            record.status, record.reason = "ERROR", outcome.reason
            self.state.phase = "DECIDE"

    def _capture(self, proposal: Proposal, proposer: str) -> None:
        """Record the candidate the working tree holds (read-only: nothing is lost if killed here)."""
        record = self.state.current
        record.candidate = capture(self.lineage, proposal, proposer, branch=self.state.branch,
                                   best=self.state.best_commit, stash=record.stash_at,
                                   diff_path=self.round_dir(record.number) / "candidate.diff",
                                   protected=self._protected())
        self.say(f"candidate: {proposal.summary}: {proposal.hypothesis}")
        self.state.phase = "SCREEN"

    def _screen(self) -> None:
        record = self.state.current
        assert record.candidate is not None
        self.at_best()
        verdict = screen(self.lineage, record.candidate, self.manifest.files, self.round_dir(record.number)
                         / "candidate.diff", own_packages(self.checkout, self.manifest.files))
        if verdict is not None:
            record.status, record.reason = verdict.status, verdict.reason
            self.at_best()
            self.state.phase = "DECIDE"
            return
        record.full_validation = record.full_validation or record.candidate.risk == "high"
        self.state.phase = "VALIDATE"

    def _validate(self) -> None:
        record = self.state.current
        found = validate(record, self.run_dir, self.manifest, self._bench, self)
        if found.candidate is not None:
            record.measurements.append(found.candidate)
        if found.reference is not None:
            record.references.append(found.reference)
        if found.status is not None:
            record.status, record.reason = found.status, found.reason
        self.state.phase = "DECIDE"

    def _decide(self) -> None:
        record = self.state.current
        best_before = self.state.best
        assert best_before is not None and self.state.baseline is not None
        metric = self.manifest.primary_metric
        if record.status == "OPEN":
            analyses = self._analyses(self.run_dir / record.measurements[-1].csv) if self.state.ceilings else None
            since = [m for r in self.state.closed_rounds() if r.number > self.state.best_round for m in r.references]
            verdict = judge(record, recorded_best(best_before, since), self.state.baseline, self.run_dir,
                            self.manifest, self.rules, analyses)
            if verdict.verdict == "REMEASURE":
                self.say(f"DECIDE: {verdict.reason}: re-measuring")
                self.state.phase = "VALIDATE"
                return
            record.status = "ACCEPT" if verdict.verdict == "ACCEPT" else "ROLLBACK"
            record.reason = verdict.reason
            record.gain_pct = verdict.gain_pct if math.isfinite(verdict.gain_pct) else None
            record.fresh_gain_pct = verdict.fresh_gain_pct if math.isfinite(verdict.fresh_gain_pct) else None
            record.spread_pct = verdict.spread_pct if math.isfinite(verdict.spread_pct) else None
        ratios = (attribution(self.run_dir / record.measurements[-1].csv, self.run_dir / record.references[-1].csv)
                  if record.measurements and record.references else {})
        if record.status == "ACCEPT":
            self._accept(record, ratios)
        else:
            self.at_best()
            self.state.consecutive_rollbacks += 1
        next_step = next_direction(record, standings(self.run_dir, self.state, metric))
        close_round(self.run_dir, self.state, record, best_before, ratios, next_step,
                    f"round {record.number + 1} next, unless a stop condition is met")
        self.say(f"DECIDE: [{'green' if record.status == 'ACCEPT' else 'red'}]{record.status}[/] {record.reason}")
        self.state.round += 1
        self.state.phase = "ANALYZE"

    def _accept(self, record: RoundRecord, ratios: dict[str, dict[str, float]]) -> None:
        subject = f"[optimize] {self.manifest.op} {self.manifest.backend} round-{record.number}:"
        if self.lineage.head_message().startswith(subject):  # committed before a kill: do not commit twice
            record.commit = self.lineage.head()
        else:
            assert record.candidate is not None
            self.at_candidate(record.number)  # the tree may hold the best, re-measured next to the candidate
            message = (f"{subject} {record.summary}\n\nHypothesis: {record.candidate.hypothesis}\n"
                       f"Result: {record.reason}\nDetails: {attribution_details(ratios)}; proposer "
                       f"{record.candidate.proposer}, {len(record.measurements)} measurement(s)\n")
            record.commit = self.lineage.commit(self.manifest.files, message)
        metric = self.manifest.primary_metric
        ranked = sorted(record.measurements, key=lambda m: m.geomeans[metric])
        self.state.best = ranked[(len(ranked) - 1) // 2]  # the median (lower) measurement, not the luckiest
        self.state.best_commit = record.commit
        self.state.best_round = record.number
        self.state.consecutive_rollbacks = 0

    def _report(self) -> None:
        if not self.state.handed_back:  # a report resumed after the hand-back only writes the report again
            self._final_measurements()
            self._hand_back()
        metric = self.manifest.primary_metric
        vendor_values = {v.name: v.per_shape for v in vendors(self.run_dir, metric)}
        next_steps = [*self.proposer.next_steps(self.state), f"`turbo-opt learn {self.manifest.name}` adds this "
                      "campaign's tips and findings to knowledge/ for the next one."]
        write_report(self.run_dir, self.state, vendor_values, self._stop_conditions(), next_steps)
        self.say(f"REPORT: {self.run_dir / 'report.md'}")
        self.state.phase = "DONE"

    def _final_measurements(self) -> None:
        """The best on every shape, its focused test, and whether the accepted gains reproduce."""
        self.at_best()
        metric, reps = self.manifest.primary_metric, self.manifest.representative_shapes
        final_dir = self.run_dir / "final"
        csv = final_dir / "benchmark.csv"
        summary = self._bench(BenchRequest(self.run_dir / "shapes.yaml", csv, final_dir / "bench.log"),
                              "the best on every shape")
        fresh_ms = read_meta(csv).fresh_ms
        self.state.final = score(summary, metric, self.rel(csv), None, fresh_ms)
        self.state.final_representative = score(summary, metric, self.rel(csv), reps, fresh_ms)
        failure = self.focused_test(final_dir / "test.log")
        if failure is not None:
            self.state.notes.append(f"the best commit fails in the final check: {failure}")
        self._check_reproduction(final_dir)
        write_tips(self.run_dir / "tips.yaml", campaign_tips(self.state))

    def _hand_back(self) -> None:
        """Leave the target as the manifest asked: with `git_commit: false`, the user's branch checked out again
        with the best files uncommitted (the campaign's commits kept under refs/turbo-opt/); in workspace
        mode, the best files synced into the target's checkout and the worktree removed. Saved at once: a
        kill after this does not do it twice."""
        m = self.manifest
        best_files = {path: self.lineage.show(self.state.best_commit, path) for path in m.files}
        changed = [p for p in m.files if best_files[p] != self.lineage.show(self.state.start_commit, p)]
        repo = Lineage(m.repo) if m.repo is not None else self.lineage
        rounds = f"branch {self.state.branch}"
        if m.in_workspace:
            repo.remove_worktree(self.checkout)
        if not m.git_commit:
            rounds = f"refs/turbo-opt/{m.name}"
            if not m.in_workspace:
                repo.switch(self.state.start_branch or self.state.start_commit)
            repo.keep_as_ref(self.state.branch, rounds)
            self.state.notes.append(f"git_commit false: the campaign's commits are kept under {rounds}, not on a "
                                    "branch")
        if m.in_workspace:
            self.state.notes.append(self._sync_back(repo, best_files, changed, rounds))
        elif not m.git_commit and changed:
            for path in changed:
                atomic_write_text(self.lineage.root / path, best_files[path])
            self.state.notes.append(f"the best version of {', '.join(changed)} is left uncommitted in "
                                    f"{self.lineage.root}")
        self.state.handed_back = True
        self.save()

    def _sync_back(self, repo: Lineage, best_files: dict[str, str], changed: list[str], rounds: str) -> str:
        """Write the best files into the target's own checkout, unless someone changed them there meanwhile;
        `rounds` says where the campaign's commits are (a branch, or a ref with git_commit false)."""
        if not changed:
            return f"workspace mode: no file of the best differs from the start; {repo.root} is as it was"
        edited = [p for p in changed if (repo.root / p).read_text() != repo.show(self.state.start_commit, p)]
        if edited:
            return (f"workspace mode: NOT synced back: {', '.join(edited)} changed in {repo.root} during the "
                    f"campaign; the best is commit {self.state.best_commit[:10]} on {rounds}")
        for path in changed:
            atomic_write_text(repo.root / path, best_files[path])
        return (f"workspace mode: the best version of {', '.join(changed)} synced into {repo.root} (uncommitted; "
                f"the rounds are on {rounds})")

    def _check_reproduction(self, final_dir: Path) -> None:
        """Do the accepted gains hold in a final bench of the best next to the start commit (paired, so a
        machine that drifted since the baseline cannot fake or hide them)? The claim is the accepted rounds'
        paired gains compounded: the basis every decision was made on."""
        assert self.state.final_representative is not None
        accepted = [r.gain_pct for r in self.state.optimization_rounds() if r.status == "ACCEPT" and r.gain_pct]
        if not accepted:
            self.state.reproduced, self.state.reproduction = reproduction(accepted, 0.0, self.rules)
            return
        csv = final_dir / "start.csv"
        self.lineage.restore(self.state.start_commit, self.manifest.files)
        try:
            start = self._bench(BenchRequest(self.run_dir / "representative.yaml", csv, final_dir / "start.log",
                                             scope="representative"), "the start commit next to the best")
        finally:
            self.at_best()
        metric = self.manifest.primary_metric
        start_score = score(start, metric, self.rel(csv), self.manifest.representative_shapes)
        measured = 100.0 * (self.state.final_representative.geomeans[metric] / start_score.geomeans[metric] - 1.0)
        self.state.reproduced, self.state.reproduction = reproduction(accepted, measured, self.rules)
