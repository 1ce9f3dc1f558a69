"""gemm: the tunable space and the tuned table (shape bucket -> launch config).

The campaign's search proposer rewrites TUNED_TABLE: keep it a plain literal, one bucket a line.
`buckets_for` tells it which entries a benchmark shape exercises. A bucket whose layers disagree is split by
an entry `<bucket> <layer class>` (kernels/common/tiles.py, `layer_class`: the weight's two dims), that
layer's own config, for the passes of a `gemm` call (whose b is the weight).
"""

from __future__ import annotations

from collections.abc import Mapping

from kernels.common.tiles import TileConfig, config_from_table, fits_shared_memory, layer_class, table_entry
from kernels.common.tiles import weight_class as shape_class  # what the search may split a bucket on

TUNABLE_SPACE: dict[str, tuple[int, ...]] = {
    "BLOCK_M": (32, 64, 128, 256),
    "BLOCK_N": (32, 64, 128, 256),
    "BLOCK_K": (32, 64, 128),
    "GROUP_M": (1, 4, 8, 16),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4, 5),
}

TUNED_TABLE: dict[str, dict[str, int]] = {
    "small": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3},
    "medium": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    "large": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
}

# Output-tile area (M*N) up to which a bucket applies; larger problems fall into "large".
BUCKET_LIMITS: dict[str, int] = {"small": 512 * 512, "medium": 2048 * 2048}


def shape_bucket(M: int, N: int, K: int) -> str:
    """The tuned-table bucket of an (M, N, K) problem, by output-tile area."""
    area = M * N
    for bucket, limit in BUCKET_LIMITS.items():
        if area <= limit:
            return bucket
    return "large"


def config_for(M: int, N: int, K: int, weight_dims: tuple[int, int] | None = None) -> TileConfig:
    """The config of an (M, N, K) product; a layer's own where the table splits its bucket by the layer whose
    weight has `weight_dims` (the two dims, either way round)."""
    bucket = shape_bucket(M, N, K)
    if weight_dims is not None:
        bucket = table_entry(TUNED_TABLE, bucket, layer_class(*weight_dims))
    return config_from_table(TUNED_TABLE, TUNABLE_SPACE, bucket)


def buckets_for(dims: Mapping[str, int], variant: str = "default") -> set[str]:
    """Table entries a Linear layer's step of these dims uses: forward [M, N], dgrad [M, K], wgrad [N, K]."""
    M, N, K = dims["M"], dims["N"], dims["K"]
    return {table_entry(TUNED_TABLE, shape_bucket(*mnk), shape_class(dims)) for mnk in ((M, N, K), (M, K, N), (N, K, M))}


def fits(cfg: Mapping[str, int]) -> bool:
    """Whether a config fits in shared memory (bf16/fp16 operands, a bf16 output tile staged for the TMA
    store); the search skips the rest."""
    return fits_shared_memory(cfg, element_size=2, out_element_size=2)
