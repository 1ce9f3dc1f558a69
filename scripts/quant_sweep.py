"""Where the rowwise quantization loses to a copy (issues 15 and 17), on a GPU: quantize_both's two kernels
(the amax pass, then the casts) timed apart on the SonicMoE layer's rows (32k tokens x top-8 = 262144 rows,
hidden 4096, 128 skewed experts) under token groups (the token layout's block map) and equal groups (a
division), read from a written copy and through a RowSource (gathered from the 32k tokens); its SwiGLU
input (GateUP's output, 1024 wide); DeepSeek-V3's 32768 routed rows of 7168 and its GateUP weight stack;
next to a copy. CUDA events, L2 flushed, medians; TB/s counts each kernel's bytes (reads of the bf16 rows,
fp8 writes).

    PYTHONPATH=. python3 scripts/quant_sweep.py [--sweep] [--only NAME]   # --sweep: each kernel's tile width and warps
"""

from __future__ import annotations

import argparse
import sys

import torch

import kernels.common.fp8 as fp8_module
from harness.timing import Timer
from kernels.common.device import cdiv
from kernels.common.fp8 import Granularity, RowGroups, RowSource, quantize_both
from kernels.grouped_gemm import group_offsets
from kernels.moe import sort_by_expert

sys.path.insert(0, "benchmarks")
from moe_ops import skewed_ids

E4M3 = torch.float8_e4m3fn


KERNELS = ("_amax_both_kernel", "_quantize_both_kernel")


class _Recorder:
    """Stands in for a launcher: launches as it would and keeps the launch (launcher, grid, arguments)."""

    def __init__(self, launcher, captured: dict, name: str) -> None:
        self.launcher, self.captured, self.name = launcher, captured, name

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.captured[self.name] = (self.launcher, grid, args, kwargs)
            self.launcher[grid](*args, **kwargs)
        return launch


def captured_launches(call) -> dict[str, tuple]:
    """Each quantization kernel's launch in one call of `call`, to replay alone on the same arguments (the
    amax pass's atomics then max into an amax already complete: the same work)."""
    originals = {name: getattr(fp8_module, name) for name in KERNELS}
    captured: dict[str, tuple] = {}
    for name in KERNELS:
        setattr(fp8_module, name, _Recorder(originals[name], captured, name))
    try:
        call()
    finally:
        for name in KERNELS:
            setattr(fp8_module, name, originals[name])
    return captured


def replay(launch: tuple, **overrides):
    """A captured launch as a callable, with BLOCK_C / num_warps overridden (the grid's column blocks follow:
    a program per token block and column block)."""
    launcher, grid, args, kwargs = launch
    token_blocks = grid[0] // cdiv(kwargs["C"], kwargs["BLOCK_C"])
    kwargs = {**kwargs, **overrides}
    grid = (token_blocks * cdiv(kwargs["C"], kwargs["BLOCK_C"]),)
    return lambda: launcher[grid](*args, **kwargs)


def kernel_times(timer: Timer, call) -> dict[str, float]:
    """Median ms of each quantization kernel a call launches, each replayed alone."""
    return {name: timer.time(replay(launch)).median_ms for name, launch in captured_launches(call).items()}


def two_passes(elements: int, read_bytes: int, layouts: int = 2) -> dict[str, int]:
    """Bytes each kernel of a rowwise quantize_both moves: the amax pass reads the elements, the casts read them
    again and write `layouts` fp8 layouts."""
    return {"_amax_both_kernel": elements * read_bytes, "_quantize_both_kernel": elements * (read_bytes + layouts)}


