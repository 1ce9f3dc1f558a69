"""The search algorithms over one typed config space, with a fake measure: no GPU, no subprocess."""

import math
import random
from collections import Counter

import pytest

from agent.config_space import ConfigSpace
from agent.search_algorithms import SEARCH_ALGORITHMS, make_search
from kernels.grouped_gemm_fp8 import tuning as fp8_tuning

SPACE = ConfigSpace({k: tuple(v) for k, v in fp8_tuning.TUNABLE_SPACE.items()}, fp8_tuning.fits)
DETUNED = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 2}
BEST = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}


def speed(cfg) -> float:
    """A separable, unimodal objective with its peak at BEST: each knob step away costs 15% (over the knobs the
    config holds: the space's WS is some buckets' only)."""
    steps = sum(abs(SPACE.knobs[k].index(cfg[k]) - SPACE.knobs[k].index(BEST[k])) for k in SPACE.knobs if k in cfg)
    return 100.0 * 0.85**steps


class FakeMeasure:
    """`noise`: relative noise of a fidelity-1 measurement, shrinking with the square root of the fidelity."""

    def __init__(self, noise=0.0, broken=None, seed=0):
        self.noise, self.broken, self.rng, self.calls = noise, broken or (lambda cfg: False), random.Random(seed), []

    def __call__(self, configs, fidelity):
        self.calls.append((list(configs), fidelity))
        return [math.nan if self.broken(c) else speed(c) * (1 + self.rng.gauss(0, self.noise / math.sqrt(fidelity)))
                for c in configs]


@pytest.mark.parametrize("name", sorted(SEARCH_ALGORITHMS))
def test_every_algorithm_improves_a_detuned_config_with_valid_configs_only(name):
    measure = FakeMeasure()
    result = make_search(name, SPACE, budget=24, seed=1).search(DETUNED, measure)
    assert SPACE.valid(result.best) and speed(result.best) > 1.5 * speed(DETUNED)
    assert result.gain_pct == pytest.approx(100 * (speed(result.best) / speed(DETUNED) - 1))
    assert all(SPACE.valid(c) for configs, _ in measure.calls for c in configs)
    assert all(configs[0] == DETUNED or name == "pattern" for configs, _ in measure.calls)  # the base in every batch


def test_the_pattern_search_walks_one_knob_at_a_time_to_the_peak():
    measure = FakeMeasure()
    result = make_search("pattern", SPACE, budget=200).search(DETUNED, measure)
    assert result.best == BEST
    for configs, _ in measure.calls[:-1]:  # the last batch: the winner next to the start
        start = configs[0]
        assert all(sum(c[k] != start[k] for k in c) == 1 for c in configs[1:])


def test_latin_hypercube_samples_cover_each_knob_evenly():
    samples = SPACE.latin_hypercube(DETUNED, 24, random.Random(0))
    assert len(samples) == 24 and all(SPACE.valid(c) for c in samples)
    for knob in ("num_stages", "GROUP_M"):  # 4 values each: 6 samples apiece (up to `fits` replacements)
        counts = Counter(c[knob] for c in samples)
        assert set(counts) == set(SPACE.knobs[knob]) and max(counts.values()) - min(counts.values()) <= 4


def test_successive_halving_measures_the_survivors_ever_more_carefully():
    measure = FakeMeasure(noise=0.2, seed=3)
    result = make_search("halving", SPACE, budget=16, seed=2).search(DETUNED, measure)
    assert [(len(configs) - 1, fidelity) for configs, fidelity in measure.calls] == [(16, 1), (8, 2), (4, 4), (2, 8),
                                                                                       (1, 16)]
    assert result.trials[-1].fidelity == 16 and speed(result.best) > speed(DETUNED)


def test_a_config_that_fails_is_never_the_winner():
    broken = FakeMeasure(broken=lambda cfg: cfg["BLOCK_N"] == 256)
    for name in SEARCH_ALGORITHMS:
        result = make_search(name, SPACE, budget=24, seed=4).search(DETUNED, broken)
        assert result.best["BLOCK_N"] != 256 and math.isfinite(result.best_score)


def test_nothing_better_leaves_the_start():
    at_peak = make_search("lhs", SPACE, budget=12).search(BEST, FakeMeasure())
    assert at_peak.best == BEST and at_peak.gain_pct == 0.0


def test_an_unknown_algorithm_is_named():
    with pytest.raises(ValueError, match="unknown search algorithm 'annealing'"):
        make_search("annealing", SPACE)


def test_a_knob_a_bucket_does_not_hold_is_never_added_or_moved():
    """Attention's DQ_ATOMIC lives in its dK/dV buckets only: a forward bucket's configs never get it."""
    from kernels.attention import tuning as attention_tuning

    space = ConfigSpace({k: tuple(v) for k, v in attention_tuning.TUNABLE_SPACE.items()}, attention_tuning.fits)
    forward, dkdv = attention_tuning.TUNED_TABLE["fwd-d128"], attention_tuning.TUNED_TABLE["bwd_kv-d128"]
    rng = random.Random(0)
    drawn = [*space.neighbours(forward), *space.latin_hypercube(forward, 12, rng),
             *(space.random(forward, rng) for _ in range(12))]
    assert drawn and all("DQ_ATOMIC" not in c and space.valid(c) for c in drawn)
    assert any(c["DQ_ATOMIC"] == 1 for c in [*space.latin_hypercube(dkdv | {"BLOCK_M": 64}, 12, rng),
                                             *(space.random(dkdv, rng) for _ in range(24))])
