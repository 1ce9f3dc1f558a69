"""Dense GEMM passes next to their vendor anchors on one GPU, with the harness's timer; and a sweep
of the TMA kernel's tile configs.

`turbo-opt bench` times whole steps with quantization; this splits them: bf16 forward (NT), dgrad
(NN) and wgrad (TN) vs torch.matmul (cuBLAS), and the FP8 forward GEMM alone on operands quantized
once vs torch._scaled_mm of the same scaling (blockwise: vs the bf16 cuBLAS forward), then each
blockwise pass with its quantization.

    python benchmarks/dense_passes.py --shapes llama3 --csv passes.csv
    python benchmarks/dense_passes.py --shapes square --sweep bf16 --csv sweep.csv
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable

import torch
from passes_report import add_common_arguments, report, sweep_row

import kernels  # noqa: F401  (interpreter switch before triton loads)
from harness.shapes import load_shapes
from harness.timing import Timer
from kernels.common.fp8 import Float8Config, Format, Granularity
from kernels.common.scales import Scales
from kernels.common.tiles import TileConfig
from kernels.gemm import gemm_backward, gemm_forward
from kernels.gemm.kernel import launch_tma
from kernels.gemm_fp8 import for_backward, fp8_backward, fp8_forward, quantize
from kernels.gemm_fp8.kernel import fp8_rows_times_weight, weight_operand
from kernels.grouped_gemm_fp8.kernel import row_scale_strides

E4M3 = torch.float8_e4m3fn


def fp8_operands(a: torch.Tensor, b: torch.Tensor, gran: Granularity):
    """a and the weight b [N, K] quantized once, E4M3, in the layouts the forward reads."""
    return quantize(a, E4M3, gran), quantize(b, E4M3, gran, weight=True)


def scaled_mm(a8, b8, out: torch.Tensor) -> Callable[[], object]:
    """torch._scaled_mm on the same FP8 operands (tensorwise or rowwise)."""
    if a8.granularity == Granularity.ROWWISE:
        sa, sb = a8.scale[:, None], b8.scale[None, :]
    else:
        sa, sb = a8.scale.reshape(()), b8.scale.reshape(())
    return lambda: torch._scaled_mm(a8.data, b8.data.t(), scale_a=sa, scale_b=sb, out_dtype=out.dtype,
                                    use_fast_accum=True, out=out)


def passes(label: str, a: torch.Tensor, b: torch.Tensor, g: torch.Tensor, timer: Timer) -> list[dict]:
    M, K = a.shape
    N = b.shape[0]
    flops = 2.0 * M * N * K
    out, da, db = a.new_empty(M, N), torch.empty_like(a), torch.empty_like(b)
    rows = []

    def compare(what: str, ours: Callable[[], object], theirs: Callable[[], object], anchor: str) -> None:
        t_ours, t_theirs = timer.time(ours).median_ms, timer.time(theirs).median_ms
        rows.append({"label": label, "pass": what, "ours_ms": t_ours, "ours_tflops": flops / t_ours / 1e9,
                     "anchor": anchor, "anchor_tflops": flops / t_theirs / 1e9, "ratio": t_theirs / t_ours})

    compare("bf16 fwd", lambda: gemm_forward(a, b, trans_b=True, out=out),
            lambda: torch.matmul(a, b.t(), out=out), "torch.matmul")
    compare("bf16 dgrad", lambda: gemm_backward(g, a, b, trans_b=True, grad_a=da, need_grad_b=False),
            lambda: torch.matmul(g, b, out=da), "torch.matmul")
    compare("bf16 wgrad", lambda: gemm_backward(g, a, b, trans_b=True, grad_b=db, need_grad_a=False),
            lambda: torch.matmul(g.t(), a, out=db), "torch.matmul")
    for gran in Granularity:
        a8, b8 = fp8_operands(a, b, gran)
        weight = weight_operand(b8, reduce_over_n=False)
        ours = lambda a8=a8, w=weight: fp8_rows_times_weight("fwd", a8, w, out)  # noqa: E731
        if gran == Granularity.BLOCKWISE:
            compare("fp8 blockwise fwd (GEMM)", ours, lambda: torch.matmul(a, b.t(), out=out), "bf16 torch.matmul")
        else:
            compare(f"fp8 {gran.value} fwd (GEMM)", ours, scaled_mm(a8, b8, out), f"torch._scaled_mm {gran.value}")
    # Each blockwise pass with the quantization of what it reads and the forward does not keep for it.
    config = Float8Config(Format.E4M3, Granularity.BLOCKWISE)
    saved = for_backward(a, b, True, config)
    for what, run in (("fwd", lambda: fp8_forward(a, b, True, config, out)),
                      ("dgrad", lambda: fp8_backward(g, saved, True, config, da, None)),
                      ("wgrad", lambda: fp8_backward(g, saved, True, config, None, db))):
        ms = timer.time(run).median_ms
        rows.append({"label": label, "pass": f"fp8 blockwise {what} (with quant)", "ours_ms": ms,
                     "ours_tflops": flops / ms / 1e9})
    return rows


BF16_SWEEP = [TileConfig(bm, bn, bk, 8, w, s) for bm, bn, bk, w, s in
              [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4),
               (128, 128, 64, 8, 5), (256, 128, 64, 8, 3), (128, 256, 32, 8, 5), (128, 128, 128, 8, 3)]]
FP8_SWEEP = [TileConfig(bm, bn, 128, 8, w, s) for bm, bn, w, s in
             [(128, 256, 8, 3), (128, 256, 8, 4), (128, 128, 8, 4), (128, 128, 8, 5), (128, 128, 4, 4),
              (256, 128, 8, 3), (64, 256, 4, 4), (64, 128, 4, 3)]]


def sweep(label: str, kind: str, a: torch.Tensor, b: torch.Tensor, timer: Timer) -> list[dict]:
    """The forward under each config of the kind's sweep, with the tile loop flattened into the K loop and not."""
    M, K = a.shape
    N = b.shape[0]
    out = a.new_empty(M, N)
    if kind == "bf16":
        configs, launch = BF16_SWEEP, lambda cfg, flat: launch_tma(a, b.t(), out, cfg, flatten=flat)
    else:
        gran = Granularity(kind)
        a8, b8 = fp8_operands(a, b, gran)
        w = weight_operand(b8, reduce_over_n=False)
        scales = Scales(a8.scale, row_scale_strides(a8.scale, gran), w.scale, w.strides, w.out_div,
                        per_k_block=gran == Granularity.BLOCKWISE)
        configs = FP8_SWEEP
        launch = lambda cfg, flat: launch_tma(a8.data, w.data[0].t(), out, cfg, scales, flat)  # noqa: E731
    rows = []
    for cfg, flat in itertools.product(configs, (True, False)):
        name = (f"sweep {kind} {cfg.BLOCK_M}x{cfg.BLOCK_N}x{cfg.BLOCK_K} w{cfg.num_warps} s{cfg.num_stages} "
                f"{'flat' if flat else 'nested'}")
        row = sweep_row(timer, lambda c=cfg, f=flat: launch(c, f), label, name, 2.0 * M * N * K)
        rows += [row] if row else []
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, "dense_gemm", "llama3")
    parser.add_argument("--sweep", choices=["bf16", *(g.value for g in Granularity)], default=None,
                        help="instead of the passes, sweep the forward's tile configs")
    args = parser.parse_args()
    device = torch.device("cuda")
    timer = Timer(device, repeats=args.repeats, warmup=3)
    rows = []
    for shape in load_shapes("dense_gemm", args.shapes):
        if args.only not in shape.label:
            continue
        M, N, K = (shape.dims[d] for d in "MNK")
        gen = torch.Generator(device=device).manual_seed(0)
        a, b, g = (torch.randn(s, generator=gen, device=device, dtype=torch.bfloat16) for s in ((M, K), (N, K), (M, N)))
        rows += sweep(shape.label, args.sweep, a, b, timer) if args.sweep else passes(shape.label, a, b, g, timer)
    report(rows, "dense passes", ("label", "pass", "ours_ms", "ours_tflops", "anchor", "anchor_tflops", "ratio"),
           args.csv)

if __name__ == "__main__":
    main()
