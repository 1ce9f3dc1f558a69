"""ANALYZE: where each shape sits on the GPU's roofline, and which knob family to try first."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.schema import Summary
from harness.shapes import Shape
from harness.timing import Timer
from kernels.common.dtypes import dtype_from_name
from kernels.common.opspec import OpSpec, Problem

# H100 SXM datasheet dense bf16 FLOP/s over HBM3 bytes/s: the ridge used when nothing was measured.
NOMINAL_RIDGE = 989e12 / 3.35e12


def measure_ceilings(device: torch.device) -> dict[str, float]:
    """The GPU's bf16 matmul rate (TFLOPS) and copy bandwidth (GB/s, read + write), measured."""
    if device.type != "cuda":
        return {}
    timer = Timer(device, repeats=10, warmup=3)
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    tflops = 2 * 8192**3 / (timer.time(lambda: a @ a).median_ms * 1e-3) / 1e12
    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    gbps = 2 * src.numel() / (timer.time(lambda: dst.copy_(src)).median_ms * 1e-3) / 1e9
    return {"tflops": tflops, "gbps": gbps}


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


def analyze(
    spec: OpSpec, shapes: Sequence[Shape], summary: Summary, dtype: str, variant: str, ceilings: dict[str, float]
) -> list[ShapeAnalysis]:
    forward = summary.metric("forward")
    ridge = ceilings["tflops"] * 1e12 / (ceilings["gbps"] * 1e9) if ceilings else NOMINAL_RIDGE
    out = []
    for shape in shapes:
        dims = {**summary.frame.set_index("label").loc[shape.label, list(summary.schema.dims)].to_dict()}
        problem = Problem(dims=dims, dtype=dtype_from_name(dtype), device=torch.device("cpu"),
                          group_lens=shape.group_lens, variant=variant)
        flops, nbytes = spec.flops(problem)[0], spec.bytes_moved(problem)[0]
        intensity = flops / nbytes
        roof = min(ceilings["tflops"], intensity * ceilings["gbps"] / 1e3) if ceilings else math.nan
        out.append(ShapeAnalysis(shape.label, intensity, "compute" if intensity >= ridge else "memory",
                                 float(forward[shape.label]), roof))
    return out


def preferred_directions(analyses: Sequence[ShapeAnalysis]) -> list[str]:
    """Compute-bound shapes gain from bigger tiles and deeper pipelines first; memory-bound ones from
    launch order (L2 reuse) and tile shape."""
    compute = sum(a.bound == "compute" for a in analyses) >= len(analyses) / 2
    return ["tile", "pipeline", "warps", "launch-order"] if compute else ["launch-order", "tile", "warps", "pipeline"]


def describe(analyses: Sequence[ShapeAnalysis]) -> str:
    rows = ["| shape | FLOP/byte | bound | fwd TFLOPS | roofline | efficiency |", "|---|---|---|---|---|---|"]
    for a in analyses:
        rows.append(f"| {a.label} | {a.intensity:.0f} | {a.bound} | {a.achieved_tflops:.4g} | "
                    f"{a.roofline_tflops:.4g} | {a.efficiency:.0%} |" if a.roofline_tflops > 0 else
                    f"| {a.label} | {a.intensity:.0f} | {a.bound} | {a.achieved_tflops:.4g} | n/a | n/a |")
    return "\n".join(rows)
