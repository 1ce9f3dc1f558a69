"""Search algorithms over one typed config space (agent/config_space.py), each a small class picked
by name (the manifest's `proposer: {kind: search, algorithm: <name>}`), as Helion's autotuner picks
its search by name:

- `pattern`: the one-knob walk, in trials: every one-step neighbour of the current config measured
  together, the best taken while it beats the current one, until none does or the budget is spent.
- `random`: uniformly drawn valid configs, measured in one batch.
- `lhs`: Latin-hypercube samples (each knob's range covered evenly), measured in one batch.
- `halving`: successive halving: Latin-hypercube samples measured cheaply, the better half (1/eta)
  kept and measured again `eta` times as carefully, until one is left.

An algorithm only proposes configs and reads their scores: `Measure` (configs, fidelity) -> one
score each, higher is better, NaN for a config that failed. The starting config is measured in
every batch next to the others, so that the winner's margin is measured under the same conditions.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from agent.config_space import Config, ConfigSpace

# (configs, fidelity: how many times as carefully as the cheapest trial) -> a score per config
Measure = Callable[[Sequence[Config], int], list[float]]


@dataclass(frozen=True)
class Trial:
    config: Config
    score: float
    fidelity: int


@dataclass
class SearchResult:
    """The best config found and the starting config's score next to it (same batch, same fidelity)."""

    best: Config
    best_score: float
    base_score: float
    trials: list[Trial] = field(default_factory=list)

    @property
    def gain_pct(self) -> float:
        return 100.0 * (self.best_score / self.base_score - 1.0) if self.base_score > 0 else math.nan


def _key(cfg: Config) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(cfg.items()))


def _better(score: float, than: float) -> bool:
    return math.isfinite(score) and (not math.isfinite(than) or score > than)


class SearchAlgorithm(ABC):
    name: ClassVar[str]

    def __init__(self, space: ConfigSpace, budget: int = 24, seed: int = 0) -> None:
        self.space, self.budget, self.rng = space, budget, random.Random(seed)

    @abstractmethod
    def search(self, base: Config, measure: Measure) -> SearchResult: ...

    def _batch(self, base: Config, configs: Sequence[Config], measure: Measure, fidelity: int,
               result: SearchResult | None) -> tuple[list[float], SearchResult]:
        """Measure the base and `configs` together; the result's best is updated from this batch."""
        scores = measure([base, *configs], fidelity)
        if len(scores) != len(configs) + 1:
            raise ValueError(f"the measure returned {len(scores)} scores for {len(configs) + 1} configs")
        result = result or SearchResult(base, scores[0], scores[0])
        result.base_score = scores[0]
        result.trials += [Trial(c, s, fidelity) for c, s in zip([base, *configs], scores, strict=True)]
        return scores[1:], result


class PatternSearch(SearchAlgorithm):
    name = "pattern"

    def search(self, base: Config, measure: Measure) -> SearchResult:
        current, result = base, None
        seen = {_key(base)}
        spent = 0
        while spent < self.budget:
            moves = [c for c in self.space.neighbours(current) if _key(c) not in seen][: self.budget - spent]
            if not moves:
                break
            seen |= {_key(c) for c in moves}
            spent += len(moves)
            scores, result = self._batch(current, moves, measure, 1, result)
            current_score = result.base_score
            best = max(range(len(moves)), key=lambda i: scores[i] if math.isfinite(scores[i]) else -math.inf)
            if not _better(scores[best], current_score):
                break
            current = moves[best]
            result.best, result.best_score = current, scores[best]
        if result is None:
            return SearchResult(base, math.nan, math.nan)
        # base_score was the last walk step's start: the winner's margin is over its own predecessor, and
        # it is over the starting config that a round's change is measured against.
        return _against_base(result, base, measure)


def _against_base(result: SearchResult, base: Config, measure: Measure) -> SearchResult:
    """Measure the winner next to the starting config, so that the margin is the winner's over it."""
    if _key(result.best) == _key(base):
        return result
    base_score, best_score = measure([base, result.best], 1)
    result.trials += [Trial(base, base_score, 1), Trial(result.best, best_score, 1)]
    result.base_score, result.best_score = base_score, best_score
    return result


class _Sampling(SearchAlgorithm):
    """Draw `budget` distinct configs (never the base), measure them with the base in one batch."""

    @abstractmethod
    def sample(self, base: Config, n: int) -> list[Config]: ...

    def distinct(self, base: Config, n: int) -> list[Config]:
        """`n` distinct configs other than the base: the samples, topped up with random draws for duplicates."""
        out, seen = [], {_key(base)}
        extra = (self.space.random(base, self.rng) for _ in range(20 * n))
        for cfg in [*self.sample(base, n), *extra]:
            if len(out) == n:
                break
            if cfg is not None and _key(cfg) not in seen:
                seen.add(_key(cfg))
                out.append(cfg)
        return out

    def search(self, base: Config, measure: Measure) -> SearchResult:
        configs = self.distinct(base, self.budget)
        scores, result = self._batch(base, configs, measure, 1, None)
        for cfg, score in zip(configs, scores, strict=True):
            if _better(score, result.best_score):
                result.best, result.best_score = cfg, score
        return result


class RandomSearch(_Sampling):
    name = "random"

    def sample(self, base: Config, n: int) -> list[Config]:
        drawn = (self.space.random(base, self.rng) for _ in range(n))
        return [c for c in drawn if c is not None]


class LatinHypercubeSearch(_Sampling):
    name = "lhs"

    def sample(self, base: Config, n: int) -> list[Config]:
        return self.space.latin_hypercube(base, n, self.rng)


class SuccessiveHalving(LatinHypercubeSearch):
    """Rungs of `eta`-fold rising fidelity; each keeps the best 1/eta of the last (the base is measured
    in every rung, so the final comparison is at the highest fidelity)."""

    name = "halving"
    eta = 2

    def search(self, base: Config, measure: Measure) -> SearchResult:
        alive = self.distinct(base, self.budget)
        fidelity, result = 1, None
        while alive:
            scores, result = self._batch(base, alive, measure, fidelity, result)
            ranked = sorted((i for i in range(len(alive)) if math.isfinite(scores[i])), key=lambda i: -scores[i])
            if len(alive) == 1 or not ranked:
                if ranked and _better(scores[0], result.base_score):
                    result.best, result.best_score = alive[0], scores[0]
                else:
                    result.best, result.best_score = base, result.base_score
                break
            alive = [alive[i] for i in ranked[: max(1, len(alive) // self.eta)]]
            fidelity *= self.eta
        assert result is not None
        return result


SEARCH_ALGORITHMS: dict[str, type[SearchAlgorithm]] = {
    cls.name: cls for cls in (PatternSearch, RandomSearch, LatinHypercubeSearch, SuccessiveHalving)
}


def make_search(name: str, space: ConfigSpace, budget: int = 24, seed: int = 0) -> SearchAlgorithm:
    try:
        return SEARCH_ALGORITHMS[name](space, budget, seed)
    except KeyError:
        raise ValueError(f"unknown search algorithm '{name}' (known: {', '.join(SEARCH_ALGORITHMS)})") from None
