"""grouped_gemm (bf16/fp16): the tunable space and the tuned table (pass/bucket -> launch config).

The campaign's search proposer rewrites TUNED_TABLE: keep it a plain literal, one bucket a line.
Buckets are `<pass>/<size>`: pass is fwd, dgrad or wgrad; size is "small" when the average
group has fewer than SMALL_GROUP_TOKENS tokens, else "large". A bucket whose layers disagree is
split by an entry `<pass>/<size> <layer class>` (kernels/common/tiles.py, `layer_class`): that
layer's own config, still one plain line of the table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kernels.common.tiles import TileConfig, config_from_table, fits_shared_memory, layer_class, table_entry
from kernels.common.tiles import weight_class as shape_class  # what the search may split a bucket on

TUNABLE_SPACE: dict[str, tuple[int, ...]] = {
    "BLOCK_M": (64, 128, 256),
    "BLOCK_N": (64, 128, 256),
    "BLOCK_K": (32, 64, 128),
    "GROUP_M": (1, 4, 8, 16),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4, 5),
}

TUNED_TABLE: dict[str, dict[str, int]] = {
    "fwd/small": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    "fwd/large": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    "dgrad/small": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    "dgrad/large": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    "wgrad/small": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    "wgrad/large": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
}

SMALL_GROUP_TOKENS = 1024
PASSES = ("fwd", "dgrad", "wgrad")


def bucket(pass_name: str, total_tokens: int, groups: int, small_group_tokens: int = SMALL_GROUP_TOKENS) -> str:
    """`<pass>/small` when the average group holds fewer than `small_group_tokens` tokens, else `<pass>/large`."""
    size = "small" if total_tokens < small_group_tokens * max(groups, 1) else "large"
    return f"{pass_name}/{size}"


def config_for(pass_name: str, total_tokens: int, groups: int, weight_dims: Sequence[int]) -> TileConfig:
    """The config of a pass over `groups` weights of `weight_dims` (the two dims, either way round)."""
    key = table_entry(TUNED_TABLE, bucket(pass_name, total_tokens, groups), layer_class(*weight_dims))
    return config_from_table(TUNED_TABLE, TUNABLE_SPACE, key)


def buckets_for(dims: Mapping[str, int], variant: str = "default") -> set[str]:
    """Table entries a fwd+bwd step of these dims (B groups of M tokens on average) uses: one per pass."""
    return {table_entry(TUNED_TABLE, bucket(p, dims["B"] * dims["M"], dims["B"]), shape_class(dims)) for p in PASSES}


def fits(cfg: Mapping[str, int]) -> bool:
    """Whether a config fits in shared memory (bf16/fp16 operands); the search skips the rest."""
    return fits_shared_memory(cfg, element_size=2)
