"""moe: the MoE layer's ops around the grouped GEMMs, forward and backward in Triton.

    from kernels.moe import RouterConfig, permute, route, unpermute
    r = route(x @ w_gate.t(), RouterConfig.deepseek_v3(), expert_bias=bias)       # top-k routing
    p = permute(x, r.expert_ids, r.probs, num_experts=256, pad_to=16)            # tokens sorted by expert
    h = grouped_gemm(p.permuted, w, p.group_lens)                                 # the experts
    out = unpermute(h, p.row_map, r.probs)                                        # top-k copies combined
    order = sort_by_expert(r.expert_ids, r.probs, num_experts=256)               # the layout, no copies
    loss = task_loss + aux_coeff * r.aux_loss + z_coeff * r.z_loss

    layer = MoEMLP(7168, 2048, RouterConfig.deepseek_v3(), expert_bias=True)    # all of it as one module
    out, routing = layer(x)

Routing stays on the device: nothing reads the tokens per expert on the host (CUDA-graph safe).
"""

from kernels.moe.experts import ExpertWeightsFp8, moe_experts, swiglu, swiglu_down_fp8
from kernels.moe.mlp import MoEMLP
from kernels.moe.permute import ExpertOrder, Permuted, RowMap, capacity_for, permute, sort_by_expert, unpermute
from kernels.moe.router import RouterConfig, Routing, route

__all__ = ["ExpertOrder", "ExpertWeightsFp8", "MoEMLP", "Permuted", "RouterConfig", "Routing", "RowMap",
           "capacity_for", "moe_experts", "permute", "route", "sort_by_expert", "swiglu", "swiglu_down_fp8",
           "unpermute"]
