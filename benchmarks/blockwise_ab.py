"""Blockwise FP8 GEMM alone: the warp-specialized Gluon kernel against the Triton kernels, interleaved.

The forward (`--pass fwd`): both kernels on the same quantized operands (1x128 activations, 128x128
weights) at the acceptance shapes, the dense 8192^3 (issue 6) and DeepSeek-V3 GateUP, 8 experts x
4096 tokens (N 4096, K 7168; issue 3), two short-K Downs (K 2048 and 1536) and two dense GEMMs of the
small bucket, the warp-specialized kernel on 128x128 and 128x256 tiles (`--block-n`). The wgrad
(`--pass wgrad`, issue 15): the token reduction of both operands quantized 1x128 along the tokens,
dense 8192^3, DeepSeek-V3 GateUP's 32 experts at 512 and 1024 tokens each and Qwen3-235B's 16 at 2048,
writing a fresh gradient and adding into a bf16 main_grad, against the Triton kernels under the tuned
table's config (narrowed to 128 wide, as the ops' Triton fallback runs it) and the same 128x128 tile
(`--block-n 128 256`: the warp-specialized kernel's promoting
128-wide tile and its rescaled 256-wide one). Each round times every
variant once, back to back in an order of its own (passes_report.interleaved_rounds), so all see the
same GPU state; the rounds' median is the sustained figure, their max what a cool GPU gives.
`--ping-pong both` times each warp-specialized forward with its consumers' MMAs issued in turns and
without (blockwise_mm's ping_pong; the forward's ops take turns, the dgrad's do not).

    python benchmarks/blockwise_ab.py --rounds 5 --csv blockwise_ab.csv
    python benchmarks/blockwise_ab.py --pass wgrad --rounds 5 --csv blockwise_wgrad_ab.csv
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable

import torch
from passes_report import interleaved_rounds, report

import kernels  # noqa: F401  (interpreter switch before triton loads)
from harness.timing import Timer
from kernels.common import blockwise_ws
from kernels.common.fp8 import Granularity, RowGroups, quantize_blocks_2d, quantize_both, quantize_rows
from kernels.common.scales import Scales
from kernels.common.tiles import TileConfig
from kernels.gemm.kernel import launch_tma
from kernels.gemm_fp8.tuning import config_for as dense_config_for
from kernels.grouped_gemm.kernel import VarKScales, grouped_mm, grouped_mm_vark
from kernels.grouped_gemm_fp8.tuning import config_for as grouped_config_for

SHAPES = {"dense 8192^3": (1, 8192, 8192, 8192), "DSv3 GateUP 8x4096": (8, 8 * 4096, 4096, 7168),
          # the short-K forwards, where a tile's epilogue weighs most
          "DSv3 Down 8x4096": (8, 8 * 4096, 7168, 2048), "Qwen3 Down 16x2048": (16, 16 * 2048, 4096, 1536),
          # the small buckets: grouped, under 1024 tokens an expert; dense, outputs up to 2048 x 2048
          "DSv3 GateUP 32x512": (32, 32 * 512, 4096, 7168),
          "dense 1024x2048x4096": (1, 1024, 2048, 4096), "dense 2048x2048x8192": (1, 2048, 2048, 8192)}
# (groups, tokens, P, Q): out [G, P, Q] = grad_out^T @ x over each group's tokens
WGRAD_SHAPES = {"dense wgrad 8192^3": (1, 8192, 8192, 8192), "DSv3 GateUP wgrad 32x512": (32, 32 * 512, 4096, 7168),
                "DSv3 GateUP wgrad 32x1024": (32, 32 * 1024, 4096, 7168),
                # Qwen3-235B's 2048-token experts: the large wgrad bucket
                "Qwen3 GateUP wgrad 16x2048": (16, 16 * 2048, 3072, 4096),
                "Qwen3 Down wgrad 16x2048": (16, 16 * 2048, 4096, 1536)}
TRITON_CONFIG = TileConfig(128, 128, 128, 8, 8, 4)  # the Triton kernel's best (docs/performance.md)


def variants(G: int, M: int, N: int, K: int, stages: list[int], group_ms: list[int],
             block_ns: list[int], ping_pongs: list[bool]) -> dict[str, Callable]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(G, N, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    xq, sx = quantize_rows(x, torch.float8_e4m3fn, Granularity.BLOCKWISE)
    wq, _, sw = quantize_blocks_2d(w, torch.float8_e4m3fn, cols_t=False)
    scales = Scales(sx, sx.stride(), sw, sw.stride(), 128, per_k_block=True)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    offs = torch.arange(G + 1, device="cuda", dtype=torch.int64) * (M // G) if G > 1 else None
    if offs is None:
        runs = {"triton 128x128 w8 s4": lambda: launch_tma(xq, wq[0].t(), out, TRITON_CONFIG, scales)}
    else:
        runs = {"triton 128x128 w8 s4": lambda: grouped_mm(xq, wq, offs, out, TRITON_CONFIG, scales)}
    for block_n in block_ns:
        for s in stages:
            for gm in group_ms:
                cfg = TileConfig(128, block_n, 128, gm, 8, s)
                if not blockwise_ws.fits(block_n, s, out.element_size()):
                    continue  # 128x256 tiles fit 4 stages at most
                if not blockwise_ws.supported(xq, wq, out, scales, cfg):
                    raise SystemExit("the warp-specialized blockwise kernel needs a Hopper GPU (sm_90)")
                for turns in ping_pongs:
                    name = f"ws 128x{block_n} s{s} GROUP_M {gm}" + (" in turns" if turns else "")
                    runs[name] = lambda c=cfg, t=turns: blockwise_ws.blockwise_mm(xq, wq, out, scales, c, offs, t)
    return runs


def wgrad_variants(G: int, T: int, P: int, Q: int, stages: list[int], group_ms: list[int],
                   block_ns: list[int]) -> dict[str, Callable]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    offs = torch.arange(G + 1, device="cuda", dtype=torch.int64) * (T // G)
    groups = RowGroups.tokens(offs) if G > 1 else RowGroups.equal(1, T)
    quantized = [quantize_both(torch.randn(T, n, device="cuda", dtype=torch.bfloat16, generator=gen),
                               torch.float8_e4m3fn, Granularity.BLOCKWISE, groups, rows=False) for n in (P, Q)]
    (xt, sx), (yt, sy) = (q.cols_t for q in quantized)
    padded = quantized[0].padded_offs
    scales = Scales(sx, (sx.stride(1), sx.stride(0)), sy, (0, sy.stride(1), sy.stride(0)), per_k_block=True)
    out = torch.zeros((G, P, Q) if G > 1 else (P, Q), device="cuda", dtype=torch.bfloat16)
    if G > 1:
        # the table's config as the Triton fallback runs it (narrowed where the table's tile is this kernel's)
        table = blockwise_ws.triton_tile(grouped_config_for("wgrad", T, G, Granularity.BLOCKWISE, (P, Q)))
        vark = VarKScales(sx, (0, *scales.a_strides), sy, scales.b_strides, per_k_block=True)
        triton = {f"triton {c.BLOCK_M}x{c.BLOCK_N} w{c.num_warps} s{c.num_stages}": (
            lambda acc, c=c: grouped_mm_vark(xt, yt, padded, out, c, vark, padded=True, accumulate=acc))
            for c in (table, TRITON_CONFIG)}
    else:  # the dense wgrad's kernels before the token reduction, under the table's config
        table = blockwise_ws.triton_tile(dense_config_for("wgrad", P, Q, Granularity.BLOCKWISE, (P, Q)))
        one_group = torch.tensor([0, P], device="cuda", dtype=torch.int64)
        triton = {f"triton {table.BLOCK_M}x{table.BLOCK_N} w{table.num_warps} s{table.num_stages}": (
            lambda acc: grouped_mm(xt, yt[None], one_group, out, table, scales, True) if acc
            else launch_tma(xt, yt.t(), out, table, scales))}
    runs = {}
    for accumulate in (False, True):
        mode = "+=" if accumulate else "fresh"
        runs |= {f"{name} {mode}": (lambda run=run, acc=accumulate: run(acc)) for name, run in triton.items()}
        for block_n in block_ns:  # the token reduction's tiles: 256 wide keeps one rescaled accumulator
            for s in stages:
                for gm in group_ms:
                    cfg = TileConfig(128, block_n, 128, gm, 8, s)
                    if not blockwise_ws.fits(block_n, s, out.element_size(), token_reduction=True):
                        continue
                    if not blockwise_ws.supported(xt, yt, out, scales, cfg, token_reduction=True):
                        raise SystemExit("the warp-specialized blockwise kernel needs a Hopper GPU (sm_90)")
                    runs[f"ws 128x{block_n} s{s} GROUP_M {gm} {mode}"] = (
                        lambda c=cfg, acc=accumulate: blockwise_ws.blockwise_token_mm(
                            xt, yt, out, scales, c, padded if G > 1 else None, acc))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--stages", type=int, nargs="+", default=[3, 4, 5])
    parser.add_argument("--group-m", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--block-n", type=int, nargs="+", default=[128, 256],
                        help="the warp-specialized kernel's tile widths (the wgrad's stop at 128)")
    parser.add_argument("--pass", dest="pass_name", choices=("fwd", "wgrad"), default="fwd")
    parser.add_argument("--ping-pong", choices=("on", "off", "both"), default="on",
                        help="the forward's consumers issuing their MMAs in turns, or not, or both")
    parser.add_argument("--csv", default=None)
    args = parser.parse_args()
    ping_pongs = {"on": [True], "off": [False], "both": [True, False]}[args.ping_pong]
    timer = Timer(torch.device("cuda"), repeats=args.repeats, warmup=3)
    rows = []
    shapes, make = (WGRAD_SHAPES, wgrad_variants) if args.pass_name == "wgrad" else (
        SHAPES, functools.partial(variants, ping_pongs=ping_pongs))
    for label, (G, M, N, K) in shapes.items():
        runs = make(G, M, N, K, args.stages, args.group_m, args.block_n)
        tflops = {name: [2.0 * M * N * K / ms / 1e9 for ms in samples]
                  for name, samples in interleaved_rounds(runs, timer, args.rounds).items()}
        rows += [{"label": label, "pass": name, "median_tflops": statistics.median(t), "max_tflops": max(t),
                  "min_tflops": min(t)} for name, t in tflops.items()]
    report(rows, f"blockwise FP8 {args.pass_name}, {args.rounds} interleaved rounds",
           ("label", "pass", "median_tflops", "max_tflops", "min_tflops"), args.csv)


if __name__ == "__main__":
    main()
