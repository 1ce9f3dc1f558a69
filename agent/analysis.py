"""ANALYZE: where each shape sits on the GPU's roofline, measured against the GPU's own ceilings."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.schema import Summary
from harness.shapes import Shape
from harness.stats import geomean
from harness.timing import Timer
from kernels.common.dtypes import dtype_from_name
from kernels.common.opspec import OpSpec, Problem

# H100 SXM datasheet dense bf16 FLOP/s over HBM3 bytes/s: the ridge used when nothing was measured.
NOMINAL_RIDGE = 989e12 / 3.35e12


FP8_FORMATS = ("e4m3", "e5m2")


def device_ceilings(device: torch.device) -> dict[str, float]:
    """What the vendor libraries reach on this GPU: bf16 and fp8 matmul rates (TFLOPS, 8192^3) and
    copy bandwidth (GB/s, read + write). Leads for the roofline, not the silicon's hard limits."""
    if device.type != "cuda":
        return {}
    timer = Timer(device, repeats=10, warmup=3)
    flops = 2 * 8192**3
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    ceilings = {"tflops": flops / (timer.time(lambda: a @ a).median_ms * 1e-3) / 1e12}
    a8 = a.to(torch.float8_e4m3fn)
    one = torch.ones((), device=device)
    try:
        fp8_ms = timer.time(lambda: torch._scaled_mm(a8, a8.t(), one, one, out_dtype=torch.bfloat16,
                                                     use_fast_accum=True)).median_ms
        ceilings["fp8_tflops"] = flops / (fp8_ms * 1e-3) / 1e12
    except RuntimeError:  # no fp8 matmul on this GPU
        pass
    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ceilings["gbps"] = 2 * src.numel() / (timer.time(lambda: dst.copy_(src)).median_ms * 1e-3) / 1e9
    return ceilings


@dataclass(frozen=True)
class ShapeAnalysis:
    label: str
    intensity: float  # forward FLOPs per byte
    bound: str  # "compute" or "memory"
    achieved_tflops: float
    roofline_tflops: float  # nan without measured ceilings

    @property
    def efficiency(self) -> float:
        return self.achieved_tflops / self.roofline_tflops if self.roofline_tflops > 0 else math.nan


def efficiency_geomean(analyses: Sequence[ShapeAnalysis]) -> float:
    """The forward rate as a fraction of its roofline, geomean over the shapes (nan without ceilings)."""
    return geomean(a.efficiency for a in analyses)


def analyze(
    spec: OpSpec, shapes: Sequence[Shape], summary: Summary, dtype: str, variant: str, ceilings: dict[str, float]
) -> list[ShapeAnalysis]:
    forward = summary.metric("forward")
    out = []
    for shape in shapes:
        dims = {**summary.frame.set_index("label").loc[shape.label, list(summary.schema.dims)].to_dict()}
        problem = Problem(dims=dims, dtype=dtype_from_name(dtype), device=torch.device("cpu"),
                          group_lens=shape.group_lens, variant=variant)
        # An FP8 forward (its output judged at an fp8 format, or a floor of its own such as e4m3-attention)
        # runs on the fp8 rate, the rest on bf16's.
        fmt = spec.snr_formats(problem)[spec.forward_outputs[0]]
        fp8 = fmt.split("-")[0] in FP8_FORMATS and "fp8_tflops" in ceilings
        peak = ceilings.get("fp8_tflops" if fp8 else "tflops")
        ridge = peak * 1e12 / (ceilings["gbps"] * 1e9) if ceilings else NOMINAL_RIDGE
        flops, nbytes = spec.flops(problem)[0], spec.bytes_moved(problem)[0]
        intensity = flops / nbytes
        roof = min(peak, intensity * ceilings["gbps"] / 1e3) if ceilings else math.nan
        # A GB/s schema (memory-bound ops) reports bytes a second: the same forward time as a FLOP rate.
        achieved = float(forward[shape.label]) * (intensity / 1e3 if summary.schema.counts_bytes else 1.0)
        out.append(ShapeAnalysis(shape.label, intensity, "compute" if intensity >= ridge else "memory",
                                 achieved, roof))
    return out


def describe(analyses: Sequence[ShapeAnalysis]) -> str:
    rows = ["| shape | FLOP/byte | bound | fwd TFLOPS | roofline | efficiency |", "|---|---|---|---|---|---|"]
    for a in analyses:
        rows.append(f"| {a.label} | {a.intensity:.0f} | {a.bound} | {a.achieved_tflops:.4g} | "
                    f"{a.roofline_tflops:.4g} | {a.efficiency:.0%} |" if a.roofline_tflops > 0 else
                    f"| {a.label} | {a.intensity:.0f} | {a.bound} | {a.achieved_tflops:.4g} | n/a | n/a |")
    return "\n".join(rows)
