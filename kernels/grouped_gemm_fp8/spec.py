"""The OpSpec of grouped_gemm_fp8: one variant per FP8 format and granularity (e.g. hybrid-blockwise).

Inputs, reference (float64, from the unquantized inputs: the SNR includes the quantization error),
FLOPs and presets are grouped_gemm's. The scaled baselines quantize with our Triton kernels, so the
timed difference between them and us is the GEMM alone; bf16 torch._grouped_mm shows the step
against bf16.
"""

from __future__ import annotations

import itertools

import torch

from kernels.common.fp8 import Float8Config, Format, Granularity, quantize_rows
from kernels.common.opspec import GEMM_CLASS_FIELDS, OpSpec, Problem, Runner, Tensors, gemm_train_step
from kernels.grouped_gemm import group_offsets
from kernels.grouped_gemm.spec import GROUPED_MM_BASELINE, bytes_moved, flops, make_inputs, make_outputs, reference
from kernels.grouped_gemm_fp8 import for_backward, fp8_backward, fp8_forward, grouped_gemm_fp8

GRANULARITIES = (Granularity.ROWWISE, Granularity.TENSORWISE, Granularity.BLOCKWISE)
# Each variant's config, built once: the runners are timed, and building one a call cost ~10 us of host.
_CONFIGS = {f"{fmt.value}-{gran.value}": Float8Config(fmt, gran)
            for fmt, gran in itertools.product(Format, GRANULARITIES)}
VARIANTS = tuple(_CONFIGS)


def config_of(variant: str) -> Float8Config:
    return _CONFIGS[variant]


def snr_formats(problem: Problem) -> dict[str, str]:
    cfg = config_of(problem.variant)
    return {"out": cfg.forward_format, "da": cfg.grad_format, "db": cfg.grad_format}


def fp8_bytes_moved(problem: Problem) -> tuple[float, float]:
    return bytes_moved(problem, element_size=1.0)


def _forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    offs = group_offsets(inputs["group_lens"])
    fp8_forward(inputs["a"], inputs["b"], offs, True, config_of(problem.variant), outputs["out"])


def _backward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    # Timed on its own, the backward quantizes what a step's forward keeps for it (the tokens along
    # each group, the weight for the dgrad) itself: a little more than a step's backward pays.
    offs, cfg = group_offsets(inputs["group_lens"]), config_of(problem.variant)
    saved = for_backward(inputs["a"], inputs["b"], offs, True, cfg)
    fp8_backward(inputs["grad_out"], saved, offs, True, cfg, outputs["da"], outputs["db"])


def train_step(problem: Problem, inputs: Tensors) -> Tensors:
    config = config_of(problem.variant)
    return gemm_train_step(lambda a, b: grouped_gemm_fp8(a, b, inputs["group_lens"], config=config), inputs)


def _rowwise_operands(inputs: Tensors) -> tuple[torch.Tensor, ...]:
    a, b = inputs["a"], inputs["b"]
    G, N, K = b.shape
    a_q, sa = quantize_rows(a, torch.float8_e4m3fn, Granularity.ROWWISE)
    b_q, sb = quantize_rows(b.reshape(G * N, K), torch.float8_e4m3fn, Granularity.ROWWISE)
    return a_q, sa, b_q.view(G, N, K), sb.view(G, N)


def _scaled_grouped_mm_forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> Tensors:
    a_q, sa, b_q, sb = _rowwise_operands(inputs)
    offs = torch.cumsum(inputs["group_lens"], dim=0, dtype=torch.int32)
    out = torch._scaled_grouped_mm(
        a_q, b_q.transpose(-2, -1), sa, sb, offs=offs, out_dtype=inputs["a"].dtype, use_fast_accum=True
    )
    return {"out": out}


def _scaled_mm_loop_forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    a_q, sa, b_q, sb = _rowwise_operands(inputs)
    splits = inputs["group_lens_host"].tolist()
    groups = zip(a_q.split(splits), sa.split(splits), b_q, sb, outputs["out"].split(splits), strict=True)
    for x, s, w, sw, y in groups:
        if x.shape[0]:
            torch._scaled_mm(
                x, w.t(), scale_a=s[:, None], scale_b=sw[None, :], out_dtype=y.dtype, use_fast_accum=True, out=y
            )


SPEC = OpSpec(
    name="grouped_gemm_fp8",
    description="FP8 grouped GEMM for MoE experts (E4M3/E5M2/HYBRID; tensor-, row-, 128-blockwise), fwd and bwd",
    mutable_files=(
        "kernels/grouped_gemm_fp8/kernel.py",
        "kernels/grouped_gemm_fp8/tuning.py",
        "kernels/grouped_gemm/kernel.py",
        "kernels/common/fp8.py",
        "kernels/common/blockwise_ws.py",
    ),
    shape_family="grouped_gemm",
    **GEMM_CLASS_FIELDS,
    make_inputs=make_inputs,
    make_outputs=make_outputs,
    reference=reference,
    flops=flops,
    bytes_moved=fp8_bytes_moved,
    snr_formats=snr_formats,
    runner=Runner("turbo-opt", _forward, _backward),
    baselines=(
        Runner("torch._scaled_grouped_mm", _scaled_grouped_mm_forward, None, variants=("e4m3-rowwise",)),
        Runner("torch._scaled_mm loop", _scaled_mm_loop_forward, None, variants=("e4m3-rowwise",)),
        GROUPED_MM_BASELINE,
    ),
    variants=VARIANTS,
    default_preset="headline",
    train_step=train_step,
)
