"""Tiled-GEMM pieces every GEMM family shares: the launch config of a tuned-table bucket, its
validation against the declared tunable space, its shared-memory footprint, and the grouped-M
tile order."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import MISSING, dataclass, fields

import triton
import triton.language as tl

from kernels.common.device import SHARED_MEMORY_BYTES


@dataclass(frozen=True)
class TileConfig:
    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int
    num_warps: int
    num_stages: int
    # 1: the pass runs on the warp-specialized FP8 kernel (kernels/common/blockwise_ws.py) where that takes the
    # call; 0: on the Triton kernels. Held only by the FP8 buckets whose pass that kernel can run.
    WS: int = 0


# Knobs every bucket holds, and those only some do (their default elsewhere: the search never adds a knob to a
# bucket, agent/config_space.py).
KNOBS: tuple[str, ...] = tuple(f.name for f in fields(TileConfig) if f.default is MISSING)
BUCKET_KNOBS: tuple[str, ...] = tuple(f.name for f in fields(TileConfig) if f.default is not MISSING)


def config_from_table(
    table: Mapping[str, Mapping[str, int]], space: Mapping[str, tuple[int, ...]], bucket: str
) -> TileConfig:
    """The table's config for `bucket`, refused if a knob is missing or outside the tunable space."""
    cfg = table[bucket]
    held = KNOBS + tuple(knob for knob in BUCKET_KNOBS if knob in cfg)
    for knob in held:
        if cfg.get(knob) not in space.get(knob, ()):
            raise ValueError(f"tuned table {bucket}: {knob}={cfg.get(knob)} is outside the tunable space "
                             f"{space.get(knob, ())}")
    return TileConfig(**{knob: cfg[knob] for knob in held})


# Shape keys a RememberedConfigs keeps before it starts over: a training run asks about a handful.
REMEMBERED_CONFIGS = 256


class RememberedConfigs:
    """A tuned table's configs by shape key (plain ints and strings), for the launchers that ask the same
    question every microbatch: naming the entry and validating it cost 3 us a call on the development CPU,
    twice that on the lent H100's host, six calls a MoE step. A remembered config is served only while the
    table still holds, under the entry's name, what it was made from and as many entries (the campaign's
    trials swap entries in memory; a test adds a split entry), else it is looked up again."""

    def __init__(self) -> None:
        self.known: dict[Hashable, tuple[int, str, dict[str, int], TileConfig]] = {}

    def config(self, table: Mapping[str, Mapping[str, int]], space: Mapping[str, tuple[int, ...]], key: Hashable,
               entry: Callable[[], str]) -> TileConfig:
        """The config of `key`, whose table entry `entry()` names, as config_from_table gives it."""
        known = self.known.get(key)
        if known is not None and known[0] == len(table) and table.get(known[1]) == known[2]:
            return known[3]
        name = entry()
        cfg = config_from_table(table, space, name)
        if len(self.known) >= REMEMBERED_CONFIGS:
            self.known.clear()
        self.known[key] = (len(table), name, dict(table[name]), cfg)
        return cfg


def layer_class(dim_a: int, dim_b: int) -> str:
    """A layer's shape class: its weight's two dims, larger first ("4096x1536"), whichever way round a pass
    holds them, so that every pass of one layer has the same class."""
    return f"{max(dim_a, dim_b)}x{min(dim_a, dim_b)}"


def weight_class(dims: Mapping[str, int]) -> str:
    """The layer class of a benchmark shape (a Linear layer's or an expert stack's dims: its weight's N and K):
    what the ops' tuned tables split a bucket on (their `shape_class`)."""
    return layer_class(dims["N"], dims["K"])


def table_entry(table: Mapping[str, Mapping[str, int]], bucket: str, shape_class: str) -> str:
    """The entry a shape uses: `<bucket> <shape class>` where the table splits the bucket so (shapes that
    disagree within it get their own config), else the bucket's."""
    specific = f"{bucket} {shape_class}"
    return specific if specific in table else bucket


def fits_shared_memory(cfg: Mapping[str, int], element_size: int, out_element_size: int = 0) -> bool:
    """Whether a software-pipelined mainloop (an A and a B tile per stage), plus the output tile a TMA
    store stages (`out_element_size` bytes per element; 0 for direct stores), fits a Hopper SM's shared memory."""
    tile = (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * element_size
    epilogue = cfg["BLOCK_M"] * cfg["BLOCK_N"] * out_element_size
    return tile * cfg["num_stages"] + epilogue <= SHARED_MEMORY_BYTES


@triton.jit
def grouped_tile(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """(row, column) of the `tile`-th output tile in grouped-M order: GROUP_M row bands walk the
    column tiles together, so the A and B tiles they read stay in L2."""
    band = GROUP_M * num_n
    first_m = (tile // band) * GROUP_M
    band_m = min(num_m - first_m, GROUP_M)
    return first_m + (tile % band) % band_m, (tile % band) // band_m
