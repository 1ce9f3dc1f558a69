"""The OpSpec of gemm_fp8: one variant per FP8 format and granularity (e.g. hybrid-blockwise).

Inputs, reference (float64, from the unquantized inputs: the SNR includes the quantization error),
FLOPs and presets are gemm's. The runner times each pass with its quantization, as a training
step pays it. The torch._scaled_mm baselines quantize with our Triton kernels too, so the timed
difference is the GEMM; bf16 torch.matmul (cuBLAS) gives the step the FP8 step must beat.
"""

from __future__ import annotations

import torch

from kernels.common.fp8 import Granularity, quantize_rows
from kernels.common.opspec import GEMM_CLASS_FIELDS, OpSpec, Problem, Runner, Tensors, gemm_train_step
from kernels.gemm.spec import SPEC as GEMM_SPEC
from kernels.gemm.spec import flops, make_inputs, make_outputs, reference
from kernels.gemm_fp8 import for_backward, fp8_backward, fp8_forward, gemm_fp8
from kernels.grouped_gemm_fp8.spec import VARIANTS, config_of, snr_formats


def fp8_bytes_moved(problem: Problem) -> tuple[float, float]:
    """FP8 operands (1 byte) read once, high-precision results written once, per pass."""
    M, N, K = (problem.dims[d] for d in "MNK")
    size = torch.tensor([], dtype=problem.dtype).element_size()
    fwd = M * K + N * K + M * N * size
    dgrad = M * N + N * K + M * K * size
    wgrad = M * N + M * K + N * K * size
    return float(fwd), float(dgrad + wgrad)


def _forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    fp8_forward(inputs["a"], inputs["b"], True, config_of(problem.variant), outputs["out"])


def _backward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    # Timed on its own, the backward quantizes what a step's forward keeps for it (a along the tokens,
    # the weight for the dgrad) itself.
    cfg = config_of(problem.variant)
    saved = for_backward(inputs["a"], inputs["b"], True, cfg)
    fp8_backward(inputs["grad_out"], saved, True, cfg, outputs["da"], outputs["db"])


def train_step(problem: Problem, inputs: Tensors) -> Tensors:
    config = config_of(problem.variant)
    return gemm_train_step(lambda a, b: gemm_fp8(a, b, trans_b=True, config=config), inputs)


def _scaled_mm_forward(granularity: Granularity):
    """torch._scaled_mm (cuBLASLt) on operands quantized by our kernels, E4M3, fast accumulation."""

    def forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
        a_q, sa = quantize_rows(inputs["a"], torch.float8_e4m3fn, granularity)
        b_q, sb = quantize_rows(inputs["b"], torch.float8_e4m3fn, granularity)
        if granularity == Granularity.ROWWISE:
            sa, sb = sa[:, None], sb[None, :]
        else:
            sa, sb = sa.reshape(()), sb.reshape(())
        torch._scaled_mm(a_q, b_q.t(), scale_a=sa, scale_b=sb, out_dtype=outputs["out"].dtype,
                         use_fast_accum=True, out=outputs["out"])

    return forward


SPEC = OpSpec(
    name="gemm_fp8",
    description="FP8 dense GEMM (E4M3/E5M2/HYBRID; tensor-, row-, 128-blockwise) with fused quantization, fwd and bwd",
    mutable_files=(
        "kernels/gemm_fp8/kernel.py",
        "kernels/gemm_fp8/tuning.py",
        "kernels/gemm/kernel.py",
        "kernels/common/fp8.py",
        "kernels/common/blockwise_ws.py",
    ),
    shape_family="dense_gemm",
    **GEMM_CLASS_FIELDS,
    make_inputs=make_inputs,
    make_outputs=make_outputs,
    reference=reference,
    flops=flops,
    bytes_moved=fp8_bytes_moved,
    snr_formats=snr_formats,
    runner=Runner("turbo-opt", _forward, _backward),
    baselines=(
        Runner("torch._scaled_mm rowwise", _scaled_mm_forward(Granularity.ROWWISE), None, variants=("e4m3-rowwise",)),
        Runner("torch._scaled_mm tensorwise", _scaled_mm_forward(Granularity.TENSORWISE), None,
               variants=("e4m3-tensorwise",)),
        *GEMM_SPEC.baselines,
    ),
    variants=VARIANTS,
    default_preset="llama3-70b",
    train_step=train_step,
)
