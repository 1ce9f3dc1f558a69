"""grouped_gemm_fp8: the tunable space and the tuned table (pass/bucket -> launch config).

The campaign's search proposer rewrites TUNED_TABLE: keep it a plain literal, one bucket a line.
Buckets (and their splits by layer) as in kernels/grouped_gemm/tuning.py, with a `/blockwise` twin.
BLOCK_K is 128: blockwise scaling promotes once per 128-wide K block, and fp8 tiles want 128 bytes
of K per row anyway.

The short-K wgrad buckets (`wgrad/small*`: groups under SMALL_WGRAD_TOKENS = 2048 tokens, the MoE
training step's GPT-OSS and DeepSeek-V3 experts) run 4-warp tiles: two programs share an SM, so one's read-modify-write of a
main_grad tile overlaps the other's mainloop (`benchmarks/grouped_passes.py --sweep rowwise
--sweep-pass wgrad`, H100 2026-11-24: 1.17-1.34x the 8-warp tile when accumulating at 512 tokens,
within 3% without). At 1024 tokens (DeepSeek-V3's 32 x 1024) the same tiles beat the large bucket's
128x256 too (rowwise accumulating 1.12-1.19x, fresh -1.5% to +4.5%; blockwise 64x128 1.07-1.14x
accumulating), while at 2048 (Qwen3's 16 x 2048) the large bucket is still the better fresh, so the
wgrad's boundary sits at 2048 tokens where the forward's and dgrad's (whose tokens are M, not the
reduction) stays at grouped_gemm's 1024.

On Hopper a bucket with WS 1 (every blockwise one) and a config with BLOCK_M 128 and 8 warps runs the
warp-specialized kernel of kernels/common/blockwise_ws.py (two 64-row consumer warpgroups: the same tile
and warps). The rowwise buckets hold WS 0: there the MoE microbatches ran 0.98-1.03x (DeepSeek-V3 1.025x,
Qwen3 and GPT-OSS 0.98-0.99x; graphed, H200, 2026-11-28, docs/performance.md), within two points of the
Triton kernels, which keep them until the search finds otherwise. Blockwise passes elsewhere run the Triton
kernels, whose second fp32 tile (each K block's product before its scales) spills registers at 128x256. The forward and the dgrad take 128x256 tiles, which that kernel's one
rescaled accumulator affords: 1.13-1.28x its 128x128 on DeepSeek-V3's GateUP and Down and Qwen3's
Down, 3 stages best, also in the small buckets (DeepSeek-V3's GateUP at 32 x 512 tokens: 1035 TFLOPS
against 970 at 4 stages and 907 on 128x128; `blockwise_ab.py`, H100 2026-11-25); the MoE loop's
blockwise microbatch went 1.155 / 1.079 / 1.225x bf16 -> 1.240 / 1.177 / 1.273x (DeepSeek-V3 / Qwen3 /
GPT-OSS, same call). The wgrad runs as the kernel's token reduction: its small bucket is 128x128 with 8
warps, not the Triton kernel's 64x128 with 4, which ran DeepSeek-V3's 32 x 512 and 32 x 1024 GateUP
wgrads 1.09-1.22x slower, fresh and adding into a main_grad; its large bucket 128x256, 3 stages, since
the token reduction keeps one rescaled accumulator there: Qwen3's 16 x 2048 GateUP / Down wgrads adding
into a bf16 main_grad 688 / 611 TFLOPS against 606 / 538 on 128x128 (fresh 799 / 683 against 673 /
604). At DeepSeek-V3's 32 x 512 adding into a main_grad 128x256 ran 0.91x 128x128 (387 against 426;
32 x 1024: 1.05x, fresh 1.04-1.09x), so the small bucket stays (`blockwise_ab.py --pass wgrad`, H100
2026-11-25).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kernels.common.fp8 import Granularity
from kernels.common.tiles import RememberedConfigs, TileConfig, fits_shared_memory, layer_class, table_entry
from kernels.grouped_gemm.tuning import PASSES, SMALL_GROUP_TOKENS, bucket, shape_class

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
    "fwd/small": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 4, "WS": 0},
    "fwd/large": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "WS": 0},
    "dgrad/small": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 4, "WS": 0},
    "dgrad/large": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "WS": 0},
    "wgrad/small": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 4, "num_stages": 3, "WS": 0},
    "wgrad/large": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "WS": 0},
    "fwd/small/blockwise": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "WS": 1},
    "fwd/large/blockwise": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "WS": 1},
    "dgrad/small/blockwise": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "WS": 1},
    "dgrad/large/blockwise": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "WS": 1},
    "wgrad/small/blockwise": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 4, "WS": 1},
    "wgrad/large/blockwise": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "WS": 1},
}


# The wgrad reduces over each group's tokens: below this many per group its K loop is short and the
# small bucket's 4-warp tiles win (see above).
SMALL_WGRAD_TOKENS = 2048


def _key(pass_name: str, total_tokens: int, groups: int, granularity: Granularity) -> str:
    small = SMALL_WGRAD_TOKENS if pass_name == "wgrad" else SMALL_GROUP_TOKENS
    key = bucket(pass_name, total_tokens, groups, small)
    return f"{key}/blockwise" if granularity == Granularity.BLOCKWISE else key


_CONFIGS = RememberedConfigs()


def config_for(pass_name: str, total_tokens: int, groups: int, granularity: Granularity,
               weight_dims: Sequence[int]) -> TileConfig:
    """The config of a pass over `groups` weights of `weight_dims` (the two dims, either way round)."""
    dim_a, dim_b = weight_dims
    return _CONFIGS.config(
        TUNED_TABLE, TUNABLE_SPACE, (pass_name, total_tokens, groups, granularity, dim_a, dim_b),
        lambda: table_entry(TUNED_TABLE, _key(pass_name, total_tokens, groups, granularity), layer_class(dim_a, dim_b)))


def buckets_for(dims: Mapping[str, int], variant: str = "e4m3-rowwise") -> set[str]:
    """Table entries a fwd+bwd step of these dims uses under a variant such as "hybrid-blockwise"."""
    granularity = Granularity(variant.split("-")[1])
    return {table_entry(TUNED_TABLE, _key(p, dims["B"] * dims["M"], dims["B"], granularity), shape_class(dims))
            for p in PASSES}


def fits(cfg: Mapping[str, int]) -> bool:
    """Whether a config fits in shared memory (fp8 operands: 1 byte); the search skips the rest."""
    return fits_shared_memory(cfg, element_size=1)
