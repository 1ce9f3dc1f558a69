"""grouped_gemm (bf16/fp16): the tunable space and the tuned table (pass/bucket -> launch config).

The campaign's search proposer rewrites TUNED_TABLE: keep it a plain literal, one bucket a line.
Buckets are `<pass>/<size>`: pass is fwd, dgrad or wgrad; size is "small" when the average
group has fewer than SMALL_GROUP_TOKENS tokens, else "large".
"""

from __future__ import annotations

from collections.abc import Mapping

from kernels.common.tiles import TileConfig, config_from_table, fits_shared_memory

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


def bucket(pass_name: str, total_tokens: int, groups: int) -> str:
    size = "small" if total_tokens < SMALL_GROUP_TOKENS * max(groups, 1) else "large"
    return f"{pass_name}/{size}"


def config_for(pass_name: str, total_tokens: int, groups: int) -> TileConfig:
    return config_from_table(TUNED_TABLE, TUNABLE_SPACE, bucket(pass_name, total_tokens, groups))


def buckets_for(dims: Mapping[str, int], variant: str = "default") -> set[str]:
    """Buckets a fwd+bwd step of these dims (B groups of M tokens on average) uses: one per pass."""
    return {bucket(p, dims["B"] * dims["M"], dims["B"]) for p in PASSES}


def fits(cfg: Mapping[str, int]) -> bool:
    """Whether a config fits in shared memory (bf16/fp16 operands); the search skips the rest."""
    return fits_shared_memory(cfg, element_size=2)
