import statistics
import time

import pytest
import torch

from harness.timing import MAX_LEAD_S, MIN_LEAD_S, CallFailed, Rounds, Timer, lead_seconds, loop_ms, summarize


def test_summarize_is_median_and_population_stddev():
    t = summarize([1.0, 2.0, 3.0, 10.0])
    assert t.median_ms == 2.5
    assert t.stddev_ms == pytest.approx(statistics.pstdev([1.0, 2.0, 3.0, 10.0]))
    assert t.samples == 4
    with pytest.raises(ValueError):
        summarize([])


def test_the_host_bound_share_is_of_all_samples_pooled_over_rounds():
    assert summarize([1.0, 2.0, 3.0, 4.0], [True, False, True, True]).host_bound == 0.75
    assert summarize([1.0, 2.0]).host_bound == 0.0
    rounds = Rounds(((1.0, 3.0), (10.0, 20.0)), ((True, False), (False, False)))
    assert rounds.pooled().host_bound == 0.25
    assert Timer(torch.device("cpu"), repeats=3, warmup=0).time(lambda: None).host_bound == 0.0


def test_a_call_costs_a_loop_its_gpu_time_or_its_host_time_where_that_is_longer():
    assert loop_ms(gpu_ms=1.8, host_ms=0.12) == 1.8  # the host runs ahead: its time is hidden
    assert loop_ms(gpu_ms=0.15, host_ms=0.38) == 0.38  # host-bound: the GPU waits


def test_the_gpu_leads_each_call_by_twice_the_last_host_time_within_bounds():
    assert lead_seconds(None) == MIN_LEAD_S
    assert lead_seconds(1e-4) == MIN_LEAD_S
    assert lead_seconds(3e-3) == pytest.approx(6e-3)
    assert lead_seconds(1.0) == MAX_LEAD_S


def test_wallclock_timer_calls_warmup_plus_repeats():
    calls = []
    timer = Timer(torch.device("cpu"), repeats=4, warmup=2)
    assert timer.mode == "interpreter-wallclock" and not timer.flushes_l2
    t = timer.time(lambda: calls.append(1))
    assert len(calls) == 6 and t.samples == 4 and t.median_ms >= 0


def test_a_clock_swapped_after_import_does_not_reach_the_timer(monkeypatch):
    """Code under timing that slows `time.perf_counter` (an adversary's candidate) times itself on the clock
    the harness bound at import."""
    real = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: real() * 0.01)
    timing = Timer(torch.device("cpu"), repeats=3, warmup=0).time(lambda: time.sleep(0.005))
    assert timing.median_ms >= 4.5


def test_time_each_times_every_call_once_without_warmup_whatever_the_repeats():
    calls = []
    timer = Timer(torch.device("cpu"), repeats=50, warmup=10)
    t = timer.time_each([lambda i=i: calls.append(i) for i in range(5)])
    assert calls == [0, 1, 2, 3, 4] and t.samples == 5


def test_interleaved_rounds_warm_up_each_call_then_time_every_call_in_each_round_in_shuffled_orders():
    log = []
    timer = Timer(torch.device("cpu"), repeats=12, warmup=2)
    calls = {name: (lambda name=name: log.append(name)) for name in "abcd"}
    timed = timer.time_interleaved(calls, rounds=6)
    assert log[:8] == ["a", "a", "b", "b", "c", "c", "d", "d"]  # the warm-up, call by call
    rounds = [log[8 + 8 * r:16 + 8 * r] for r in range(6)]  # 12 repeats over 6 rounds: 2 calls a round
    assert len(log) == 8 + 6 * 8 and all(sorted(r) == sorted("aabbccdd") for r in rounds)
    assert all(r[0::2] == r[1::2] for r in rounds)  # a call's repeats of a round run back to back
    assert len({tuple(r[0::2]) for r in rounds}) > 1  # not one fixed order
    assert {name: len(t.samples) for name, t in timed.items()} == dict.fromkeys("abcd", 6)
    assert all(t.pooled().samples == 12 and len(t.medians()) == 6 for t in timed.values())


def test_rounds_pool_their_samples_and_give_each_rounds_median():
    rounds = Rounds(((1.0, 3.0), (10.0, 20.0, 30.0)))
    assert rounds.medians() == [2.0, 20.0]
    assert rounds.pooled() == summarize([1.0, 3.0, 10.0, 20.0, 30.0])


