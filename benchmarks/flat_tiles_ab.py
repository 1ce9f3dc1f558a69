"""A/B of the M-grouped kernel's tile loop (kernels/grouped_gemm/kernel.py's `flat_tiles`, set per call): every
group's tiles in one loop that Triton flattens into the K loop (the next tile's loads in flight during this tile's
epilogue) against a loop over the groups with a loop over each group's tiles; interleaved rounds in shuffled order,
the two outputs compared bit for bit (same tiles, same K order).

    python benchmarks/flat_tiles_ab.py   # the forward and dgrad passes, FP8 rowwise and bf16, MoE shapes

The MoE layer's A/B of the same switch: benchmarks/moe_layer_ab.py flat-tiles.
"""
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from passes_report import with_switch

import kernels  # noqa: F401
import kernels.grouped_gemm.kernel as gk
from harness.shapes import split_tokens
from harness.timing import Timer
from kernels.common.fp8 import Granularity, quantize_rows
from kernels.grouped_gemm import group_offsets, grouped_dgrad, grouped_forward
from kernels.grouped_gemm_fp8.kernel import QuantizedWeight, m_grouped_fp8

E4M3 = torch.float8_e4m3fn
HEAD = gk.flat_tiles
timer = Timer(torch.device("cuda"), repeats=10, warmup=3)


def case(label: str, lens: list[int], N: int, K: int, pass_name: str, fp8: bool) -> None:
    """One M-grouped pass: rows [sum(lens), K] times each group's [N, K] weight, flat against nested."""
    M, G = sum(lens), len(lens)
    offs = group_offsets(torch.tensor(lens, device="cuda"))
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(G, N, K, device="cuda", dtype=torch.bfloat16)
    outs = {flat: torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16) for flat in (True, False)}
    if fp8:
        rows = quantize_rows(a, E4M3, Granularity.ROWWISE)
        weight = QuantizedWeight.quantize(w, False, E4M3, Granularity.ROWWISE)

        def run(out: torch.Tensor) -> None:
            m_grouped_fp8(pass_name, rows, weight, offs, Granularity.ROWWISE, out)
    else:
        # grouped_dgrad reduces over the weight's first dim: hand it [G, K, N] so both read [N, K] tiles
        w_pass = w if pass_name == "fwd" else w.transpose(1, 2).contiguous()

        def run(out: torch.Tensor) -> None:
            (grouped_forward if pass_name == "fwd" else grouped_dgrad)(a, w_pass, offs, True, out)
    calls = {flat: with_switch(gk, "flat_tiles", lambda *_, flat=flat: flat, lambda out=out: run(out))
             for flat, out in outs.items()}
    for call in calls.values():
        call()
    same = torch.equal(outs[True], outs[False]) and not outs[True].isnan().any().item()
    timed = timer.time_interleaved(calls, 7, 10, 0)
    gk.flat_tiles = HEAD
    medians = {flat: rounds.medians() for flat, rounds in timed.items()}
    ratios = [n / f for n, f in zip(medians[False], medians[True], strict=True)]
    flops = 2.0 * M * N * K
    print(f"{label:38s} {'fp8' if fp8 else 'bf16'} flat / nested {statistics.median(ratios):.3f}x "
          f"[{min(ratios):.3f}, {max(ratios):.3f}]  ({flops / statistics.median(medians[True]) / 1e9:.0f} vs "
          f"{flops / statistics.median(medians[False]) / 1e9:.0f} TFLOPS)  bit-equal {same}", flush=True)


if __name__ == "__main__":
    sonic = split_tokens(262144, 128, "topk", 0)
    dsv3 = split_tokens(32768, 32, "topk", 1)
    qwen3 = split_tokens(65536, 128, "topk", 2)
    for fp8 in (True, False):
        case("sonicmoe gateup fwd 128 x 2048", sonic, 1024, 4096, "fwd", fp8)
        case("sonicmoe down fwd", sonic, 4096, 512, "fwd", fp8)
        case("sonicmoe down dgrad", sonic, 512, 4096, "dgrad", fp8)
        case("sonicmoe gateup dgrad", sonic, 4096, 1024, "dgrad", fp8)
        case("dsv3 gateup fwd 32 x 1024", dsv3, 4096, 7168, "fwd", fp8)
        case("dsv3 down fwd", dsv3, 7168, 2048, "fwd", fp8)
        case("dsv3 down dgrad", dsv3, 2048, 7168, "dgrad", fp8)
        case("dsv3 gateup dgrad", dsv3, 7168, 4096, "dgrad", fp8)
        case("qwen3 gateup fwd 128 x 512", qwen3, 3072, 4096, "fwd", fp8)
        case("qwen3 down fwd", qwen3, 4096, 1536, "fwd", fp8)
        torch.cuda.empty_cache()
