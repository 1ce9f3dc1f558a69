"""grouped_gemm_fp8: the FP8 passes of the expert GEMMs, over the shared grouped kernels.

Each pass quantizes its operands into the layout wgmma wants (fp8 operands K-major: the
reduction dim contiguous), with one Triton kernel per operand that reads the high-precision tensor
once, and hands the shared M-grouped or variable-K kernel strided scale views:

    pass    reduction   A operand (rows)          B operand (per group)
    fwd     K           a, along K                b as [N, K]
    dgrad   N           grad_out, along N         b as [K, N]
    wgrad   tokens      grad_out^T, per group     a^T, per group

On Hopper the blockwise forward and dgrad run the warp-specialized kernel of
kernels/common/blockwise_ws.py instead of the M-grouped one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from kernels.common import blockwise_ws
from kernels.common.fp8 import Granularity, quantize_blocks_2d, quantize_cols_t, quantize_rows
from kernels.common.scales import Scales
from kernels.grouped_gemm.kernel import VarKScales, grouped_mm, grouped_mm_vark
from kernels.grouped_gemm_fp8.tuning import config_for


def _uniform_offsets(groups: int, rows: int, device: torch.device) -> torch.Tensor:
    return torch.arange(groups + 1, device=device, dtype=torch.int64) * rows


@dataclass(frozen=True)
class QuantizedWeight:
    """An expert weight quantized for one pass: `data` is [G, out, red] (red contiguous) plus its scales.

    `strides` index `scale` as [group, out, k_block]; `out_div` maps an output index to its scale
    row (128 for 128x128 blocks). BLOCKWISE keeps `blocks`, the result of one `quantize_blocks_2d`,
    so that the dgrad reads the forward's blocks transposed instead of quantizing again.
    """

    data: torch.Tensor
    scale: torch.Tensor
    strides: tuple[int, int, int]
    out_div: int = 1
    blocks: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def quantize(
        cls, w: torch.Tensor, reduce_over_rows: bool, fp8_dtype: torch.dtype, granularity: Granularity,
        blocks: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> QuantizedWeight:
        """Quantize `w`, stored [G, R, C] contiguous, for a pass that reduces over C (the stored rows
        are already K-major) or over R (quantized column-wise and written transposed)."""
        G, R, C = w.shape
        if granularity == Granularity.BLOCKWISE:
            blocks = blocks or quantize_blocks_2d(w, fp8_dtype)
            q, qt, s = blocks
            # s is indexed [g, row block, col block]; out is C (reducing rows) or R.
            strides = (s.stride(0), s.stride(2), s.stride(1)) if reduce_over_rows else s.stride()
            return cls(qt if reduce_over_rows else q, s, strides, 128, blocks)
        if reduce_over_rows:
            segment = _uniform_offsets(G, R, w.device)
            qt, s, _ = quantize_cols_t(
                w.reshape(G * R, C), segment, fp8_dtype, granularity, per_segment_tensor_scale=True
            )
            padded_rows = triton.cdiv(R, 128) * 128  # each expert's rows start on a 128 boundary
            # [G, C(out), R(red)], red contiguous; the zero padding past R is never read.
            data = qt[:, : G * padded_rows].unflatten(1, (G, padded_rows)).permute(1, 0, 2)[:, :, :R]
            tensorwise = granularity == Granularity.TENSORWISE
            return cls(data, s, (1, 0, 0) if tensorwise else (s.stride(0), s.stride(1), 0))
        q, s = quantize_rows(w.reshape(G * R, C), fp8_dtype, granularity, segment_rows=R)
        return cls(q.view(G, R, C), s, (1, 0, 0) if granularity == Granularity.TENSORWISE else (R, 1, 0))


def row_scale_strides(scale: torch.Tensor, granularity: Granularity) -> tuple[int, int]:
    """A-operand scale view [row, k_block]: tensorwise broadcasts, rowwise per row, blockwise 1x128."""
    if granularity == Granularity.TENSORWISE:
        return (0, 0)
    if granularity == Granularity.ROWWISE:
        return (1, 0)
    return scale.stride()


def m_grouped_fp8(
    pass_name: str, x: torch.Tensor, x_dtype: torch.dtype, weight: QuantizedWeight, offs: torch.Tensor,
    granularity: Granularity, out: torch.Tensor,
) -> None:
    """out[rows_g] = x[rows_g] @ weight_g^T with x quantized along its rows (forward and dgrad)."""
    xq, sx = quantize_rows(x, x_dtype, granularity)
    scales = Scales(
        a=sx, a_strides=row_scale_strides(sx, granularity), b=weight.scale, b_strides=weight.strides,
        b_out_div=weight.out_div, per_k_block=granularity == Granularity.BLOCKWISE,
    )
    cfg = config_for(pass_name, x.shape[0], weight.data.shape[0], granularity)
    if blockwise_ws.supported(xq, weight.data, out, scales, cfg):
        blockwise_ws.blockwise_mm(xq, weight.data, out, scales, cfg, offs)
    else:
        grouped_mm(xq, weight.data, offs, out, cfg, scales)


def vark_scale_strides(scale: torch.Tensor, granularity: Granularity) -> tuple[int, int, int]:
    """Variable-K operand scale view [group, row, token_block] for quantize_cols_t's scales."""
    if granularity == Granularity.TENSORWISE:
        return (0, 0, 0)
    if granularity == Granularity.ROWWISE:
        return (scale.stride(0), scale.stride(1), 0)
    return (0, scale.stride(0), scale.stride(1))


def vark_fp8(
    x: torch.Tensor, x_dtype: torch.dtype, y: torch.Tensor, y_dtype: torch.dtype, offs: torch.Tensor,
    granularity: Granularity, out: torch.Tensor,
) -> None:
    """out[g] = x_g^T @ y_g over group g's tokens: x [M, P] and y [M, Q], quantized per group."""
    xt, sx, padded = quantize_cols_t(x, offs, x_dtype, granularity)
    yt, sy, _ = quantize_cols_t(y, offs, y_dtype, granularity)
    scales = VarKScales(
        x=sx, x_strides=vark_scale_strides(sx, granularity), y=sy, y_strides=vark_scale_strides(sy, granularity),
        per_k_block=granularity == Granularity.BLOCKWISE,
    )
    cfg = config_for("wgrad", x.shape[0], out.shape[0], granularity)
    grouped_mm_vark(xt, yt, padded, out, cfg, scales, padded=True)
