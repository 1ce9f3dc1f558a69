"""Trials fanned out over every visible GPU: one worker process per GPU (`python -m agent.trials`
with CUDA_VISIBLE_DEVICES set to its GPU), each with a share of a batch's configs. One GPU, or
none (the CPU interpreter): one worker. A worker serves every batch of the pool (a search's), and
the pool ends them when it is closed (it is a context manager).

A batch's first config is the one the others are compared with (the search algorithms measure the
config they start from first in every batch). Each worker measures it next to its own share, and
reports its share's scores over it: GPUs of one machine differ by a few percent, so a score is only
ever compared with one taken on the same GPU. The first config scores 1.0. A batch of few configs
at a high fidelity (successive halving's last rungs) is measured by every worker at a part of the
fidelity instead, each config's score the geomean of its ratios on the GPUs (`shares`).

A worker that hangs past its time limit or dies costs the configs it had not finished a NaN (an
ERROR in the search's eyes), never the campaign; its whole process group is killed
(agent/processes.py), so nothing it started outlives it, and the next batch starts it afresh.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

import torch

from agent.config_space import Config
from agent.processes import ChildDied, ChildRegistry, ServingChild, TimeLimit
from agent.search_algorithms import Measure
from agent.trials import DONE, TrialJob, TrialScores
from harness.files import REPO_ROOT, atomic_write_text
from harness.shapes import Shape
from harness.stats import geomean


def visible_gpus() -> list[str | None]:
    """One entry per worker: the CUDA device each runs on (as CUDA_VISIBLE_DEVICES names it, if the runner
    was given a subset), or [None] (one worker) without CUDA."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    named = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return (named[:count] if len(named) >= count else [str(i) for i in range(count)]) or [None]


# A config's cost in a batch besides its timed calls (its check, its warm-up, loading it from the compiler's
# cache), in units of one fidelity's timed calls: on an H200 about one (a config at fidelity 2 took 0.47 s,
# one at 16 took 3 s).
CONFIG_OVERHEAD = 1.0


@dataclass(frozen=True)
class Share:
    """What one worker measures of a batch: the reference (index 0, always), the configs at `indices`, each at
    `fidelity` (a fraction of the batch's where the batch's repeats are split over the workers)."""

    indices: list[int]
    fidelity: float


def shares(n_configs: int, workers: int, fidelity: int = 1) -> list[Share]:
    """The batch over the workers, whichever way ends sooner: configs 1..n-1 dealt round-robin, each at the
    batch's fidelity; or, for a batch of few configs at a high fidelity (halving's last rungs), every
    config on every worker with the fidelity split between them (a config's scores then combined)."""
    used = min(workers, max(1, n_configs - 1))
    dealt = [Share(list(range(w + 1, n_configs, used)), fidelity) for w in range(used)]
    if workers < 2 or fidelity < workers or n_configs < 2:
        return dealt
    dealt_cost = (1 + len(dealt[0].indices)) * (CONFIG_OVERHEAD + fidelity)
    split_cost = n_configs * (CONFIG_OVERHEAD + fidelity / workers)
    if split_cost >= dealt_cost:
        return dealt
    return [Share(list(range(1, n_configs)), fidelity / workers) for _ in range(workers)]


