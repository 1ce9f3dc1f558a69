"""Timing: each call as a training loop pays it, L2 flushed before each (outside the timed region), median
and population stddev over the repeats; a CUDA-graph mode that replays a captured call; and a
wall-clock fallback for the CPU interpreter, whose numbers prove the plumbing, never performance.

A training loop's host runs ahead of its GPU: a call costs its GPU time while its host time (Python, the
launches) is shorter, and its host time once that is longer. So each call (cuda-events) is timed twice at
once: its kernels between CUDA events, launched while the GPU is still busy with a lead of its own (a spin
kernel, then the flush) so that they run back to back as the host queued them, and its host time on the
clock; the sample is the larger (`loop_ms`). Timing from an idle GPU instead (2026-11-23 to 11-27) added
the host time to every GPU-bound call: 60-200 us on a 1-2 ms attention call that a loop never waits for.
`time_each` times a sequence of different calls once each (fresh input sets) by the same method;
`time_interleaved` times several calls in rounds, each round in an order of its own, so that calls
compared with each other (ours and a baseline, a candidate and the best) see the same GPU state.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter  # bound at import: code timed later cannot swap time's clock
from typing import Literal, TypeVar

import torch

TimingMode = Literal["cuda-events", "cuda-graph", "interpreter-wallclock"]
TIMING_MODES: tuple[str, ...] = ("cuda-events", "cuda-graph", "interpreter-wallclock")
INTERPRETER_NOTE = "interpreter timings (Triton on the CPU): they prove the plumbing, never performance"
LOOP_NOTE = "each sample the larger of the call's GPU time (its kernels queued behind GPU work) and its host time"

# Defaults (repeats, warm-up calls) by mode: the interpreter is ~1e5x slower, so it gets a token count.
DEFAULT_COUNTS: dict[str, tuple[int, int]] = {
    "cuda-events": (50, 10),
    "cuda-graph": (50, 10),
    "interpreter-wallclock": (3, 1),
}


# The GPU's lead over the host at each timed call: twice the previous call's host time, at least 1 ms (the
# first call's lead, beyond the host time of every op we time from the warm GPU), at most 50 ms.
MIN_LEAD_S = 1e-3
MAX_LEAD_S = 50e-3
FALLBACK_CLOCK_KHZ = 2_000_000  # where the device does not report its clock


def timing_note(mode: str) -> str:
    """What a sidecar says of its timings, by mode."""
    return {"interpreter-wallclock": INTERPRETER_NOTE, "cuda-events": LOOP_NOTE}.get(mode, "")


def loop_ms(gpu_ms: float, host_ms: float) -> float:
    """What a call costs a training loop whose host runs ahead: its GPU time, or its host time where that is
    longer (the GPU then waits for the host)."""
    return max(gpu_ms, host_ms)


def lead_seconds(previous_host_s: float | None) -> float:
    """How far ahead of a call the GPU is kept busy: long enough that the call's launches are all queued
    before the GPU reaches them, so its events time the kernels alone."""
    if previous_host_s is None:
        return MIN_LEAD_S
    return min(MAX_LEAD_S, max(MIN_LEAD_S, 2 * previous_host_s))


@dataclass(frozen=True)
class Timing:
    median_ms: float
    stddev_ms: float
    samples: int
    # The share of the samples that the call's host time set (loop_ms): above one half, the call is
    # host-bound, and a faster kernel would not make it faster.
    host_bound: float = 0.0


@dataclass(frozen=True)
class Samples:
    """Calls' times (ms) in order, and whether each was its host time (loop_ms)."""

    ms: list[float]
    host_bound: list[bool]

    def timing(self) -> Timing:
        """Their median, stddev and host-bound share."""
        return summarize(self.ms, self.host_bound)


@dataclass(frozen=True)
class Rounds:
    """One call's samples (ms) from Timer.time_interleaved, round by round, and which were host-bound."""

    samples: tuple[tuple[float, ...], ...]
    host_bound: tuple[tuple[bool, ...], ...] = ()

    def pooled(self) -> Timing:
        """Median and stddev over every sample of every round."""
        return summarize([ms for round_ in self.samples for ms in round_],
                         [bound for round_ in self.host_bound for bound in round_])

    def medians(self) -> list[float]:
        """Each round's median."""
        return [statistics.median(round_) for round_ in self.samples]


