"""MoEMLP: an MoE layer's MLP as one nn.Module, forward and backward, in bf16/fp16 or FP8.

    layer = MoEMLP(hidden=7168, intermediate=2048, router=RouterConfig.deepseek_v3(), expert_bias=True,
                   dtype=torch.bfloat16, device="cuda", fp8=Float8Config())   # fp8=None: bf16 experts
    out, routing = layer(x)                                                    # x [T, hidden]
    loss = task_loss(out) + 1e-3 * routing.aux_loss + 1e-4 * routing.z_loss

    w8 = layer.quantize_weights()           # gradient accumulation, FP8: once per optimizer step,
    out, routing = layer(x, weights_fp8=w8) # then every microbatch reads it (no weight quantized again)
    out, routing = layer(x, weights_fp8=w8, main_grads=(gate_up_main_grad, down_main_grad))  # wgrads add there

The chain: the gate (x @ gate.T, torch) -> route (kernels/moe/router.py) -> moe_experts
(kernels/moe/experts.py: permute -> GateUP grouped GEMM -> SwiGLU -> Down grouped GEMM -> unpermute, the
SwiGLU fused into the Down GEMM's quantization on the FP8 path). Every step is an autograd Function whose
backward the chain calls in reverse; nothing reads the routing on the host (CUDA-graph safe). Activation
memory: the GateUP output and the SwiGLU output (the Down GEMM's input), as a torch layer keeps; on the
FP8 path the GateUP output and the Down input's FP8 layout for its wgrad.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.common.fp8 import Float8Config
from kernels.moe.experts import ExpertWeightsFp8, moe_experts
from kernels.moe.router import RouterConfig, Routing, route


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


    def quantize_weights(self) -> ExpertWeightsFp8:
        """The expert weights quantized under the layer's FP8 config, for `forward(x, weights_fp8=)` in every
        microbatch of one optimizer step; stale (refused by shape only, so make it again) after an update."""
        if self.fp8 is None:
            raise ValueError("MoEMLP.quantize_weights: the layer has no fp8 config (its experts run in bf16/fp16)")
        return ExpertWeightsFp8.of(self.w_gate_up, self.w_down, self.fp8)

    def forward(self, x: torch.Tensor, weights_fp8: ExpertWeightsFp8 | None = None,
                main_grads: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, Routing]:
        """x [T, hidden] in the parameters' dtype -> (out [T, hidden], the routing with its losses);
        `weights_fp8`: quantize_weights() of this step, read instead of quantizing the expert weights;
        `main_grads` (FP8): buffers shaped like w_gate_up and w_down that their wgrads add into (the two
        stacks' .grad stay untouched; the caller zeroes the buffers after each optimizer step)."""
        if x.ndim != 2 or x.shape[1] != self.hidden:
            raise ValueError(f"MoEMLP: x must be [T, hidden={self.hidden}], got {list(x.shape)}")
        if x.dtype != self.gate.dtype:
            raise ValueError(f"MoEMLP: x is {x.dtype} but the parameters are {self.gate.dtype}")
        routing = route(x @ self.gate.t(), self.router, self.expert_bias)
        out = moe_experts(x, routing.expert_ids, routing.probs, self.w_gate_up, self.w_down, self.fp8, weights_fp8,
                          main_grads)
        return out, routing