class TrialPool:
    """The search's `Measure`: (configs, fidelity) -> a score per config, relative to the first one.
    Use it in a `with` block: its workers live until the block ends."""

    def __init__(self, root: Path, job: TrialJob, work_dir: Path, registry: ChildRegistry, *,
                 workers: Sequence[str | None] | None = None, limit_s: float = 900.0,
                 command: Sequence[str] = (sys.executable, "-m", "agent.trials")) -> None:
        self.root, self.job, self.work_dir, self.registry = root, job, work_dir, registry
        self.gpus = list(workers) if workers is not None else visible_gpus()
        self.limit_s, self.command = limit_s, list(command)
        self.batches = 0
        # why each failed config failed, by its position in the last batch (also written next to its trials)
        self.errors: dict[int, str] = {}
        # each batch's wall time, seconds (its workers run side by side)
        self.batch_seconds: list[float] = []
        self._children: list[ServingChild | None] = [None] * len(self.gpus)
        self._logs = ExitStack()

    def __enter__(self) -> TrialPool:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """End every worker (and its process group)."""
        for child in self._children:
            if child is not None:
                child.close()
        self._children = [None] * len(self.gpus)
        self._logs.close()

    def __call__(self, configs: Sequence[Config], fidelity: int) -> list[float]:
        return self._batch(self.job, configs, fidelity)

    def on(self, shapes: Sequence[Shape]) -> Measure:
        """The same measure on some of the pool's shapes, by the same workers (theirs are made already)."""
        job = self.job.model_copy(update={"shapes": list(shapes)})
        return lambda configs, fidelity: self._batch(job, configs, fidelity)

    def _batch(self, job: TrialJob, configs: Sequence[Config], fidelity: int) -> list[float]:
        self.batches += 1
        self.errors = {}
        if self.batches == 1:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.work_dir / "pool.json", json.dumps(
                {"bucket": self.job.bucket, "shapes": [s.label for s in self.job.shapes], "gpus": self.gpus}) + "\n")
        dealt = shares(len(configs), len(self.gpus), fidelity)
        started = time.monotonic()
        for w in range(len(dealt)):
            self._child(w).start()  # here, not in the pool's threads, which end with the batch
        with ThreadPoolExecutor(len(dealt)) as pool:
            found = list(pool.map(lambda w: self._worker(w, job, [0, *dealt[w].indices], configs,
                                                         max(1, round(job.repeats * dealt[w].fidelity))),
                                  range(len(dealt))))
        self.batch_seconds.append(time.monotonic() - started)
        if self.errors:
            failed = {json.dumps(configs[i], sort_keys=True): e for i, e in sorted(self.errors.items())}
            atomic_write_text(self.work_dir / f"trials-{self.batches}.errors.json", json.dumps(failed, indent=1) + "\n")
        ratios: dict[int, list[float]] = {}
        for w, share in enumerate(dealt):
            ref = found[w][0]
            for i, raw in zip(share.indices, found[w][1:], strict=True):
                ratios.setdefault(i, []).append(raw / ref if ref > 0 and math.isfinite(ref) else math.nan)
        scores = [1.0 if any(math.isfinite(s[0]) and s[0] > 0 for s in found) else math.nan]
        # a config measured on several GPUs: the geomean of its ratios there; failed on any, it failed
        scores += [geomean(ratios[i]) if all(math.isfinite(r) and r > 0 for r in ratios[i]) else math.nan
                   for i in range(1, len(configs))]
        return scores

    def _child(self, w: int) -> ServingChild:
        """Worker `w`, made on first use: its GPU, and the campaign's tree first on its path (its kernels),
        then turbo-opt's own (the trial worker, the harness). Its log spans the pool's batches."""
        if self._children[w] is None:
            path = [str(self.root), str(REPO_ROOT), os.environ.get("PYTHONPATH")]
            env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, path))}
            if self.gpus[w] is not None:
                env["CUDA_VISIBLE_DEVICES"] = self.gpus[w]
            self.work_dir.mkdir(parents=True, exist_ok=True)
            log: IO[str] = self._logs.enter_context((self.work_dir / f"worker-{w}.log").open("a"))
            self._children[w] = ServingChild(self.command, cwd=self.root, env=env, log=log, registry=self.registry)
        return self._children[w]

    def _worker(self, w: int, job: TrialJob, indices: list[int], configs: Sequence[Config], repeats: int
                ) -> list[float]:
        """Run worker `w` on `indices` of the batch; a score per index (NaN where it failed or never got to)."""
        stem = self.work_dir / f"trials-{self.batches}-w{w}"
        stem.parent.mkdir(parents=True, exist_ok=True)
        job = job.model_copy(update={"configs": [configs[i] for i in indices], "repeats": repeats})
        job_path, out = stem.with_suffix(".job.json"), stem.with_suffix(".scores.json")
        job_path.write_text(job.model_dump_json())
        out.unlink(missing_ok=True)
        problem = None
        try:
            answer = self._child(w).request(f"{job_path} {out}", self.limit_s)
            problem = None if answer == DONE else f"worker {w} answered {answer[:80]!r}"
        except (TimeLimit, ChildDied) as exc:
            problem = f"worker {w} {exc}"
        done = TrialScores.model_validate_json(out.read_text()) if out.exists() else TrialScores()
        for i, error in zip(indices, done.errors, strict=False):
            if error:
                self.errors[i] = error
        missing = indices[len(done.scores):]
        for i in missing:
            self.errors[i] = problem or f"worker {w} gave no score"
        return [*done.scores, *[math.nan] * len(missing)]
