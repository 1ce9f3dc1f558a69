"""grouped_gemm: the expert GEMMs of an MoE layer in bf16/fp16, forward and backward in Triton.

    from kernels.grouped_gemm import grouped_gemm
    out = grouped_gemm(tokens, expert_weights, group_lens)   # [sum(lens), K] x [G, N, K] -> [sum(lens), N]
    out.backward(grad)                                        # dgrad (NN) and variable-K wgrad (TN)

`group_lens` (int64 [G]) stays on the device: nothing here reads it on the host, so the op runs
under CUDA-graph capture and with router-made splits (skewed, empty groups, any sizes).
"""

from __future__ import annotations

import torch

from kernels.common.device import check_same_device
from kernels.grouped_gemm.kernel import grouped_mm, grouped_mm_vark
from kernels.grouped_gemm.tuning import config_for

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)


def group_offsets(group_lens: torch.Tensor) -> torch.Tensor:
    """Exclusive offsets [G+1] (int64) of the groups' first rows, computed on the device."""
    offs = torch.zeros(group_lens.numel() + 1, dtype=torch.int64, device=group_lens.device)
    torch.cumsum(group_lens, dim=0, out=offs[1:])
    return offs


def check_grouped_inputs(
    op: str,
    a: torch.Tensor,
    b: torch.Tensor,
    group_lens: torch.Tensor,
    group_offs: torch.Tensor | None,
    trans_b: bool,
    dtypes: tuple[torch.dtype, ...],
) -> torch.Tensor:
    """Validate the grouped-GEMM inputs and return the group offsets [G+1].

    Shapes, dtypes and devices are checked on the host. The values of `group_lens` (that they are
    non-negative and sum to a.shape[0]) are checked only when they are already on the host: on a GPU
    that check would need a device-to-host sync, which the op never does.
    """
    if a.ndim != 2:
        raise ValueError(f"{op}: a must be [tokens, K], got shape {tuple(a.shape)}")
    if b.ndim != 3:
        raise ValueError(f"{op}: b must be [G, N, K] (trans_b) or [G, K, N], got shape {tuple(b.shape)}")
    if a.dtype not in dtypes or b.dtype != a.dtype:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{op}: a and b must share one dtype of {names}, got a {a.dtype} and b {b.dtype}")
    G = b.shape[0]
    K_b = b.shape[2] if trans_b else b.shape[1]
    if a.shape[1] != K_b:
        layout = "[G, N, K]" if trans_b else "[G, K, N]"
        raise ValueError(f"{op}: K differs: a is {tuple(a.shape)}, b is {tuple(b.shape)} read as {layout}")
    if group_lens.ndim != 1 or group_lens.dtype != torch.int64:
        got = f"{group_lens.dtype} {tuple(group_lens.shape)}"
        raise ValueError(f"{op}: group_lens must be a 1-D int64 tensor, got {got}")
    if group_lens.numel() != G:
        raise ValueError(f"{op}: group_lens has {group_lens.numel()} groups but b has {G}")
    check_same_device(a=a, b=b, group_lens=group_lens)
    if group_lens.device.type == "cpu":
        if bool((group_lens < 0).any()):
            raise ValueError(f"{op}: group_lens has negative sizes")
        total = int(group_lens.sum())
        if total != a.shape[0]:
            raise ValueError(f"{op}: group_lens sums to {total} but a has {a.shape[0]} rows")
    if group_offs is None:
        return group_offsets(group_lens)
    if group_offs.shape != (G + 1,) or group_offs.dtype != torch.int64 or group_offs.device != group_lens.device:
        raise ValueError(f"{op}: group_offs must be int64 [G+1] = [{G + 1}] on {group_lens.device}")
    return group_offs


def _b_view(b: torch.Tensor, trans_b: bool, pass_name: str) -> torch.Tensor:
    """b as [G, out, reduction] for the M-grouped kernel: the forward reduces over K, dgrad over N."""
    as_nk = b if trans_b else b.transpose(1, 2)
    return as_nk if pass_name == "fwd" else as_nk.transpose(1, 2)


def grouped_forward(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, trans_b: bool, out: torch.Tensor) -> None:
    cfg = config_for("fwd", a.shape[0], b.shape[0], b.shape[1:])
    grouped_mm(a, _b_view(b, trans_b, "fwd"), offs, out, cfg)


def grouped_dgrad(
    grad_out: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, trans_b: bool, grad_a: torch.Tensor
) -> None:
    cfg = config_for("dgrad", grad_out.shape[0], b.shape[0], b.shape[1:])
    grouped_mm(grad_out, _b_view(b, trans_b, "dgrad"), offs, grad_a, cfg)


def grouped_wgrad(
    grad_out: torch.Tensor, a: torch.Tensor, offs: torch.Tensor, trans_b: bool, grad_b: torch.Tensor
) -> None:
    """grad_b[g] = grad_out_g^T @ a_g (trans_b, [G, N, K]) or a_g^T @ grad_out_g ([G, K, N])."""
    cfg = config_for("wgrad", a.shape[0], grad_b.shape[0], grad_b.shape[1:])
    x, y = (grad_out, a) if trans_b else (a, grad_out)
    grouped_mm_vark(x.t(), y.t(), offs, grad_b, cfg)


class _GroupedGemm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, offs, trans_b, out_dtype):
        out = torch.empty((a.shape[0], b.shape[1] if trans_b else b.shape[2]), dtype=out_dtype, device=a.device)
        grouped_forward(a, b, offs, trans_b, out)
        ctx.save_for_backward(a, b, offs)
        ctx.trans_b = trans_b
        return out

    @staticmethod
    def backward(ctx, grad_out):
        a, b, offs = ctx.saved_tensors
        grad_out = grad_out.to(a.dtype).contiguous()
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_a = torch.empty_like(a)
            grouped_dgrad(grad_out, b, offs, ctx.trans_b, grad_a)
        if ctx.needs_input_grad[1]:
            grad_b = torch.empty_like(b)
            grouped_wgrad(grad_out, a, offs, ctx.trans_b, grad_b)
        return grad_a, grad_b, None, None, None


def grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    group_lens: torch.Tensor,
    group_offs: torch.Tensor | None = None,
    trans_b: bool = True,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Per group g: out[rows_g] = a[rows_g] @ (b[g]^T if trans_b else b[g]), with autograd.

    a: [sum(group_lens), K]; b: [G, N, K] (trans_b) or [G, K, N]; group_lens: int64 [G] on a's
    device; group_offs: optional int64 [G+1] exclusive offsets (computed on the device if absent).
    """
    offs = check_grouped_inputs("grouped_gemm", a, b, group_lens, group_offs, trans_b, SUPPORTED_DTYPES)
    out_dtype = out_dtype or a.dtype
    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"grouped_gemm: out_dtype must be bf16, fp16 or fp32, got {out_dtype}")
    return _GroupedGemm.apply(a.contiguous(), b, offs, trans_b, out_dtype)


__all__ = ["check_grouped_inputs", "group_offsets", "grouped_gemm"]
