"""How an FP8 GEMM kernel is told where its operands' scales live.

Scales are strided views that broadcast: a tensorwise scale has stride 0 where a rowwise one has
stride 1, so one indexing serves every granularity. SCALE_* says where they apply: not at all
(bf16), once in the epilogue (tensorwise, rowwise), or to each 128-wide K block's product
(blockwise, "per-K-block promotion").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SCALE_NONE, SCALE_EPILOGUE, SCALE_PER_K_BLOCK = 0, 1, 2


@dataclass(frozen=True)
class Scales:
    """Scale views for a scaled launch: A's indexed [row, k_block], B's [group, out, k_block].

    `b_out_div` maps an output column to its scale index (128 for 128x128 weight blocks, else 1).
    A dense GEMM is one group: it ignores the group stride.
    """

    a: torch.Tensor
    a_strides: tuple[int, int]
    b: torch.Tensor
    b_strides: tuple[int, int, int]
    b_out_div: int = 1
    per_k_block: bool = False

    @property
    def mode(self) -> int:
        return SCALE_PER_K_BLOCK if self.per_k_block else SCALE_EPILOGUE
