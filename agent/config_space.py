"""One typed config space per op: the knobs its tuning.py declares (TUNABLE_SPACE), their allowed
values in order, and the op's `fits` (what the GPU can run). Every search algorithm
(agent/search_algorithms.py) draws and moves configs through this, and nothing else.

A config is a plain {knob: value} dict, as a TUNED_TABLE bucket holds it; knobs the space does not
declare (attention's HEAD_DIM) ride along unchanged from the config a search starts from, and a
declared knob that a bucket does not hold is not that bucket's (attention's DQ_ATOMIC lives in its
dK/dV buckets only): never added to it, never moved.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agent.tuning_table import read_tuning, tuning_file, tuning_module

if TYPE_CHECKING:
    from agent.manifest import Manifest

Config = dict[str, int]


def _anything_fits(cfg: Mapping[str, int]) -> bool:
    return True


@dataclass(frozen=True)
class ConfigSpace:
    # knob -> allowed values, in the order tuning.py lists them (neighbours are adjacent values)
    knobs: dict[str, tuple[int, ...]]
    fits: Callable[[Mapping[str, int]], bool] = field(default=_anything_fits, compare=False)

    def valid(self, cfg: Mapping[str, int]) -> bool:
        return all(cfg[knob] in values for knob, values in self.knobs.items() if knob in cfg) and self.fits(cfg)

    def neighbours(self, cfg: Config) -> list[Config]:
        """Every valid config one step away on one knob (the pattern search's moves)."""
        out = []
        for knob, values in self.knobs.items():
            if cfg.get(knob) not in values:
                continue
            i = values.index(cfg[knob])
            out += [cfg | {knob: values[j]} for j in (i - 1, i + 1) if 0 <= j < len(values)]
        return [c for c in out if self.fits(c)]

    def random(self, base: Config, rng: random.Random, tries: int = 100) -> Config | None:
        """A uniformly drawn valid config (None if `tries` draws all failed `fits`)."""
        for _ in range(tries):
            cfg = base | {knob: rng.choice(values) for knob, values in self.knobs.items() if knob in base}
            if self.fits(cfg):
                return cfg
        return None

    def latin_hypercube(self, base: Config, n: int, rng: random.Random) -> list[Config]:
        """`n` configs whose values of each knob are spread evenly over its range (one stratum of n per
        config, shuffled per knob); one that does not fit is replaced by a random valid one."""
        columns = {}
        for knob, values in self.knobs.items():
            strata = list(range(n))
            rng.shuffle(strata)
            columns[knob] = [values[min(len(values) - 1, int((s + rng.random()) / n * len(values)))] for s in strata]
        out = []
        for i in range(n):
            cfg = base | {knob: column[i] for knob, column in columns.items() if knob in base}
            replacement = cfg if self.fits(cfg) else self.random(base, rng)
            if replacement is not None:
                out.append(replacement)
        return out


def load_space(root: Path, manifest: Manifest) -> ConfigSpace:
    """The op's space as the campaign's tree declares it (read without importing) and the op's `fits`."""
    space, _ = read_tuning(root / tuning_file(manifest))
    module = tuning_module(root, manifest)
    return ConfigSpace({knob: tuple(values) for knob, values in space.items()}, getattr(module, "fits", _anything_fits))
