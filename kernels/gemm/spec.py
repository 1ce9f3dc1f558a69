"""The OpSpec of gemm: a Linear layer's three GEMMs (forward NT, dgrad NN, wgrad TN), cuBLAS baseline."""

from __future__ import annotations

import torch

from kernels.common.dtypes import dtype_name
from kernels.common.opspec import GEMM_CLASS_FIELDS, OpSpec, Problem, Runner, Tensors, gemm_train_step
from kernels.gemm import gemm, gemm_backward, gemm_forward


def _mnk(problem: Problem) -> tuple[int, int, int]:
    dims = problem.dims
    if dims.get("B", 1) != 1:
        raise ValueError(f"gemm: B must be 1 for a dense GEMM, got B={dims['B']}")
    return dims["M"], dims["N"], dims["K"]


def make_inputs(problem: Problem) -> Tensors:
    """x [M, K], a Linear weight w [N, K] and grad_out [M, N], N(0, 1), seeded."""
    M, N, K = _mnk(problem)
    gen = torch.Generator(device=problem.device).manual_seed(problem.seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=problem.device, dtype=problem.dtype)

    return {"a": randn(M, K), "b": randn(N, K), "grad_out": randn(M, N)}


def make_outputs(problem: Problem, inputs: Tensors) -> Tensors:
    M, N, _ = _mnk(problem)
    return {
        "out": inputs["a"].new_empty(M, N),
        "da": torch.empty_like(inputs["a"]),
        "db": torch.empty_like(inputs["b"]),
    }


def reference(inputs: Tensors) -> Tensors:
    a, b, g = (inputs[k].double() for k in ("a", "b", "grad_out"))
    out, da = a @ b.t(), g @ b
    del b  # an lm_head weight in float64 is 8 GB: gone before db is made
    return {"out": out, "da": da, "db": g.t() @ a}


def flops(problem: Problem) -> tuple[float, float]:
    M, N, K = _mnk(problem)
    return 2.0 * M * N * K, 4.0 * M * N * K


def bytes_moved(problem: Problem) -> tuple[float, float]:
    """Each operand read once and each result written once, per pass."""
    M, N, K = _mnk(problem)
    size = torch.tensor([], dtype=problem.dtype).element_size()
    one_gemm = (M * K + N * K + M * N) * size
    return float(one_gemm), 2.0 * one_gemm


def snr_formats(problem: Problem) -> dict[str, str]:
    name = dtype_name(problem.dtype)
    return {"out": name, "da": name, "db": name}


def _forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    gemm_forward(inputs["a"], inputs["b"], trans_b=True, out=outputs["out"])


def _backward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    gemm_backward(
        inputs["grad_out"], inputs["a"], inputs["b"], trans_b=True,
        grad_a=outputs["da"], grad_b=outputs["db"],
    )


def train_step(problem: Problem, inputs: Tensors) -> Tensors:
    return gemm_train_step(lambda a, b: gemm(a, b, trans_b=True), inputs)


def _torch_forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    torch.matmul(inputs["a"], inputs["b"].t(), out=outputs["out"])


def _torch_backward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    # What autograd runs for a Linear layer's matmul: dgrad and wgrad, cuBLAS on the GPU.
    torch.matmul(inputs["grad_out"], inputs["b"], out=outputs["da"])
    torch.matmul(inputs["grad_out"].t(), inputs["a"], out=outputs["db"])


SPEC = OpSpec(
    name="gemm",
    description="bf16/fp16 GEMM with fp32 accumulation: Linear forward (NT), dgrad (NN), wgrad (TN)",
    mutable_files=("kernels/gemm/kernel.py", "kernels/gemm/tuning.py"),
    shape_family="dense_gemm",
    **GEMM_CLASS_FIELDS,
    make_inputs=make_inputs,
    make_outputs=make_outputs,
    reference=reference,
    flops=flops,
    bytes_moved=bytes_moved,
    snr_formats=snr_formats,
    runner=Runner("turbo-opt", _forward, _backward),
    baselines=(Runner("torch.matmul", _torch_forward, _torch_backward),),
    default_preset="llama3-8b",
    train_step=train_step,
)
