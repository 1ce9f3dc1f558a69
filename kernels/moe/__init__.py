"""moe: the MoE layer's memory-bound ops around the grouped GEMMs, forward and backward in Triton.

    from kernels.moe import permute, unpermute
    p = permute(tokens, expert_ids, probs, num_experts=E, pad_to=16)   # tokens sorted by expert
    h = grouped_gemm(p.permuted, w, p.group_lens)                       # the experts
    out = unpermute(h, p.row_map, probs)                                # top-k copies combined

Routing stays on the device: nothing reads the tokens per expert on the host (CUDA-graph safe).
"""

from kernels.moe.permute import Permuted, RowMap, capacity_for, permute, unpermute

__all__ = ["Permuted", "RowMap", "capacity_for", "permute", "unpermute"]
