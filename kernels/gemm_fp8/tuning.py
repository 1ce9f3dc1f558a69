"""gemm_fp8: the tunable space and the tuned table (pass/bucket -> launch config).

The campaign's search proposer rewrites TUNED_TABLE: keep it a plain literal, one bucket a line.
Buckets by output area (small up to 2048 x 2048), with a `/blockwise` twin. BLOCK_K is 128:
blockwise promotes once per 128-wide K block, and fp8 rows want 128 bytes. A bucket whose layers disagree
is split by an entry `<bucket> <layer class>` (kernels/common/tiles.py, `layer_class`: the weight's two
dims), that layer's own config, as the grouped ops' tables are.

On Hopper a bucket with WS 1 and a config with BLOCK_M 128 and 8 warps runs the warp-specialized kernel
of kernels/common/blockwise_ws.py (two 64-row consumer warpgroups: the same tile and warps; the wgrad as
its token reduction); the rest run the Triton kernels (blockwise at BLOCK_N <= 128). The blockwise
buckets hold WS 1. The rowwise ones hold 0: on that kernel (scaled in the epilogue) the llama3 Linear
microbatches ran 0.92-1.03x (the forward on it 0.99-1.03x, every pass 0.92-0.96x; graphed, H200, 2026-11-28,
docs/performance.md), so the dense TMA kernel keeps them and the search may move them. The forward and
the dgrad take 128x256 tiles there (dense 8192^3 1.19x its 128x128, 3 stages best; at 2048 x 2048 x
8192, the small bucket, 434 TFLOPS against 389 on 128x128, 3 and 4 stages alike, and 3 leave room for a
TMA-store epilogue in `fits`: benchmarks/blockwise_ab.py, H100 2026-11-25). The large wgrad too, since the
token reduction keeps one rescaled accumulator at 256 wide (8192^3: 894 / 873 TFLOPS fresh / adding into a
bf16 main_grad against 675 / 643 on 128x128; 3 stages, the most that fit; the small bucket stays 128x128,
untested at 256 on dense shapes).
"""

from __future__ import annotations

from collections.abc import Mapping

from kernels.common.fp8 import Granularity
from kernels.common.tiles import RememberedConfigs, TileConfig, fits_shared_memory, layer_class, table_entry
from kernels.common.tiles import weight_class as shape_class  # what the search may split a bucket on

PASSES = ("fwd", "dgrad", "wgrad")
SMALL_AREA = 2048 * 2048

TUNABLE_SPACE: dict[str, tuple[int, ...]] = {
    "BLOCK_M": (64, 128, 256),
    "BLOCK_N": (64, 128, 256),
    "BLOCK_K": (128,),
    "GROUP_M": (1, 4, 8, 16),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4, 5),
    "WS": (0, 1),
}

TUNED_TABLE: dict[str, dict[str, int]] = {
    "fwd/small": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 4, "WS": 0},
    "fwd/large": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "WS": 0},
    "dgrad/small": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 4, "WS": 0},
    "dgrad/large": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "WS": 0},
    "wgrad/small": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 4, "WS": 0},
    "wgrad/large": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "WS": 0},
    "fwd/small/blockwise": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "WS": 1},
    "fwd/large/blockwise": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "WS": 1},
    "dgrad/small/blockwise": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "WS": 1},
    "dgrad/large/blockwise": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "WS": 1},
    "wgrad/small/blockwise": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 4, "WS": 1},
    "wgrad/large/blockwise": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "WS": 1},
}


def bucket(pass_name: str, rows: int, cols: int, granularity: Granularity) -> str:
    """The tuned-table key of a pass whose output is [rows, cols]."""
    key = f"{pass_name}/{'small' if rows * cols <= SMALL_AREA else 'large'}"
    return f"{key}/blockwise" if granularity == Granularity.BLOCKWISE else key


_CONFIGS = RememberedConfigs()


def config_for(pass_name: str, rows: int, cols: int, granularity: Granularity,
               weight_dims: tuple[int, int]) -> TileConfig:
    """The config of a pass whose output is [rows, cols], of a Linear layer whose weight has `weight_dims` (the two
    dims, either way round)."""
    dim_a, dim_b = weight_dims
    return _CONFIGS.config(
        TUNED_TABLE, TUNABLE_SPACE, (pass_name, rows, cols, granularity, dim_a, dim_b),
        lambda: table_entry(TUNED_TABLE, bucket(pass_name, rows, cols, granularity), layer_class(dim_a, dim_b)))


def buckets_for(dims: Mapping[str, int], variant: str = "e4m3-rowwise") -> set[str]:
    """Table entries a Linear layer's fwd+bwd step uses: forward [M, N], dgrad [M, K], wgrad [N, K]."""
    granularity = Granularity(variant.split("-")[1])
    M, N, K = dims["M"], dims["N"], dims["K"]
    outputs = {"fwd": (M, N), "dgrad": (M, K), "wgrad": (N, K)}
    return {table_entry(TUNED_TABLE, bucket(p, *outputs[p], granularity), shape_class(dims)) for p in PASSES}


def fits(cfg: Mapping[str, int]) -> bool:
    """Whether a config fits in shared memory (fp8 operands: 1 byte; a bf16 output tile staged for the TMA
    store); the search skips the rest."""
    return fits_shared_memory(cfg, element_size=1, out_element_size=2)
