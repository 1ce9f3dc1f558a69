"""The OpSpec of grouped_gemm (bf16/fp16), and the grouped-GEMM problem pieces grouped_gemm_fp8 shares.

A problem is B groups (experts) with `group_lens` tokens each (skewed, possibly empty), N and K.
The inputs are the tokens a [sum, K], expert weights b [G, N, K] (trans_b, as nn.Linear stores
them) and grad_out [sum, N]; CSV rows report M as the mean tokens per group.
"""

from __future__ import annotations

import torch

from kernels.common.dtypes import dtype_name
from kernels.common.opspec import GEMM_CLASS_FIELDS, OpSpec, Problem, Runner, Tensors, gemm_train_step
from kernels.grouped_gemm import group_offsets, grouped_dgrad, grouped_forward, grouped_gemm, grouped_wgrad


def group_lens_of(problem: Problem) -> tuple[int, ...]:
    dims = problem.dims
    return problem.group_lens if problem.group_lens is not None else (dims["M"],) * dims["B"]


def make_inputs(problem: Problem) -> Tensors:
    lens = group_lens_of(problem)
    total, G, N, K = sum(lens), problem.dims["B"], problem.dims["N"], problem.dims["K"]
    gen = torch.Generator(device=problem.device).manual_seed(problem.seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=problem.device, dtype=problem.dtype)

    return {
        "a": randn(total, K),
        "b": randn(G, N, K),
        "grad_out": randn(total, N),
        "group_lens": torch.tensor(lens, dtype=torch.int64, device=problem.device),
        # Host copy for the per-expert loop baselines and the reference, made once outside timing.
        "group_lens_host": torch.tensor(lens, dtype=torch.int64),
    }


def make_outputs(problem: Problem, inputs: Tensors) -> Tensors:
    a, b = inputs["a"], inputs["b"]
    return {"out": a.new_empty(a.shape[0], b.shape[1]), "da": torch.empty_like(a), "db": torch.empty_like(b)}


def reference(inputs: Tensors) -> Tensors:
    a, b, g = (inputs[k].double() for k in ("a", "b", "grad_out"))
    splits = inputs["group_lens_host"].tolist()
    a_g, g_g = a.split(splits), g.split(splits)
    return {
        "out": torch.cat([x @ w.t() for x, w in zip(a_g, b, strict=True)]),
        "da": torch.cat([dy @ w for dy, w in zip(g_g, b, strict=True)]),
        "db": torch.stack([dy.t() @ x for dy, x in zip(g_g, a_g, strict=True)]),
    }


def flops(problem: Problem) -> tuple[float, float]:
    work = 2.0 * sum(group_lens_of(problem)) * problem.dims["N"] * problem.dims["K"]
    return work, 2.0 * work


def bytes_moved(problem: Problem, element_size: float | None = None) -> tuple[float, float]:
    """Each operand read once and each result written once per GEMM (fwd: 1 GEMM, bwd: 2)."""
    total, G, N, K = sum(group_lens_of(problem)), problem.dims["B"], problem.dims["N"], problem.dims["K"]
    size = element_size or torch.tensor([], dtype=problem.dtype).element_size()
    one_gemm = (total * K + G * N * K + total * N) * size
    return float(one_gemm), 2.0 * one_gemm


def snr_formats(problem: Problem) -> dict[str, str]:
    name = dtype_name(problem.dtype)
    return {"out": name, "da": name, "db": name}


def _forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    grouped_forward(inputs["a"], inputs["b"], group_offsets(inputs["group_lens"]), True, outputs["out"])


def _backward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    offs = group_offsets(inputs["group_lens"])
    grouped_dgrad(inputs["grad_out"], inputs["b"], offs, True, outputs["da"])
    grouped_wgrad(inputs["grad_out"], inputs["a"], offs, True, outputs["db"])


def train_step(problem: Problem, inputs: Tensors) -> Tensors:
    return gemm_train_step(lambda a, b: grouped_gemm(a, b, inputs["group_lens"]), inputs)


def _torch_offsets(inputs: Tensors) -> torch.Tensor:
    return torch.cumsum(inputs["group_lens"], dim=0, dtype=torch.int32)


def _grouped_mm_forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> Tensors:
    return {"out": torch._grouped_mm(inputs["a"], inputs["b"].transpose(-2, -1), offs=_torch_offsets(inputs))}


def _grouped_mm_backward(problem: Problem, inputs: Tensors, outputs: Tensors) -> Tensors:
    offs, g = _torch_offsets(inputs), inputs["grad_out"]
    return {
        "da": torch._grouped_mm(g, inputs["b"], offs=offs),
        "db": torch._grouped_mm(g.t(), inputs["a"], offs=offs),  # the variable-K form
    }


def _loop_forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    splits = inputs["group_lens_host"].tolist()
    for x, w, y in zip(inputs["a"].split(splits), inputs["b"], outputs["out"].split(splits), strict=True):
        torch.matmul(x, w.t(), out=y)


def _loop_backward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    splits = inputs["group_lens_host"].tolist()
    for x, w, dy, dx, dw in zip(
        inputs["a"].split(splits), inputs["b"], inputs["grad_out"].split(splits),
        outputs["da"].split(splits), outputs["db"], strict=True,
    ):
        torch.matmul(dy, w, out=dx)
        torch.matmul(dy.t(), x, out=dw)


GROUPED_MM_BASELINE = Runner("torch._grouped_mm", _grouped_mm_forward, _grouped_mm_backward)

SPEC = OpSpec(
    name="grouped_gemm",
    description="bf16/fp16 grouped GEMM for MoE experts: forward (NT), dgrad (NN), variable-K wgrad (TN)",
    mutable_files=("kernels/grouped_gemm/kernel.py", "kernels/grouped_gemm/tuning.py"),
    shape_family="grouped_gemm",
    **GEMM_CLASS_FIELDS,
    make_inputs=make_inputs,
    make_outputs=make_outputs,
    reference=reference,
    flops=flops,
    bytes_moved=bytes_moved,
    snr_formats=snr_formats,
    runner=Runner("turbo-opt", _forward, _backward),
    baselines=(GROUPED_MM_BASELINE, Runner("torch.matmul loop", _loop_forward, _loop_backward)),
    default_preset="headline",
    train_step=train_step,
)
