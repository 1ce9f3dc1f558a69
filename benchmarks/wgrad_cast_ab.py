"""The rowwise FP8 wgrad casting the upstream gradient itself, against reading its transposed fp8 copy.

`kernels.grouped_gemm_fp8.WGRAD_CASTS_GRADIENT` picks how the backward feeds the wgrad the gradient: cast by
the warp-specialized kernel's own warps (kernels/grouped_gemm_fp8/wgrad_cast_ws.py; its quantization keeps
only the column amax: one read of the gradient fewer, no transposed copy written) or quantized into the
padded transposed layout first for the Triton var-K kernel. Per shape of a grouped_gemm preset, in
interleaved rounds (passes_report.interleaved_rounds): the wgrad alone with its gradient's quantization
(issue 15's per-pass figure) and the whole backward (dgrad and wgrad, the gradient quantized both ways),
each both ways, next to bf16 `torch._grouped_mm`'s var-K wgrad and its dgrad + wgrad; then each GEMM alone
on operands quantized once: the Triton kernel on the copy under the tuned table's config, the casting
kernel under each config of CONFIGS.

    python benchmarks/wgrad_cast_ab.py --shapes headline --rounds 7 --csv wgrad_cast_ab.csv
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from passes_report import add_common_arguments, interleaved_rounds, report, sweep_row

import kernels  # noqa: F401  (interpreter switch before triton loads)
import kernels.grouped_gemm_fp8 as fp8_op
from harness.shapes import load_shapes
from harness.timing import Timer
from kernels.common.fp8 import Float8Config, Format, Granularity, RowGroups, quantize_both
from kernels.common.opspec import Problem
from kernels.common.tiles import TileConfig
from kernels.grouped_gemm import group_offsets
from kernels.grouped_gemm.spec import make_inputs
from kernels.grouped_gemm_fp8 import for_backward, fp8_backward, wgrad_cast_ws
from kernels.grouped_gemm_fp8.kernel import vark_fp8

# (BLOCK_N, GROUP_M, num_stages) of the casting kernel's 128-row tiles, alone
CONFIGS = ((128, 8, 3), (128, 8, 4), (64, 8, 4), (128, 1, 4), (128, 16, 4))


def switched(casts: bool, run: Callable[[], object]) -> Callable[[], object]:
    """`run` with the backward's wgrad casting the gradient (or reading its copy) for the call."""
    def call() -> object:
        fp8_op.WGRAD_CASTS_GRADIENT = casts
        return run()
    return call


def rows_for_shape(label: str, inputs: dict[str, torch.Tensor], timer: Timer, rounds: int,
                   fmt: Format) -> list[dict[str, object]]:
    a, b, g, lens = inputs["a"], inputs["b"], inputs["grad_out"], inputs["group_lens"]
    M, K = a.shape
    N = b.shape[1]
    flops = 2.0 * M * N * K
    offs = group_offsets(lens)
    offs32 = torch.cumsum(lens, dim=0, dtype=torch.int32)
    da, db = torch.empty_like(a), torch.empty_like(b)
    cfg8 = Float8Config(fmt, Granularity.ROWWISE)
    saved = for_backward(a, b, offs, True, cfg8)
    assert wgrad_cast_ws.supported(g, saved.a_cols[0], db), "the casting kernel would not run here"
    calls = {
        "bf16 wgrad": lambda: torch._grouped_mm(g.t(), a, offs=offs32),
        "bf16 dgrad+wgrad": lambda: (torch._grouped_mm(g, b, offs=offs32), torch._grouped_mm(g.t(), a, offs=offs32)),
    }
    for casts in (False, True):
        how = "cast by the kernel" if casts else "transposed copy"
        calls[f"fp8 wgrad, {how}"] = switched(casts, lambda: fp8_backward(g, saved, offs, True, cfg8, None, db))
        calls[f"fp8 dgrad+wgrad, {how}"] = switched(casts, lambda: fp8_backward(g, saved, offs, True, cfg8, da, db))
    times = interleaved_rounds(calls, timer, rounds)
    fp8_op.WGRAD_CASTS_GRADIENT = True
    rows = []
    for name, ms in times.items():
        anchor = "bf16 dgrad+wgrad" if "dgrad" in name else "bf16 wgrad"
        ratios = [t_anchor / t for t_anchor, t in zip(times[anchor], ms, strict=True)]
        pass_flops = flops * (2 if "dgrad" in name else 1)
        rows.append({"label": label, "pass": name, "ours_ms": statistics.median(ms),
                     "ours_tflops": pass_flops / statistics.median(ms) / 1e9, "anchor": anchor,
                     "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)})
    # Each GEMM alone: the gradient quantized once (its copy, or its column amax), each config timed on its own.
    groups = RowGroups.tokens(offs, saved.layout)
    copy = quantize_both(g, cfg8.grad_dtype, Granularity.ROWWISE, groups, rows=False)
    amax = quantize_both(g, cfg8.grad_dtype, Granularity.ROWWISE, groups, rows=False, col_amax_only=True)
    row = sweep_row(timer, lambda: vark_fp8(copy.cols_t, saved.a_cols, copy.padded_offs, M, Granularity.ROWWISE, db),
                    label, "copy GEMM alone (tuned table)", flops)
    rows += [row] if row else []
    for block_n, group_m, stages in CONFIGS:
        cfg = TileConfig(128, block_n, 128, group_m, 8, stages)
        run = lambda c=cfg: wgrad_cast_ws.wgrad_cast_mm(  # noqa: E731
            g, amax.col_amax, *saved.a_cols, offs, amax.padded_offs, db, cfg8.grad_dtype, cfg=c)
        row = sweep_row(timer, run, label, f"cast GEMM alone 128x{block_n} g{group_m} s{stages}", flops)
        rows += [row] if row else []
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, "grouped_gemm", "headline")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--format", choices=[f.value for f in (Format.E4M3, Format.HYBRID)], default="e4m3")
    args = parser.parse_args()
    device = torch.device("cuda")
    timer = Timer(device, repeats=args.repeats, warmup=3)
    rows = []
    for shape in load_shapes("grouped_gemm", args.shapes):
        if args.only not in shape.label:
            continue
        problem = Problem(dims=shape.dims, dtype=torch.bfloat16, device=device, seed=0, group_lens=shape.group_lens)
        rows += rows_for_shape(shape.label, make_inputs(problem), timer, args.rounds, Format(args.format))
    report(rows, "wgrad casting the gradient in its loads",
           ("label", "pass", "ours_ms", "ours_tflops", "anchor", "ratio", "ratio_min", "ratio_max"), args.csv)


if __name__ == "__main__":
    main()
