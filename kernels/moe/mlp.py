"""MoEMLP: an MoE layer's MLP as one nn.Module, forward and backward, in bf16/fp16 or FP8.

    layer = MoEMLP(hidden=7168, intermediate=2048, router=RouterConfig.deepseek_v3(), expert_bias=True,
                   dtype=torch.bfloat16, device="cuda", fp8=Float8Config())   # fp8=None: bf16 experts
    out, routing = layer(x)                                                    # x [T, hidden]
    loss = task_loss(out) + 1e-3 * routing.aux_loss + 1e-4 * routing.z_loss

The chain: the gate (x @ gate.T, torch) -> route (kernels/moe/router.py) -> permute (tokens sorted by
expert) -> GateUP grouped GEMM [E, 2I, H] -> SwiGLU (`_swiglu_*_kernel` below: silu(gate) * up, its
backward recomputing silu from the saved GateUP output) -> Down grouped GEMM [E, H, I] -> unpermute (the
top-k rows of each token combined by its routing probabilities). On the FP8 path the SwiGLU is computed
inside the quantization of the Down GEMM's input (`_SwiGLUDownFp8`): its output is never written. Every
step is an autograd Function whose backward the chain calls in reverse; nothing reads the routing on the
host (CUDA-graph safe). Activation memory: the GateUP output and the SwiGLU output (the Down GEMM's
input), as a torch layer keeps; on the FP8 path the GateUP output and the Down input's FP8 layout for its
wgrad.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import nn

from kernels.common.device import cdiv
from kernels.common.fp8 import Float8Config
from kernels.grouped_gemm import grouped_gemm
from kernels.grouped_gemm_fp8 import fp8_backward, fp8_forward, grouped_gemm_fp8
from kernels.moe.permute import permute, unpermute
from kernels.moe.router import RouterConfig, Routing, route

# 16-byte accesses of bf16: 8 a thread over 1024 columns, 4 rows a program.
SWIGLU_BLOCK_I = 1024
SWIGLU_ROWS = 4
SWIGLU_WARPS = 4


@triton.jit
def _swiglu_fwd_kernel(h_ptr, out_ptr, R, I, ROWS: tl.constexpr, BLOCK_I: tl.constexpr):
    """out[r] = silu(h[r, :I]) * h[r, I:] in fp32, for ROWS rows and BLOCK_I columns a program."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = (rows < R)[:, None] & (cols < I)[None, :]
    base = rows.to(tl.int64)[:, None] * (2 * I) + cols[None, :]
    gate = tl.load(h_ptr + base, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(h_ptr + base + I, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * I + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(h_ptr, grad_out_ptr, grad_h_ptr, R, I, ROWS: tl.constexpr, BLOCK_I: tl.constexpr):
    """grad_h[r, :I] = grad_out * up * silu'(gate), grad_h[r, I:] = grad_out * silu(gate)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = (rows < R)[:, None] & (cols < I)[None, :]
    base = rows.to(tl.int64)[:, None] * (2 * I) + cols[None, :]
    gate = tl.load(h_ptr + base, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(h_ptr + base + I, mask=mask, other=0.0).to(tl.float32)
    grad = tl.load(grad_out_ptr + rows.to(tl.int64)[:, None] * I + cols[None, :], mask=mask, other=0.0)
    grad = grad.to(tl.float32)
    sig = tl.sigmoid(gate)
    silu = gate * sig
    dtype = grad_h_ptr.dtype.element_ty
    tl.store(grad_h_ptr + base, (grad * up * (sig + silu * (1.0 - sig))).to(dtype), mask=mask)
    tl.store(grad_h_ptr + base + I, (grad * silu).to(dtype), mask=mask)


def _swiglu_grid(R: int, I: int) -> tuple[int, int]:
    return cdiv(R, SWIGLU_ROWS), cdiv(I, SWIGLU_BLOCK_I)


def swiglu_backward(h: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """grad_h [R, 2I] of swiglu(h) for its output's gradient grad_out [R, I]."""
    R, I = h.shape[0], h.shape[1] // 2
    grad_h = torch.empty_like(h)
    if R:
        _swiglu_bwd_kernel[_swiglu_grid(R, I)](h, grad_out.contiguous(), grad_h, R, I, ROWS=SWIGLU_ROWS,
                                               BLOCK_I=SWIGLU_BLOCK_I, num_warps=SWIGLU_WARPS)
    return grad_h


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h):
        R, I = h.shape[0], h.shape[1] // 2
        out = h.new_empty((R, I))
        if R:
            _swiglu_fwd_kernel[_swiglu_grid(R, I)](h, out, R, I, ROWS=SWIGLU_ROWS, BLOCK_I=SWIGLU_BLOCK_I,
                                                   num_warps=SWIGLU_WARPS)
        ctx.save_for_backward(h)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (h,) = ctx.saved_tensors
        return swiglu_backward(h, grad_out)


class _SwiGLUDownFp8(torch.autograd.Function):
    """The Down GEMM in FP8 on swiglu(h): the SwiGLU is computed in the quantization of the GEMM's input
    (quantize_both's glu, both layouts: the forward's rows and the wgrad's transposed groups), so its bf16
    output is neither written nor read back; the backward's dgrad gives the SwiGLU output's gradient, which
    swiglu_backward takes to h's."""

    @staticmethod
    def forward(ctx, h, w, offs, config):
        out = h.new_empty((h.shape[0], w.shape[1]))
        ctx.saved = fp8_forward(h, w, offs, True, config, out, needs=ctx.needs_input_grad[:2], a_glu=True)
        ctx.save_for_backward(h, offs)
        ctx.config, ctx.w_shape = config, w.shape
        return out

    @staticmethod
    def backward(ctx, grad_out):
        h, offs = ctx.saved_tensors
        grad_out = grad_out.to(h.dtype).contiguous()
        need_h, need_w = ctx.needs_input_grad[:2]
        grad_a = h.new_empty((h.shape[0], h.shape[1] // 2)) if need_h else None
        grad_w = h.new_empty(ctx.w_shape) if need_w else None
        fp8_backward(grad_out, ctx.saved, offs, True, ctx.config, grad_a, grad_w)
        ctx.saved = None
        return swiglu_backward(h, grad_a) if need_h else None, grad_w, None, None


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """silu(h[:, :I]) * h[:, I:] for h [R, 2I] (the GateUP GEMM's output, gate half first), with autograd."""
    if h.ndim != 2 or h.shape[1] % 2:
        raise ValueError(f"swiglu: h must be [rows, 2 * I], got {list(h.shape)}")
    return _SwiGLU.apply(h.contiguous())


class MoEMLP(nn.Module):
    """router -> permute -> GateUP -> SwiGLU -> Down -> unpermute over `router.num_experts` experts.

    Parameters: `gate` [E, hidden] (the router's linear layer), `w_gate_up` [E, 2 * intermediate, hidden]
    (each expert's gate rows then up rows), `w_down` [E, hidden, intermediate]; with `expert_bias`, a
    buffer [E] fp32 (zeros) added to the scores for the selection only, for the caller to update from
    the tokens per expert (DeepSeek-V3's auxiliary-loss-free balancing). `fp8`: the expert GEMMs in FP8
    (grouped_gemm_fp8 under that config); None: in the parameters' dtype.
    """

    def __init__(self, hidden: int, intermediate: int, router: RouterConfig, *, expert_bias: bool = False,
                 fp8: Float8Config | None = None, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        if not isinstance(router, RouterConfig):
            raise ValueError(f"MoEMLP: router must be a RouterConfig, got {type(router).__name__}")
        if fp8 is not None and not isinstance(fp8, Float8Config):
            raise ValueError(f"MoEMLP: fp8 must be a Float8Config or None, got {type(fp8).__name__}")
        if hidden < 1 or intermediate < 1:
            raise ValueError(f"MoEMLP: hidden and intermediate must be positive, got {hidden} and {intermediate}")
        E = router.num_experts
        self.router, self.fp8 = router, fp8
        self.hidden, self.intermediate = hidden, intermediate
        factory = {"dtype": dtype, "device": device}
        self.gate = nn.Parameter(torch.randn(E, hidden, **factory) * hidden**-0.5)
        self.w_gate_up = nn.Parameter(torch.randn(E, 2 * intermediate, hidden, **factory) * hidden**-0.5)
        self.w_down = nn.Parameter(torch.randn(E, hidden, intermediate, **factory) * intermediate**-0.5)
        self.register_buffer("expert_bias", torch.zeros(E, device=device) if expert_bias else None)


    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, Routing]:
        """x [T, hidden] in the parameters' dtype -> (out [T, hidden], the routing with its losses)."""
        if x.ndim != 2 or x.shape[1] != self.hidden:
            raise ValueError(f"MoEMLP: x must be [T, hidden={self.hidden}], got {list(x.shape)}")
        if x.dtype != self.gate.dtype:
            raise ValueError(f"MoEMLP: x is {x.dtype} but the parameters are {self.gate.dtype}")
        routing = route(x @ self.gate.t(), self.router, self.expert_bias)
        p = permute(x, routing.expert_ids, num_experts=self.router.num_experts)
        if self.fp8 is None:
            h = grouped_gemm(p.permuted, self.w_gate_up, p.group_lens, p.group_offs)
            y = grouped_gemm(swiglu(h), self.w_down, p.group_lens, p.group_offs)
        else:
            h = grouped_gemm_fp8(p.permuted, self.w_gate_up, p.group_lens, p.group_offs, config=self.fp8)
            y = _SwiGLUDownFp8.apply(h, self.w_down, p.group_offs, self.fp8)
        return unpermute(y, p.row_map, routing.probs), routing
