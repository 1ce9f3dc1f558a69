"""OpSpec: the one contract between a kernel family and everything that measures it.

The harness knows nothing about an op beyond its OpSpec: it builds inputs for a Problem, runs the
op's Runner (and any baseline Runner) into NaN-poisoned output buffers, compares every output with
the float64 reference by SNR, and times forward and backward separately.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Problem:
    """One concrete instance of an op: shape dims (named as in the op's CSV schema), dtype, device, seed."""

    dims: Mapping[str, int]
    dtype: torch.dtype
    device: torch.device
    seed: int = 0
    # Tokens per group for grouped ops (skewed splits, empty groups); None for dense ops.
    group_lens: tuple[int, ...] | None = None
    # One of the op's variants (e.g. an FP8 format and granularity); "default" for ops without any.
    variant: str = "default"


@dataclass(frozen=True)
class Runner:
    """A way to compute the op: ours, or a baseline timed under the same method.

    `forward(problem, inputs, outputs)` writes the forward outputs, `backward(...)` the gradients,
    into the preallocated buffers of `outputs` (so the harness can poison them first and the same
    buffers are reused while timing, without allocation in the timed region). A baseline whose
    library call cannot write into given buffers returns the tensors it made instead. A baseline
    without a backward (a forward-only library op) has `backward=None`; a baseline that applies to
    some variants only lists them.
    """

    name: str
    forward: Callable[[Problem, Tensors, Tensors], Tensors | None]
    backward: Callable[[Problem, Tensors, Tensors], Tensors | None] | None
    variants: tuple[str, ...] | None = None

    def supports(self, variant: str) -> bool:
        return self.variants is None or variant in self.variants


@dataclass(frozen=True)
class OpSpec:
    name: str
    description: str
    # Repo-relative files a campaign may change for this op; everything else is off limits.
    mutable_files: tuple[str, ...]
    # Name of the harness CSV schema (e.g. "gemm") and of the harness shape-preset family.
    schema: str
    shape_family: str
    dtypes: tuple[str, ...]
    # Outputs checked by SNR, in CSV order: forward ones first (e.g. out), then gradients (da, db).
    forward_outputs: tuple[str, ...]
    backward_outputs: tuple[str, ...]
    make_inputs: Callable[[Problem], Tensors]
    make_outputs: Callable[[Problem, Tensors], Tensors]
    reference: Callable[[Tensors], Tensors]
    # FLOPs and bytes moved (fwd, bwd) for a problem.
    flops: Callable[[Problem], tuple[float, float]]
    bytes_moved: Callable[[Problem], tuple[float, float]]
    # The SNR format of each output for a problem ("bf16", "e4m3", ...): thresholds live in rules/.
    snr_formats: Callable[[Problem], dict[str, str]]
    runner: Runner
    baselines: tuple[Runner, ...] = field(default_factory=tuple)
    # Variants a benchmark can pick (the first is the default), e.g. "e4m3-rowwise".
    variants: tuple[str, ...] = ("default",)
    # The preset a campaign on a GPU uses when none is named ("smoke" under the interpreter).
    default_preset: str = "smoke"
    # One training step through the op's public autograd API, as a model calls it: leaf copies of the
    # float inputs, the op, a backward that hands the op grad_out; returns every output of `outputs` by name.
    train_step: Callable[[Problem, Tensors], Tensors] | None = None
    # Whether the op promises fp32 accumulation (the harness then probes sums past fp16's range).
    fp32_accumulation: bool = False

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.forward_outputs + self.backward_outputs


# What every GEMM-class op (dense and grouped, bf16 and FP8) shares: the "gemm" CSV schema, its
# input dtypes, the outputs checked by SNR, and fp32 accumulation.
GEMM_CLASS_FIELDS: dict[str, object] = {
    "schema": "gemm",
    "dtypes": ("bf16", "fp16"),
    "forward_outputs": ("out",),
    "backward_outputs": ("da", "db"),
    "fp32_accumulation": True,
}


def gemm_train_step(op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], inputs: Tensors) -> Tensors:
    """A GEMM-class op's training step: `out = op(a, b)` on leaf copies of a and b, then the backward of a
    scalar loss whose gradient with respect to out is exactly grad_out (`sum(out * grad_out)`, as a model's
    loss.backward() runs); returns out, da and db (the leaves' gradients). `out.backward(grad_out)` would
    hand the op the same gradient, but a tensor gradient makes PyTorch import its symbolic-shape machinery
    (sympy: ~3 s of every benchmark process on the H100 machine, measured), which no kernel needs."""
    a, b = (inputs[name].detach().clone().requires_grad_() for name in ("a", "b"))
    out = op(a, b)
    (out * inputs["grad_out"]).sum().backward()
    return {"out": out.detach(), "da": a.grad, "db": b.grad}