def sweep(timer: Timer, call, moved: dict[str, int]) -> None:
    """TB/s of each kernel of a rowwise call under every (BLOCK_C, num_warps) tried."""
    launches = captured_launches(call)
    for name, block_cs, warps in (("_amax_both_kernel", (64, 128), (2, 4, 8)),
                                  ("_quantize_both_kernel", (32, 64, 128), (2, 4, 8))):
        for block_c in block_cs:
            row = []
            for w in warps:
                ms = timer.time(replay(launches[name], BLOCK_C=block_c, num_warps=w)).median_ms
                row.append(f"w{w} {moved[name] / ms / 1e9:.2f}")
            print(f"  {name} BLOCK_C {block_c:3d}: " + " | ".join(row) + " TB/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="store_true",
                        help="also time the rowwise kernels under each (BLOCK_C, num_warps) tried")
    parser.add_argument("--only", default="", help="keep cases whose name contains this")
    args = parser.parse_args()
    timer = Timer(torch.device("cuda"), mode="cuda-events", repeats=20, warmup=3)
    T, H, E = 32768, 4096, 128
    tokens = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    ids = skewed_ids(T, E, torch.device("cuda"))
    order = sort_by_expert(ids, torch.rand(ids.shape, device="cuda"), num_experts=E)
    R = order.sources.numel()
    rows = tokens[order.sources.clamp(min=0).long()].contiguous()
    offs = order.group_offs
    groups = RowGroups.tokens(offs)
    uniform = group_offsets(torch.full((E,), R // E, device="cuda", dtype=torch.int64))
    h = torch.randn(R, 2 * 512, device="cuda", dtype=torch.bfloat16)
    dsv3_tokens = torch.randn(32768, 7168, device="cuda", dtype=torch.bfloat16)
    dsv3_offs = sort_by_expert(skewed_ids(32768, 32, torch.device("cuda")), num_experts=32).group_offs
    dsv3_offs = (dsv3_offs // 8).clamp(max=32768)  # top-8 rows per token: the groups of 32768 rows
    dsv3_weights = torch.randn(32 * 4096, 7168, device="cuda", dtype=torch.bfloat16)
    copy_ms = timer.time(lambda: rows.clone()).median_ms
    print(f"copy of the rows: {2 * rows.numel() * 2 / copy_ms / 1e9:.2f} TB/s ({copy_ms:.3f} ms)")
    rows_moved = two_passes(rows.numel(), 2)
    # Through the order: the amax pass reads the T tokens, the casts the R rows through the index and write the
    # transposed layout (the rows layout is the tokens' own, quantize_rows's: not timed here).
    source_moved = {"_amax_both_kernel": tokens.numel() * 2, "_quantize_both_kernel": rows.numel() * 3}
    cases = {
        "rows, skewed token groups": (lambda: quantize_both(rows, E4M3, Granularity.ROWWISE, groups), rows_moved),
        "rows, uniform token groups": (
            lambda: quantize_both(rows, E4M3, Granularity.ROWWISE, RowGroups.tokens(uniform)), rows_moved),
        "rows, equal groups (division)": (lambda: quantize_both(rows, E4M3, Granularity.ROWWISE,
                                                                 RowGroups.equal(E, R // E)), rows_moved),
        "tokens through the order (RowSource)": (
            lambda: quantize_both(tokens, E4M3, Granularity.ROWWISE, groups, source=RowSource(order.sources)),
            source_moved),
        "output gradient through the order, weighted, rows unweighted": (
            lambda: quantize_both(tokens, E4M3, Granularity.ROWWISE, groups,
                                  source=RowSource(order.sources, order.permuted_probs, weighted_rows=False)),
            source_moved),
        "SwiGLU input (glu), skewed token groups": (
            lambda: quantize_both(h, E4M3, Granularity.ROWWISE, groups, glu=True), two_passes(h.numel() // 2, 4)),
        "rows, blockwise, skewed token groups": (
            lambda: quantize_both(rows, E4M3, Granularity.BLOCKWISE, groups),
            {"_quantize_both_kernel": rows.numel() * 4}),
        "DeepSeek-V3 tokens 32768 x 7168, 32 skewed groups": (
            lambda: quantize_both(dsv3_tokens, E4M3, Granularity.ROWWISE, RowGroups.tokens(dsv3_offs)),
            two_passes(dsv3_tokens.numel(), 2)),
        "DeepSeek-V3 GateUP weights 32 x 4096 x 7168": (
            lambda: quantize_both(dsv3_weights, E4M3, Granularity.ROWWISE, RowGroups.equal(32, 4096)),
            two_passes(dsv3_weights.numel(), 2)),
    }
    cases = {name: case for name, case in cases.items() if args.only in name}
    for name, (call, moved) in cases.items():
        times = kernel_times(timer, call)
        parts = [f"{kernel} {ms:.3f} ms" + (f" {moved[kernel] / ms / 1e9:.2f} TB/s" if kernel in moved else "")
                 for kernel, ms in times.items()]
        print(f"{name:42s} " + " | ".join(parts))
    if args.sweep:
        for name, (call, moved) in cases.items():
            if "blockwise" not in name:
                print(f"sweep: {name}")
                sweep(timer, call, moved)


if __name__ == "__main__":
    main()
