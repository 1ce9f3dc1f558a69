"""Per-pass timing of the grouped GEMMs next to torch, on one GPU, with the harness's timer.

`turbo-opt bench` times a whole forward and a whole backward; this splits them so each pass meets
its own anchor: bf16 forward vs torch._grouped_mm, dgrad vs its NN form, wgrad vs its variable-K
form; each FP8 pass with the quantization of what it reads vs the same bf16 anchor (issue 15's
per-pass target), the FP8 GEMM alone on pre-quantized operands vs torch._scaled_grouped_mm
(rowwise); and each FP8 quantization call in GB/s (bytes read + written; the harness's timer, so its
host time shows where it exceeds the kernels'). Passes and anchors are timed in interleaved rounds
(`--rounds`): a ratio is the median of its per-round ratios, its spread the min and max.

    python benchmarks/grouped_passes.py --shapes headline --csv passes.csv
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from passes_report import add_common_arguments, interleaved_rounds, report, sweep_row

import kernels  # noqa: F401  (interpreter switch before triton loads)
from harness.shapes import load_shapes
from harness.timing import Timer
from kernels.common.fp8 import (
    Float8Config,
    Format,
    Granularity,
    RowGroups,
    quantize_both,
    quantize_cols_t,
    quantize_rows,
)
from kernels.common.opspec import Problem
from kernels.common.scales import Scales
from kernels.common.tiles import TileConfig
from kernels.grouped_gemm import group_offsets, grouped_dgrad, grouped_forward, grouped_wgrad
from kernels.grouped_gemm.kernel import grouped_mm
from kernels.grouped_gemm.spec import make_inputs
from kernels.grouped_gemm_fp8 import for_backward, fp8_backward, fp8_forward, prequantize_weight
from kernels.grouped_gemm_fp8.kernel import QuantizedWeight, config_for, row_scale_strides, vark_fp8


def rows_for_shape(label: str, inputs: dict[str, torch.Tensor], timer: Timer, rounds: int) -> list[dict[str, object]]:
    """Every pass of one shape and its anchor, timed in `rounds` interleaved rounds (each round times each
    callable once, in an order of its own, so the passes and their anchors see the same GPU state and no place
    in the round; passes_report.interleaved_rounds); a pass's ratio is the median
    of its per-round ratios, with their spread. FP8 passes are held to the bf16 pass's torch anchor (the
    forward to `torch._grouped_mm`, and so on): issue 15's per-pass target."""
    a, b, g, lens = inputs["a"], inputs["b"], inputs["grad_out"], inputs["group_lens"]
    M, K = a.shape
    G, N, _ = b.shape
    gemm_flops = 2.0 * M * N * K
    offs = group_offsets(lens)
    offs32 = torch.cumsum(lens, dim=0, dtype=torch.int32)
    out, da, db = a.new_empty(M, N), torch.empty_like(a), torch.empty_like(b)

    e4m3 = torch.float8_e4m3fn
    a_q, sa = quantize_rows(a, e4m3, Granularity.ROWWISE)
    w = QuantizedWeight.quantize(b, False, e4m3, Granularity.ROWWISE)
    scales = Scales(sa, row_scale_strides(sa, Granularity.ROWWISE), w.scale, w.strides)
    cfg = config_for("fwd", M, G, Granularity.ROWWISE, w.data.shape[1:])
    sb = w.scale.view(G, N)
    anchors: dict[str, Callable[[], object]] = {
        "torch._grouped_mm": lambda: torch._grouped_mm(a, b.transpose(-2, -1), offs=offs32),
        "torch._grouped_mm dgrad": lambda: torch._grouped_mm(g, b, offs=offs32),
        "torch._grouped_mm var-K": lambda: torch._grouped_mm(g.t(), a, offs=offs32),
        "torch._scaled_grouped_mm": lambda: torch._scaled_grouped_mm(
            a_q, w.data.transpose(-2, -1), sa, sb, offs=offs32, out_dtype=a.dtype, use_fast_accum=True),
    }
    anchor_of = {"fwd": "torch._grouped_mm", "dgrad": "torch._grouped_mm dgrad", "wgrad": "torch._grouped_mm var-K"}
    # (pass, ours, its anchor)
    passes: list[tuple[str, Callable[[], object], str]] = [
        ("bf16 fwd", lambda: grouped_forward(a, b, offs, True, out), anchor_of["fwd"]),
        ("bf16 dgrad", lambda: grouped_dgrad(g, b, offs, True, da), anchor_of["dgrad"]),
        ("bf16 wgrad", lambda: grouped_wgrad(g, a, offs, True, db), anchor_of["wgrad"]),
        ("fp8 rowwise GEMM only", lambda: grouped_mm(a_q, w.data, offs, out, cfg, scales), "torch._scaled_grouped_mm"),
    ]
    for gran in Granularity:  # each pass with the quantization of what it reads and the forward does not keep
        cfg8 = Float8Config(Format.HYBRID, gran)
        saved = for_backward(a, b, offs, True, cfg8)
        w8 = prequantize_weight(b, True, cfg8)  # gradient accumulation: the weight quantized once per optimizer step
        passes += [
            (f"fp8 {gran.value} fwd (with quant)",
             lambda c=cfg8: fp8_forward(a, b, offs, True, c, out), anchor_of["fwd"]),
            (f"fp8 {gran.value} fwd (tokens' quant; weight prequantized)",
             lambda c=cfg8, w8=w8: fp8_forward(a, b, offs, True, c, out, b_fp8=w8), anchor_of["fwd"]),
            (f"fp8 {gran.value} dgrad (with quant)",
             lambda c=cfg8, s=saved: fp8_backward(g, s, offs, True, c, da, None), anchor_of["dgrad"]),
            (f"fp8 {gran.value} wgrad (with quant)",
             lambda c=cfg8, s=saved: fp8_backward(g, s, offs, True, c, None, db), anchor_of["wgrad"]),
        ]
    elt = a.element_size()
    # (call, bytes read + written: a rowwise row and a 128x128 block are read once, a rowwise column twice)
    bandwidths: list[tuple[str, Callable[[], object], float]] = [
        ("quantize_rows(a) rowwise", lambda: quantize_rows(a, e4m3, Granularity.ROWWISE), M * K * (elt + 1)),
        ("quantize_cols_t(grad_out) rowwise", lambda: quantize_cols_t(g, offs, e4m3, Granularity.ROWWISE),
         M * N * (2 * elt + 1)),
        ("quantize_both(grad_out) rowwise",
         lambda: quantize_both(g, e4m3, Granularity.ROWWISE, RowGroups.tokens(offs)), M * N * (2 * elt + 2)),
        ("quantize_both(grad_out) blockwise",
         lambda: quantize_both(g, e4m3, Granularity.BLOCKWISE, RowGroups.tokens(offs)), M * N * (elt + 2)),
        ("quantize_cols_t(a) blockwise",
         lambda: quantize_cols_t(a, offs, e4m3, Granularity.BLOCKWISE), M * K * (elt + 1)),
        ("QuantizedWeight(b) blockwise", lambda: QuantizedWeight.quantize(b, False, e4m3, Granularity.BLOCKWISE),
         G * N * K * (elt + 1)),
    ]
    calls = {**anchors, **{name: fn for name, fn, _ in passes}, **{name: fn for name, fn, _ in bandwidths}}
    times = interleaved_rounds(calls, timer, rounds)
    rows: list[dict[str, object]] = []
    for name, _, anchor in passes:
        ratios = [t_anchor / t for t_anchor, t in zip(times[anchor], times[name], strict=True)]
        ours_ms, anchor_ms = statistics.median(times[name]), statistics.median(times[anchor])
        rows.append({
            "label": label, "pass": name, "ours_ms": ours_ms, "ours_tflops": gemm_flops / ours_ms / 1e9,
            "anchor": anchor, "anchor_ms": anchor_ms, "anchor_tflops": gemm_flops / anchor_ms / 1e9,
            "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        })
    for name, _, nbytes in bandwidths:
        ms = statistics.median(times[name])
        rows.append({"label": label, "pass": name, "ours_ms": ms, "ours_GBps": nbytes / ms / 1e6})
    return rows


SWEEP_CONFIGS = (
    (128, 256, 8, 3), (128, 128, 8, 3), (128, 128, 8, 4), (128, 128, 8, 5), (64, 256, 8, 3), (64, 256, 8, 4),
    (256, 128, 8, 3), (64, 128, 4, 4), (128, 256, 8, 4),
)


def sweep_forward(label: str, inputs: dict[str, torch.Tensor], granularity: Granularity, timer: Timer) -> list[dict]:
    """The FP8 forward GEMM alone (operands quantized once) under each tile config of SWEEP_CONFIGS."""

    a, b, lens = inputs["a"], inputs["b"], inputs["group_lens"]
    M, K = a.shape
    N = b.shape[1]
    offs = group_offsets(lens)
    a_q, sa = quantize_rows(a, torch.float8_e4m3fn, granularity)
    w = QuantizedWeight.quantize(b, False, torch.float8_e4m3fn, granularity)
    blockwise = granularity == Granularity.BLOCKWISE
    scales = Scales(sa, row_scale_strides(sa, granularity), w.scale, w.strides, w.out_div, per_k_block=blockwise)
    out = a.new_empty(M, N)
    rows = []
    for bm, bn, warps, stages in SWEEP_CONFIGS:
        cfg = TileConfig(bm, bn, 128, 8, warps, stages)
        row = sweep_row(timer, lambda c=cfg: grouped_mm(a_q, w.data, offs, out, c, scales), label,
                        f"sweep fp8 {granularity.value} {bm}x{bn} w{warps} s{stages}", 2.0 * M * N * K)
        rows += [row] if row else []
    return rows


WGRAD_SWEEP_CONFIGS = (
    (128, 256, 8, 3), (128, 128, 8, 3), (128, 128, 8, 4), (128, 128, 4, 2), (128, 128, 4, 3), (128, 128, 4, 4),
    (64, 128, 4, 4), (128, 64, 4, 4), (64, 256, 4, 3),
)


def sweep_wgrad(label: str, inputs: dict[str, torch.Tensor], granularity: Granularity, timer: Timer) -> list[dict]:
    """The FP8 var-K wgrad alone (operands quantized once) under each config of WGRAD_SWEEP_CONFIGS, writing
    a fresh gradient (one microbatch per optimizer step) and adding into a bf16 main_grad (gradient
    accumulation: the output tile is read too)."""
    a, b, g, lens = inputs["a"], inputs["b"], inputs["grad_out"], inputs["group_lens"]
    M, K = a.shape
    N = b.shape[1]
    groups = RowGroups.tokens(group_offsets(lens))
    e4m3 = torch.float8_e4m3fn
    qg = quantize_both(g, e4m3, granularity, groups, rows=False)
    qa = quantize_both(a, e4m3, granularity, groups, rows=False)
    grad = torch.zeros_like(b)
    rows = []
    for bm, bn, warps, stages in WGRAD_SWEEP_CONFIGS:
        for accumulate in (False, True):
            # blockwise on the warp-specialized kernel where it takes the config, as the table's buckets (WS 1)
            cfg = TileConfig(bm, bn, 128, 8, warps, stages, WS=int(granularity == Granularity.BLOCKWISE))
            run = lambda c=cfg, acc=accumulate: vark_fp8(  # noqa: E731
                qg.cols_t, qa.cols_t, qg.padded_offs, M, granularity, grad, accumulate=acc, cfg=c)
            name = f"sweep wgrad{'+=' if accumulate else ''} {granularity.value} {bm}x{bn} w{warps} s{stages}"
            row = sweep_row(timer, run, label, name, 2.0 * M * N * K)
            rows += [row] if row else []
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, "grouped_gemm", "headline")
    parser.add_argument("--sweep", choices=[g.value for g in Granularity], default=None,
                        help="instead of the passes, sweep the FP8 forward's tile configs for this granularity")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds of the passes and their anchors; ratios are per-round medians")
    parser.add_argument("--sweep-pass", choices=("fwd", "wgrad"), default="fwd",
                        help="the pass --sweep times (wgrad: fresh, then adding into a bf16 main_grad)")
    args = parser.parse_args()
    device = torch.device("cuda")
    timer = Timer(device, repeats=args.repeats, warmup=3)
    rows = []
    for shape in load_shapes("grouped_gemm", args.shapes):
        if args.only not in shape.label:
            continue
        problem = Problem(dims=shape.dims, dtype=torch.bfloat16, device=device, seed=0, group_lens=shape.group_lens)
        inputs = make_inputs(problem)
        if args.sweep:
            sweep = sweep_wgrad if args.sweep_pass == "wgrad" else sweep_forward
            rows += sweep(shape.label, inputs, Granularity(args.sweep), timer)
        else:
            rows += rows_for_shape(shape.label, inputs, timer, args.rounds)
    report(rows, "grouped passes",
           ("label", "pass", "ours_ms", "ours_tflops", "anchor", "anchor_tflops", "ratio", "ratio_min", "ratio_max",
            "ours_GBps"), args.csv)

if __name__ == "__main__":
    main()
