"""gemm_fp8: the FP8 passes of a Linear layer, over the dense TMA kernel of kernels/gemm.

Every pass runs NT: both operands K-major (the reduction dim contiguous), as wgmma needs for 8-bit
types. Each operand is quantized by one kernel of kernels/common/fp8.py, straight into that layout:

    pass    reduction   A operand            B operand
    fwd     K           x, along K           w as [N, K]
    dgrad   N           grad_out, along N    w as [K, N] (quantized column-wise, written transposed)
    wgrad   tokens      grad_out^T           x^T (both quantized along tokens, written transposed)

Where TMA cannot describe an operand (K not a multiple of 16, an odd output width), the grouped
pointer kernel runs the pass as one group. On Hopper the passes whose bucket holds WS 1 run the
warp-specialized kernel of kernels/common/blockwise_ws.py instead (the wgrad as its token reduction).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.common import blockwise_ws
from kernels.common.device import cdiv
from kernels.common.fp8 import BLOCK, Granularity, quantize_rows
from kernels.common.scales import Scales
from kernels.common.tma import tma_layout
from kernels.gemm.kernel import launch_tma_k_major
from kernels.gemm_fp8.tuning import config_for
from kernels.grouped_gemm.kernel import grouped_mm
from kernels.grouped_gemm_fp8.kernel import QuantizedWeight, row_scale_strides, vark_scale_strides


@dataclass(frozen=True)
class Fp8Tensor:
    """A 2-D operand kept in FP8 by its caller: `x ~= data * scale`, `data` [rows, K] with K (the
    forward's reduction dim) contiguous. `scale` (fp32): TENSORWISE [1]; ROWWISE [rows];
    BLOCKWISE [rows, cdiv(K, 128)] (1x128, activations) or [cdiv(rows, 128), cdiv(K, 128)]
    (128x128, weights). A weight is [N, K], the layout of a Linear weight."""

    data: torch.Tensor
    scale: torch.Tensor
    granularity: Granularity

    def expected_scale_shape(self, weight: bool) -> tuple[int, ...]:
        rows, k = self.data.shape
        if self.granularity == Granularity.TENSORWISE:
            return (1,)
        if self.granularity == Granularity.ROWWISE:
            return (rows,)
        return (cdiv(rows, BLOCK) if weight else rows, cdiv(k, BLOCK))

    def check(self, name: str, fp8_dtype: torch.dtype, granularity: Granularity, weight: bool) -> None:
        """Refuse (ValueError) data or scales that do not match each other and the config."""
        if self.data.ndim != 2 or self.data.stride(1) != 1:
            raise ValueError(f"gemm_fp8: {name}.data must be 2-D with K contiguous, got {tuple(self.data.shape)} "
                             f"strides {self.data.stride()}")
        if self.data.dtype != fp8_dtype:
            raise ValueError(f"gemm_fp8: {name}.data is {self.data.dtype}, the config wants {fp8_dtype}")
        if self.granularity != granularity:
            raise ValueError(f"gemm_fp8: {name} is quantized {self.granularity.value}, the config wants "
                             f"{granularity.value}")
        expected = self.expected_scale_shape(weight)
        if self.scale.dtype != torch.float32 or tuple(self.scale.shape) != expected:
            raise ValueError(f"gemm_fp8: {name}.scale must be float32 {list(expected)} for {granularity.value} "
                             f"{'weight' if weight else 'activation'} data {tuple(self.data.shape)}, got "
                             f"{self.scale.dtype} {list(self.scale.shape)}")

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The high-precision tensor the data and scales stand for."""
        scale = self.scale
        rows, k = self.data.shape
        if self.granularity == Granularity.ROWWISE:
            scale = scale[:, None]
        elif self.granularity == Granularity.BLOCKWISE:
            row_block = 1 if scale.shape[0] == rows else BLOCK  # 1x128 activation or 128x128 weight blocks
            scale = scale.repeat_interleave(row_block, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :k]
        return (self.data.float() * scale).to(dtype)


def quantize(x: torch.Tensor, fp8_dtype: torch.dtype, granularity: Granularity, weight: bool = False) -> Fp8Tensor:
    """Quantize a 2-D [rows, K] tensor for gemm_fp8 (for callers that keep FP8 operands, such as weights)."""
    if weight and granularity == Granularity.BLOCKWISE:
        w = QuantizedWeight.quantize(x.contiguous()[None], False, fp8_dtype, granularity)
        return Fp8Tensor(w.data[0], w.scale[0], granularity)
    data, scale = quantize_rows(x.contiguous(), fp8_dtype, granularity)
    return Fp8Tensor(data, scale, granularity)


def weight_operand(w: Fp8Tensor, reduce_over_n: bool) -> QuantizedWeight:
    """A pre-quantized [N, K] weight as the B operand: [N, K] for the forward, [K, N] for the dgrad
    (the forward's data transposed, exact for tensor and 128x128 scales; rowwise scales run along N,
    the dgrad's reduction, so that pass quantizes the dequantized weight column-wise)."""
    if w.granularity == Granularity.ROWWISE and reduce_over_n:
        return QuantizedWeight.quantize(w.dequantize(torch.float32)[None], True, w.data.dtype, w.granularity)
    if w.granularity == Granularity.BLOCKWISE:
        blocks = (w.data[None], w.data.t().contiguous()[None] if reduce_over_n else None, w.scale[None])
        return QuantizedWeight.quantize(w.data[None], reduce_over_n, w.data.dtype, w.granularity, blocks)
    data = w.data.t().contiguous() if reduce_over_n else w.data
    strides = (0, 0, 0) if w.granularity == Granularity.TENSORWISE else (0, 1, 0)
    return QuantizedWeight(data[None], w.scale, strides)


def scaled_mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, scales: Scales, pass_name: str,
              granularity: Granularity, accumulate: bool = False) -> torch.Tensor:
    """out = (a @ b^T) with the scales applied (`accumulate`: out += it): a [M, K] and b [N, K] fp8, both
    K-major."""
    M, N = out.shape
    if M == 0 or N == 0:
        return out
    # The layer's weight: b for the forward ([N, K]) and the dgrad (its transpose), the output for the wgrad.
    cfg = config_for(pass_name, M, N, granularity, out.shape if pass_name == "wgrad" else b.shape)
    if cfg.WS and pass_name == "wgrad":  # the warp-specialized kernel's token reduction, where it takes the call
        token_cfg = blockwise_ws.runnable(a, b, out, scales, cfg, token_reduction=True, accumulate=accumulate)
        if token_cfg is not None:
            return blockwise_ws.blockwise_token_mm(a, b, out, scales, token_cfg, accumulate=accumulate)
    elif cfg.WS and not accumulate:  # its M-grouped walk
        ws_cfg = blockwise_ws.runnable(a, b[None], out, scales, cfg)
        if ws_cfg is not None:
            return blockwise_ws.blockwise_mm(a, b[None], out, scales, ws_cfg, ping_pong=pass_name == "fwd")
    if scales.per_k_block:
        cfg = blockwise_ws.triton_tile(cfg)
    # An accumulating epilogue reads C: the persistent TMA kernel's stores go through a shared-memory tile its
    # pipeline leaves no room beside (262 of 227 KiB on the H100), so it runs on the grouped kernel, whose
    # epilogue works in registers.
    if not accumulate and tma_layout(a) is True and tma_layout(b) is True and tma_layout(out) is True:
        return launch_tma_k_major(a, b, out, cfg, scales)
    one_group = torch.arange(0, 2 * M, M, device=a.device, dtype=torch.int64)  # [0, M] in one launch
    return grouped_mm(a, b[None], one_group, out, cfg, scales, accumulate)