def test_an_interleaved_call_that_raises_is_named():
    def breaks():
        raise RuntimeError("kernel fault")

    timer = Timer(torch.device("cpu"), repeats=2, warmup=0)
    with pytest.raises(CallFailed) as failed:
        timer.time_interleaved({"fine": lambda: None, ("baseline", "bwd"): breaks}, rounds=2)
    assert failed.value.key == ("baseline", "bwd") and "kernel fault" in str(failed.value.__cause__)
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        timer.time_interleaved({"fine": lambda: None}, rounds=0)


def test_gpu_modes_refuse_the_cpu():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        Timer(torch.device("cpu"), mode="cuda-events")
    with pytest.raises(ValueError, match="unknown timing mode"):
        Timer(torch.device("cpu"), mode="stopwatch")  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["cuda-events", "cuda-graph"])
def test_gpu_timing_sees_the_work(mode):
    x = torch.randn(4096, 4096, device="cuda")
    timer = Timer(torch.device("cuda"), mode=mode, repeats=10, warmup=2)
    one = timer.time(lambda: x @ x)
    four = timer.time(lambda: [x @ x for _ in range(4)])
    assert timer.flushes_l2
    assert 2.5 < four.median_ms / one.median_ms < 6


@pytest.mark.gpu
@pytest.mark.parametrize("host_us", [25, 200])
def test_a_call_whose_host_time_exceeds_its_gpu_time_is_timed_at_its_host_time(host_us):
    """An op that spends `host_us` on the host before one tiny kernel: its timing must show the host's
    time, as a training loop pays it, not hide it behind the L2 flush (a 2x-L2 memset, tens of us)."""
    device = torch.device("cuda")
    x = torch.zeros(16, device=device)

    def host_bound() -> None:
        deadline = time.perf_counter() + host_us * 1e-6
        while time.perf_counter() < deadline:
            pass
        x.add_(1)

    timing = Timer(device, repeats=20, warmup=3).time(host_bound)
    assert timing.median_ms >= 0.9 * host_us / 1e3, f"{timing.median_ms * 1e3:.1f} us timed for {host_us} us of host"
    assert timing.host_bound > 0.5


@pytest.mark.gpu
def test_a_gpu_bound_call_is_timed_at_its_gpu_time_its_shorter_host_time_hidden():
    """As a training loop's host runs ahead: 150 us of host before a ~1 ms kernel costs the loop nothing, so
    the timing must not add it (timed from an idle GPU, it did)."""
    device = torch.device("cuda")
    x = torch.randn(3072, 3072, device=device)  # fp32: about 1 ms on an H100
    host_us = 150

    def spin_then_launch() -> None:
        deadline = time.perf_counter() + host_us * 1e-6
        while time.perf_counter() < deadline:
            pass
        torch.matmul(x, x)

    timer = Timer(device, repeats=20, warmup=3)
    alone = timer.time(lambda: torch.matmul(x, x)).median_ms
    assert alone > 2 * host_us / 1e3, f"the kernel ({alone:.3f} ms) must outlast the host time"
    spun = timer.time(spin_then_launch)
    assert spun.median_ms < alone + 0.3 * host_us / 1e3, \
        f"{spun.median_ms:.3f} ms with {host_us} us of host, {alone:.3f} ms without"
    assert spun.host_bound < 0.5


@pytest.mark.gpu
def test_a_call_of_more_launches_than_the_queue_holds_is_timed_as_a_loop_runs_it():
    """1500 launches a call fill the stream's queue behind the GPU's lead, so the host blocks until the spin
    ends: its clock timed the spin (and the next lead, twice that, up to 50 ms) where a loop of such calls
    pays its host time. Such a call is timed again from an idle GPU: within 1.3x of the calls' wall clock."""
    device = torch.device("cuda")
    x = torch.zeros(16, device=device)

    def many_launches() -> None:
        for _ in range(1500):
            x.add_(1)

    timing = Timer(device, repeats=10, warmup=2).time(many_launches)
    torch.cuda.synchronize(device)
    began = time.perf_counter()
    for _ in range(10):
        many_launches()
    torch.cuda.synchronize(device)
    wall_ms = (time.perf_counter() - began) / 10 * 1e3
    assert timing.median_ms < 1.3 * wall_ms, f"{timing.median_ms:.2f} ms timed, {wall_ms:.2f} ms a call on the clock"
