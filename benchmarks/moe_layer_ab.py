"""A/B of the FP8 MoE layer's microbatch (8 a step, weights quantized once, wgrads into main_grads) under a
switch of its kernels: HEAD's behaviour against the one before, in one process, 7 shuffled rounds of 3, next to
our bf16 layer under HEAD's (ratios to it, and new / old).

    python benchmarks/moe_layer_ab.py epilogue-slices   # the wgrads' accumulating epilogue in 2 column slices, or 1
    python benchmarks/moe_layer_ab.py probs-from-rows   # probs' gradient from the dgrad's unweighted rows, or from y
    python benchmarks/moe_layer_ab.py flat-tiles        # the M-grouped kernel's tiles in one flattened loop, or nested
    python benchmarks/moe_layer_ab.py row-index         # the GEMMs read the tokens' rows through the expert order,
                                                        # or quantize_both writes the gathered rows
"""
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from moe_layer import LAYERS, layer_impls
from passes_report import with_switch

import kernels  # noqa: F401
import kernels.common.fp8 as fp8
import kernels.grouped_gemm.kernel as grouped_kernel
import kernels.moe.experts as experts
from harness.timing import Timer

# switch: (module, attribute, the behaviour before)
SWITCHES = {
    "epilogue-slices": (grouped_kernel, "epilogue_slices", lambda accumulate: 1),
    "probs-from-rows": (experts, "probs_grad_from_rows", lambda config: False),
    "flat-tiles": (grouped_kernel, "flat_tiles", lambda operand_bytes, K, output_bytes: False),
    "row-index": (fp8, "rows_read_through_index", lambda granularity, glu, source: False),
}


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in SWITCHES:
        sys.exit(f"moe_layer_ab.py: name one switch of {', '.join(SWITCHES)}")
    module, name, before = SWITCHES[sys.argv[1]]
    head = getattr(module, name)
    timer = Timer(torch.device("cuda"), repeats=3, warmup=2)
    for spec in LAYERS:
        impls, _ = layer_impls(spec, 8)
        by = {impl.name: impl for impl in impls}
        calls = {"bf16": with_switch(module, name, head, by["ours bf16"].step),
                 "fp8 new": with_switch(module, name, head, by["ours fp8"].step),
                 "fp8 old": with_switch(module, name, before, by["ours fp8"].step)}
        timed = timer.time_interleaved(calls, 7, 3, 0)
        setattr(module, name, head)
        medians = {key: rounds.medians() for key, rounds in timed.items()}
        for variant in ("fp8 new", "fp8 old"):
            ratios = [b / f for b, f in zip(medians["bf16"], medians[variant], strict=True)]
            print(f"{spec.label:24s} {variant} {statistics.median(medians[variant]) / 8:.3f} ms/microbatch vs bf16 "
                  f"{statistics.median(ratios):.3f}x [{min(ratios):.3f}, {max(ratios):.3f}]", flush=True)
        ratios = [o / n for o, n in zip(medians["fp8 old"], medians["fp8 new"], strict=True)]
        print(f"{spec.label:24s} new / old: {statistics.median(ratios):.3f}x [{min(ratios):.3f}, {max(ratios):.3f}]",
              flush=True)
        del impls, by, calls
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
