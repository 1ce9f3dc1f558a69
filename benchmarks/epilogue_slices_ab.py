"""A/B of the grouped kernels' epilogue in 1, 2 or 4 column slices (kernels/grouped_gemm/kernel.py's
`epilogue_slices`, set per call), in interleaved rounds of shuffled order, each variant's output checked against
one slice's (equal but for fp32 contraction: within 1% of the largest value).

    python benchmarks/epilogue_slices_ab.py   # the FP8 wgrads alone: fresh and adding into a main_grad

The MoE layer's A/B of the same switch: benchmarks/moe_layer_ab.py epilogue-slices.
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
from kernels.common.fp8 import Granularity, RowGroups, quantize_both
from kernels.gemm_fp8.kernel import fp8_token_reduction
from kernels.grouped_gemm import group_offsets
from kernels.grouped_gemm_fp8.kernel import vark_fp8

E4M3 = torch.float8_e4m3fn
timer = Timer(torch.device("cuda"), repeats=10, warmup=3)


def check_close(label, got, want, n, acc):
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item()
    assert err <= 1e-2 * scale, (label, n, acc, err, scale)


def report(label, timed, flops):
    med = {k: v.medians() for k, v in timed.items()}
    for mode in ("+=", "fresh"):
        base = med[f"{mode} 1"]
        for n in (2, 4):
            r = [b / x for b, x in zip(base, med[f"{mode} {n}"], strict=True)]
            print(f"{label:34s} {mode:5s} slices {n} vs 1: {statistics.median(r):.3f}x [{min(r):.3f}, {max(r):.3f}]  "
                  f"({flops / statistics.median(med[f'{mode} {n}']) / 1e9:.0f} vs "
                  f"{flops / statistics.median(base) / 1e9:.0f} TFLOPS)", flush=True)


def wgrad_case(label, lens, N, K, main_dtype=torch.bfloat16, dense=False):
    """The FP8 rowwise wgrad of `lens` token groups (dense: one group, as gemm_fp8's wgrad runs it) into a
    [G, N, K] (dense: [N, K]) gradient, fresh and adding into it, under 1, 2 and 4 slices."""
    M = sum(lens)
    offs = group_offsets(torch.tensor(lens, device="cuda"))
    groups = RowGroups.tokens(offs)
    qg, qa = (quantize_both(torch.randn(M, width, device="cuda", dtype=torch.bfloat16), E4M3, Granularity.ROWWISE,
                            groups, rows=False) for width in (N, K))

    def wgrad(out, accumulate):
        if dense:
            fp8_token_reduction(qg.cols_t, qa.cols_t, Granularity.ROWWISE, out, accumulate=accumulate)
        else:
            vark_fp8(qg.cols_t, qa.cols_t, qg.padded_offs, M, Granularity.ROWWISE, out, accumulate=accumulate)

    shape = (N, K) if dense else (len(lens), N, K)
    outs = {(n, acc): torch.full(shape, 0.5, device="cuda", dtype=main_dtype)
            for n in (1, 2, 4) for acc in (True, False)}
    calls = {f"{'+=' if acc else 'fresh'} {n}": with_switch(gk, "epilogue_slices", lambda accumulate, n=n: n,
                                                             lambda o=out, ac=acc: wgrad(o, ac))
             for (n, acc), out in outs.items()}
    for call in calls.values():  # each variant once from the same start, then against one slice's
        call()
    for (n, acc), out in outs.items():
        check_close(label, out, outs[(1, acc)], n, acc)
    timed = timer.time_interleaved(calls, 7, 10, 0)
    report(label, timed, 2.0 * M * N * K)
    gk.epilogue_slices = NEW


NEW = gk.epilogue_slices  # HEAD's rule, restored after each case

if __name__ == "__main__":
    sonic = split_tokens(262144, 128, "topk", 0)
    wgrad_case("sonicmoe gateup 128 x 2048 topk", sonic, 1024, 4096)
    wgrad_case("sonicmoe down 128 x 2048 topk", sonic, 4096, 512)
    wgrad_case("dsv3 gateup 32 x 1024 topk", split_tokens(32768, 32, "topk", 1), 4096, 7168)
    wgrad_case("dsv3 down 8 x 4096 hot", split_tokens(32768, 8, "hot", 0), 7168, 2048)
    wgrad_case("qwen3 gateup 16 x 2048 topk", split_tokens(32768, 16, "topk", 2), 3072, 4096)
    wgrad_case("qwen3 down 16 x 2048 fp32 main_grad", split_tokens(32768, 16, "topk", 2), 4096, 1536, torch.float32)
    wgrad_case("llama3-8b gate_up t8192 (dense wgrad)", [8192], 28672, 4096, dense=True)
    wgrad_case("llama3-70b down t8192 (dense wgrad)", [8192], 8192, 28672, dense=True)
