"""Where permute's forward loses to a copy (issue 17: >= 85% of the copy's bandwidth), on a GPU: at
DeepSeek-V3's 32k tokens x top-8, hidden 7168, the whole forward (the rank and scan kernels, then the
scatter) and the scatter alone (the row map given), each under every width of the scatter's row
(SCATTER_BLOCK_H columns held at a time; its warps follow, 8 columns a thread), CUDA-graph replays
interleaved round by round; a copy of the same bytes with CUDA events.

    PYTHONPATH=. python3 scripts/permute_sweep.py
"""

from __future__ import annotations

import importlib
import statistics
import sys

import torch

from harness.timing import Timer
from kernels.moe import capacity_for, permute
from kernels.moe.permute import scatter_rows

sys.path.insert(0, "benchmarks")
from moe_ops import HIDDEN, TOPK, skewed_ids

# The module: `kernels.moe.permute` as an attribute is the function the package exports.
permute_module = importlib.import_module("kernels.moe.permute")

BLOCK_WIDTHS = (1024, 2048, 4096, 8192)  # SCATTER_BLOCK_H


def sweep(x: torch.Tensor, probs: torch.Tensor, experts: int, pad_to: int, graphs: Timer, events: Timer,
          rounds: int) -> None:
    """Print each variant's GB/s for one routing (E experts, padding), and its fraction of a copy's."""
    T, H = x.shape
    ids = skewed_ids(T, experts, x.device)
    r = permute(x, ids, probs, num_experts=experts, pad_to=pad_to)
    out, copy_src = torch.empty_like(r.permuted), torch.empty_like(r.permuted)
    nbytes = (T + capacity_for(T, TOPK, experts, pad_to)) * H * x.element_size()
    copy_gbps = 2 * copy_src.numel() * 2 / events.time(lambda: out.copy_(copy_src)).median_ms / 1e6
    calls = {"forward": lambda: permute(x, ids, probs, num_experts=experts, pad_to=pad_to),
             "scatter": lambda: scatter_rows(x, r.row_map, None, out)}
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for block_h in BLOCK_WIDTHS:
            permute_module.SCATTER_BLOCK_H = block_h
            for name, fn in calls.items():
                times.setdefault((name, block_h), []).append(graphs.time(fn).median_ms)
    print(f"=== E{experts} pad{pad_to}: copy {copy_gbps:.0f} GB/s; GB/s and fraction of the copy, median of {rounds}")
    for (name, block_h), ms in times.items():
        gbps = nbytes / statistics.median(ms) / 1e6
        print(f"  {name:8s} SCATTER_BLOCK_H {block_h:5d}: {gbps:7.0f} GB/s {gbps / copy_gbps:6.3f}")


def main(rounds: int = 3) -> None:
    device = torch.device("cuda")
    graphs, events = Timer(device, mode="cuda-graph", repeats=20, warmup=3), Timer(device, repeats=20, warmup=3)
    x = torch.randn(32768, HIDDEN, dtype=torch.bfloat16, device=device)
    probs = torch.rand(32768, TOPK, device=device)
    for experts, pad_to in ((32, 1), (256, 128)):
        sweep(x, probs, experts, pad_to, graphs, events, rounds)


if __name__ == "__main__":
    main()