class CallFailed(Exception):
    """A call of Timer.time_interleaved raised: `key` names it, the exception is chained."""

    def __init__(self, key: Hashable) -> None:
        super().__init__(f"timed call {key!r} raised")
        self.key = key


K = TypeVar("K", bound=Hashable)


def summarize(samples_ms: Sequence[float], host_bound: Sequence[bool] = ()) -> Timing:
    """Median and population standard deviation of the samples, and the share of them that `host_bound`
    marks (none if not given)."""
    if not samples_ms:
        raise ValueError("no timing samples")
    return Timing(statistics.median(samples_ms), statistics.pstdev(samples_ms), len(samples_ms),
                  sum(host_bound) / len(samples_ms))


def default_mode(device: torch.device) -> TimingMode:
    return "cuda-events" if device.type == "cuda" else "interpreter-wallclock"


class Timer:
    """Times callables on one device with one method; holds the L2-flush buffer between calls."""

    def __init__(
        self,
        device: torch.device,
        mode: TimingMode | None = None,
        repeats: int | None = None,
        warmup: int | None = None,
    ) -> None:
        self.device = device
        self.mode: TimingMode = mode or default_mode(device)
        if self.mode not in TIMING_MODES:
            raise ValueError(f"unknown timing mode '{self.mode}' (use one of {', '.join(TIMING_MODES)})")
        if self.mode != "interpreter-wallclock" and device.type != "cuda":
            raise ValueError(f"timing mode '{self.mode}' needs a CUDA device, got {device}")
        default_repeats, default_warmup = DEFAULT_COUNTS[self.mode]
        self.repeats = repeats or default_repeats
        self.warmup = default_warmup if warmup is None else warmup
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {self.repeats} and {self.warmup}")
        self._flush: torch.Tensor | None = None
        self._clock_khz = FALLBACK_CLOCK_KHZ
        if device.type == "cuda":
            properties = torch.cuda.get_device_properties(device)
            # Twice the L2 so that zeroing it evicts every line the previous call left behind.
            l2_bytes = properties.L2_cache_size or 64 * 2**20
            self._flush = torch.empty(2 * l2_bytes, dtype=torch.int8, device=device)
            self._clock_khz = getattr(properties, "clock_rate", 0) or FALLBACK_CLOCK_KHZ

    @property
    def flushes_l2(self) -> bool:
        return self._flush is not None

    def time(self, fn: Callable[[], object]) -> Timing:
        """`warmup` untimed calls of fn, then `repeats` timed ones (replays of one captured call in
        cuda-graph mode)."""
        return self._time_calls([self._warmed_up(fn)] * self.repeats).timing()

    def time_interleaved(self, calls: Mapping[K, Callable[[], object]], rounds: int,
                         repeats_per_round: int | None = None, seed: int = 0) -> dict[K, Rounds]:
        """Each call warmed up (and captured, in cuda-graph mode), then timed in `rounds` rounds: a round
        times every call `repeats_per_round` times back to back (by default the repeats spread over the
        rounds), the calls in an order of their own each round, drawn from `seed`. So calls compared with
        each other see the same GPU state and none has a fixed place in the round: with one fixed order, a
        call's place (after which neighbour, how far into the GPU's heating) moved its median by 4-8%
        between calls of benchmarks/attention_ab.py, where shuffled rounds agreed within 0.1-2.3% (H100,
        2026-11-27). A call that raises raises CallFailed naming it, the call's exception chained."""
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        per_round = repeats_per_round or math.ceil(self.repeats / rounds)
        prepared = {key: self._failing_as(key, self._warmed_up, fn) for key, fn in calls.items()}
        order = list(prepared)
        shuffler = random.Random(seed)
        samples: dict[K, list[Samples]] = {key: [] for key in prepared}
        for _ in range(rounds):
            shuffler.shuffle(order)
            for key in order:
                samples[key].append(self._failing_as(key, self._time_calls, [prepared[key]] * per_round))
        return {key: Rounds(tuple(tuple(r.ms) for r in got), tuple(tuple(r.host_bound) for r in got))
                for key, got in samples.items()}

    @staticmethod
    def _failing_as(key: Hashable, step: Callable, *args: object) -> object:
        """step(*args), an exception of it raised again as CallFailed(key)."""
        try:
            return step(*args)
        except Exception as exc:
            raise CallFailed(key) from exc

    def _warmed_up(self, fn: Callable[[], object]) -> Callable[[], object]:
        """fn after `warmup` untimed calls; in cuda-graph mode, the replay of one captured call."""
        for _ in range(self.warmup):
            fn()
        return self._capture(fn) if self.mode == "cuda-graph" else fn

    def time_each(self, calls: Sequence[Callable[[], object]]) -> Timing:
        """Each call timed once, in order, with no warm-up (the caller warms up): timing a different input
        set per call, whatever the repeats. Not in cuda-graph mode, which replays one captured call."""
        if self.mode == "cuda-graph":
            raise ValueError("cuda-graph timing replays one captured call: it cannot time a sequence of calls")
        return self._time_calls(calls).timing()

    def _time_calls(self, calls: Sequence[Callable[[], object]]) -> Samples:
        """Each call's ms, in order (the wall clock times the host and the device together: no sample of it
        is marked host-bound)."""
        if self.mode != "interpreter-wallclock":
            return self._time_events(calls)
        ms = self._time_wallclock(calls)
        return Samples(ms, [False] * len(ms))

    def _time_wallclock(self, calls: Sequence[Callable[[], object]]) -> list[float]:
        samples = []
        for fn in calls:
            start = perf_counter()
            fn()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            samples.append((perf_counter() - start) * 1e3)
        return samples

    def _time_events(self, calls: Sequence[Callable[[], object]]) -> Samples:
        """Each call's loop_ms: its kernels between events, queued behind a lead of GPU work (a spin as long
        as lead_seconds, the flush, and what is left of the previous call), and its host time on the clock (a
        call that waits out the lead, at a host sync or a full launch queue, is timed again from an idle
        GPU)."""
        assert self._flush is not None
        starts = [torch.cuda.Event(enable_timing=True) for _ in calls]
        ends = [torch.cuda.Event(enable_timing=True) for _ in calls]
        host_s: list[float] = []
        for i, (fn, start, end) in enumerate(zip(calls, starts, ends, strict=True)):
            if i >= 2:
                # The GPU at most a call behind, waited for as a loop's host waits, busy: a host that slept
                # through a synchronize issued its next call 2-3x slower (H100 host, 2026-11-27).
                while not ends[i - 2].query():
                    pass
            lead = lead_seconds(host_s[-1] if host_s else None)
            torch.cuda._sleep(int(lead * self._clock_khz * 1e3))
            self._flush.zero_()
            host = self._record(fn, start, end)
            if host > lead:
                # The host waited out the lead: a host sync, or more launches than the stream's queue holds
                # (about a thousand: a multi-layer step of torch ops), which blocked the host until the spin
                # ended. Its clock then timed the spin, and the next lead (twice that) would again. Timed
                # again from an idle GPU, as a loop that waits for its GPU runs it.
                torch.cuda.synchronize(self.device)
                self._flush.zero_()
                host = self._record(fn, start, end)
            host_s.append(host)
        torch.cuda.synchronize(self.device)
        gpu_ms = [start.elapsed_time(end) for start, end in zip(starts, ends, strict=True)]
        host_ms = [host * 1e3 for host in host_s]
        return Samples([loop_ms(gpu, host) for gpu, host in zip(gpu_ms, host_ms, strict=True)],
                       [host > gpu for gpu, host in zip(gpu_ms, host_ms, strict=True)])

    @staticmethod
    def _record(fn: Callable[[], object], start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        """fn between two events; its host seconds."""
        start.record()
        began = perf_counter()
        fn()
        host = perf_counter() - began
        end.record()
        return host

    def _capture(self, fn: Callable[[], object]) -> Callable[[], object]:
        """Capture one call into a CUDA graph (after warm-up on a side stream, as capture requires)."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay
