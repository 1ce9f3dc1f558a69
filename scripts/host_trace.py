"""Where a step's host time goes, on one thread: cProfile (autograd's backward kept on the calling thread)
and torch.profiler's CPU-side events (CUDA runtime and driver calls included) of FP8 training steps.

    PYTHONPATH=. python3 scripts/host_trace.py
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from training_step import MOE_CASES, dense_steps, moe_steps


def trace(name: str, step, calls: int = 20) -> None:
    for i in range(8):
        step(i)
    torch.cuda.synchronize()
    host = []
    for i in range(calls):
        torch.cuda.synchronize()
        started = time.perf_counter()
        step(i % 8)
        host.append((time.perf_counter() - started) * 1e3)
    host.sort()
    print(f"\n=== {name}: host ms per step, median {host[len(host) // 2]:.2f}, min {host[0]:.2f}")
    with torch.autograd.set_multithreading_enabled(False):
        prof = cProfile.Profile()
        prof.enable()
        for i in range(calls):
            step(i % 8)
        prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(30)
    print(text.getvalue())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as events:
        for i in range(5):
            step(i)
        torch.cuda.synchronize()
    print(events.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))


if __name__ == "__main__":
    dense = dense_steps(4096, 4096, 4096, ["e4m3-rowwise"], torchao=False, accumulate=1)
    trace("dense 8b o t4096 bf16", dense["bf16 torch"])
    trace("dense 8b o t4096 e4m3-rowwise", dense["ours e4m3-rowwise"])
    moe = moe_steps(MOE_CASES["gpt-oss-120b"], ["e4m3-rowwise"], torchao=False, accumulate=1)
    trace("moe gpt-oss e4m3-rowwise", moe["ours e4m3-rowwise"], calls=10)