def fp8_rows_times_weight(pass_name: str, x: Fp8Tensor, w: QuantizedWeight, out: torch.Tensor) -> torch.Tensor:
    """out = x @ w^T, x and w quantized along their rows: the forward (w [N, K]) and the dgrad (w [K, N])."""
    gran = x.granularity
    scales = Scales(x.scale, row_scale_strides(x.scale, gran), w.scale, w.strides, w.out_div,
                    per_k_block=gran == Granularity.BLOCKWISE)
    return scaled_mm(x.data, w.data[0], out, scales, pass_name, gran)


def fp8_token_reduction(
    x: tuple[torch.Tensor, torch.Tensor], y: tuple[torch.Tensor, torch.Tensor], granularity: Granularity,
    out: torch.Tensor, accumulate: bool = False,
) -> torch.Tensor:
    """out = x^T @ y (`accumulate`: out += it), reducing over the tokens: x = (q^T [P, capacity], scale)
    and y likewise, both quantized along the tokens into quantize_both's transposed layout (the wgrad)."""
    (xt, sx), (yt, sy) = x, y
    scales = Scales(sx, vark_scale_strides(sx, granularity)[1:], sy, vark_scale_strides(sy, granularity),
                    per_k_block=granularity == Granularity.BLOCKWISE)
    return scaled_mm(xt, yt, out, scales, "wgrad", granularity, accumulate)
