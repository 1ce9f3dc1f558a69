"""attention: the tunable space and the tuned table ((pass, head dim) bucket -> launch config).

The campaign's search proposer rewrites TUNED_TABLE: keep it a plain literal, one bucket a line.
A bucket is a pass (`fwd`, `fwd_fp8`: the FP8 forward, `bwd_kv`: dK/dV per K/V block, `bwd_q`: dQ per
Q block) and the padded head dim (the larger of the q/k and v head dims, rounded up to a power of two:
MLA's 192/128 runs in the d256 buckets). BLOCK_M tiles queries and BLOCK_N keys in every pass.
TMA 1 streams the pass's tiles through tensor descriptors instead of pointers (kernel.py's docstring;
tensors without a [rows, heads x head dim] view fall back to pointers). WS 1: that pass runs on its
warp-specialized Gluon kernel (hopper_ws.py) wherever it serves the problem: the forward and the dQ pass on
128-row query blocks on two consumer warpgroups (the forward WS_BLOCK_N keys a stage; the dQ pass 64),
and in the dK/dV buckets the fused backward (128 keys a CTA, 64 at d256; dQ by TMA reductions: no dQ pass
runs, and the bwd_q bucket goes unused). The bucket's other knobs are the Triton kernel's, which runs the
rest (packed, windowed, MLA problems; the dQ pass at d256; `deterministic`), but WS_BLOCK_N and WS_STAGES,
in the forward buckets only: the warp-specialized forward's keys a stage and the depth of its K/V ring
(hopper_ws.BLOCK_NS; `fits` holds the ring to an SM's shared memory). DQ_ATOMIC, in the
dK/dV buckets only, 1: the Triton dK/dV pass also adds dQ atomically into an fp32 buffer and the dQ pass
does not run (5 block matmuls per step of the backward instead of 7, at the cost of fp32 atomics and
bit-exact repeats; the bwd_q bucket then goes unused). LAZY, in the forward buckets only, 1: the
warp-specialized forward moves a row's running max only when a key block's rises past it by more than 2^8
(hopper_ws.RESCALE_ABOVE; 2^4 in FP8, hopper_ws.FP8_RESCALE_ABOVE, where P must stay inside E4M3), and
rescales its output tile only after a block that moved some row's max: FlashAttention-4's lazy rescale, exact
either way (the Triton forward always rescales). HEAD_DIM and
ELEMENT_BYTES are no knobs (the search never moves them): they tell `fits` the bucket's head dim and operand
width.

Starting points were the Triton fused-attention tutorial's Hopper choices (a 128x64 forward tile with 3
stages; narrow query blocks against wide key blocks for dK/dV, the transpose for dQ; smaller tiles at
d256) and, for the FP8 forward, the tiles that compile for sm_90a with the fewest register spills. Tuned
on the H100 (2026-11-24, docs/performance.md "The attention table tuned on the H100"): dQ at d128 by the
preset campaign (BLOCK_N 64, +5.2% step); the d256 forward and dQ (4 warps, TMA: +12.5%, +29.6%) and
the d64 dK/dV pass (64x64, TMA, DQ_ATOMIC: +17.3%) by halving searches. TMA and DQ_ATOMIC stay off
where the searches did not choose them (at d128 TMA is a wash and atomic dQ 0.85-0.89x). WS (2026-11-25,
benchmarks/attention_ab.py): the forward on at every head dim (1.25-1.6x the Triton forward), the dQ pass
at d128 (the backward 1.04-1.08x; 0.99-1.02x at d64, left off), the fused backward at every head dim (the
backward 1.19-1.27x the two-pass one with the WS dQ pass at d128, 1.02-1.07x at d64, 1.6-1.9x the Triton
two-pass one at d256). LAZY (2026-11-27, attention_ab.py, two calls of 101 and 151 rounds in shuffled order,
H100): on at d128 and d256 (the warp-specialized forward 1.025-1.027x and 1.021-1.038x non-causal, 0.999-1.038x
causal), off at d64 (0.95-0.97x). The same change in the Triton forward ran 0.89-0.96x at d128 and d256
(1.07-1.09x at d64; its FP8 forward 0.92-0.96x; H200): it stays out of them. The FP8 forward's WS and LAZY (2026-11-27,
attention_ab.py --pass fp8, 5 shuffled rounds, H100, E4M3 q, k and v quantized outside the timing, v's keys in
the E4M3 operand's order): WS on at every head dim, the warp-specialized kernel 1.256-1.264x our bf16 forward at
d256 (the Triton FP8 kernel 0.534-0.564x), 0.997-1.016x at d128 (0.860-0.877x), 0.877-0.919x at d64
(0.856-0.897x), 1.015x on llama3-8b's GQA (0.948x). Since P goes into the PV product without its bytes unpacked
and packed again (2026-11-28, scratch A/B in 7 shuffled rounds, H100): LAZY on at d128 (1.234 / 1.197x our bf16
forward, non-causal / causal, against 1.200 / 1.145x off) and d256 (1.445 / 1.430x against 1.402 / 1.377x), off at
d64 (0.924 / 1.044x against 0.988 / 1.025x). WS_BLOCK_N and WS_STAGES (attention_ab.py, H100): 128 keys a stage
(1.13-1.18x the throughput of 64 at 3 or 4 stages at d128), 64 at d256 (two stages of 128 do not fit); bf16 at d64
3 stages (4: 0.88-0.96x, 2: 0.95-0.98x), at d128 2 (3: 0.98x), at d256 2 (3 do not fit); FP8 at d256 3 (2 and 4
0.987-1.007x of it), at d128 2 (3: 0.99-1.00x), at d64 2 (since P reaches the PV product in fp32, 2026-11-28: 3
stages 0.993 / 0.972x of 2, non-causal / causal).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kernels.attention import hopper_ws
from kernels.common.device import SHARED_MEMORY_BYTES

TUNABLE_SPACE: dict[str, tuple[int, ...]] = {
    "BLOCK_M": (16, 32, 64, 128),
    "BLOCK_N": (16, 32, 64, 128),
    "num_warps": (4, 8),
    "num_stages": (1, 2, 3, 4, 5),
    "TMA": (0, 1),
    "DQ_ATOMIC": (0, 1),
    "WS": (0, 1),
    "LAZY": (0, 1),
    "WS_BLOCK_N": (64, 128),  # hopper_ws.BLOCK_NS
    "WS_STAGES": (2, 3, 4),
}

TUNED_TABLE: dict[str, dict[str, int]] = {
    "fwd-d64": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "TMA": 0, "WS": 1, "LAZY": 0, "WS_BLOCK_N": 128, "WS_STAGES": 3, "HEAD_DIM": 64},
    "fwd-d128": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "TMA": 0, "WS": 1, "LAZY": 1, "WS_BLOCK_N": 128, "WS_STAGES": 2, "HEAD_DIM": 128},
    "fwd-d256": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "TMA": 1, "WS": 1, "LAZY": 1, "WS_BLOCK_N": 64, "WS_STAGES": 2, "HEAD_DIM": 256},
    "bwd_kv-d64": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 4, "TMA": 1, "DQ_ATOMIC": 1, "WS": 1, "HEAD_DIM": 64},
    "bwd_kv-d128": {"BLOCK_M": 32, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "TMA": 0, "DQ_ATOMIC": 0, "WS": 1, "HEAD_DIM": 128},
    "bwd_kv-d256": {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2, "TMA": 0, "DQ_ATOMIC": 0, "WS": 1, "HEAD_DIM": 256},
    "bwd_q-d64": {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 4, "num_stages": 3, "TMA": 0, "WS": 0, "HEAD_DIM": 64},
    "bwd_q-d128": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "TMA": 0, "WS": 1, "HEAD_DIM": 128},
    "bwd_q-d256": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "TMA": 1, "WS": 0, "HEAD_DIM": 256},
    "fwd_fp8-d64": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "TMA": 0, "WS": 1, "LAZY": 0, "WS_BLOCK_N": 128, "WS_STAGES": 2, "HEAD_DIM": 64, "ELEMENT_BYTES": 1},
    "fwd_fp8-d128": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "TMA": 0, "WS": 1, "LAZY": 1, "WS_BLOCK_N": 128, "WS_STAGES": 2, "HEAD_DIM": 128, "ELEMENT_BYTES": 1},
    "fwd_fp8-d256": {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 8, "num_stages": 2, "TMA": 0, "WS": 1, "LAZY": 1, "WS_BLOCK_N": 64, "WS_STAGES": 3, "HEAD_DIM": 256, "ELEMENT_BYTES": 1},
}

PASSES: tuple[str, ...] = ("fwd", "bwd_kv", "bwd_q")
# Knobs of some passes only, held by their buckets alone (the search never adds a knob to a bucket).
PASS_KNOBS: dict[str, tuple[str, ...]] = {"DQ_ATOMIC": ("bwd_kv",), "WS": ("fwd", "fwd_fp8", "bwd_kv", "bwd_q"),
                                          "LAZY": ("fwd", "fwd_fp8"), "WS_BLOCK_N": ("fwd", "fwd_fp8"),
                                          "WS_STAGES": ("fwd", "fwd_fp8")}
# The variant whose forward runs in FP8 (E4M3 q, k, v with per-head scales); its backward is the bf16 one.
FP8_VARIANT = "e4m3-forward"


@dataclass(frozen=True)
class AttentionConfig:
    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int
    TMA: int
    DQ_ATOMIC: int = 0
    WS: int = 0
    LAZY: int = 0
    WS_BLOCK_N: int = 0
    WS_STAGES: int = 0


def padded_head_dim(head_dim_qk: int, head_dim_v: int) -> int:
    """The register width of the widest operand: the head dims' max, rounded up to a power of two."""
    return 1 << (max(head_dim_qk, head_dim_v) - 1).bit_length()


def bucket(pass_: str, head_dim_qk: int, head_dim_v: int) -> str:
    return f"{pass_}-d{padded_head_dim(head_dim_qk, head_dim_v)}"


def config_for(pass_: str, head_dim_qk: int, head_dim_v: int) -> AttentionConfig:
    """The table's config of a pass at these head dims, refused if a knob lies outside the tunable space
    (or is missing: every bucket holds every knob but those of other passes, PASS_KNOBS)."""
    name = bucket(pass_, head_dim_qk, head_dim_v)
    cfg = TUNED_TABLE[name]
    knobs = [knob for knob in TUNABLE_SPACE if pass_ in PASS_KNOBS.get(knob, (pass_,))]
    for knob in knobs:
        if cfg.get(knob) not in TUNABLE_SPACE[knob]:
            raise ValueError(f"tuned table {name}: {knob}={cfg.get(knob)} is outside the tunable space "
                             f"{TUNABLE_SPACE[knob]}")
    return AttentionConfig(**{knob: cfg[knob] for knob in knobs})


def buckets_for(dims: Mapping[str, int], variant: str = "default") -> set[str]:
    """Buckets an attention step of these dims uses: the forward (FP8 in FP8_VARIANT) and both backward passes."""
    d, dv = dims["D"], dims.get("Dv", dims["D"])
    passes = ("fwd_fp8", *PASSES[1:]) if variant == FP8_VARIANT else PASSES
    return {bucket(pass_, d, dv) for pass_ in passes}


def shared_memory_bytes(cfg: Mapping[str, int]) -> int:
    """An upper bound on the shared memory a pass's config takes: two tiles (q and dO in the dK/dV pass,
    whose buckets alone hold DQ_ATOMIC; k and v in the forward and dQ) per pipeline stage, the two tiles
    of the other side it keeps, each as wide as the bucket's head dim, of ELEMENT_BYTES (2 unless the bucket
    says: fp8, 1); in the dK/dV pass each stage's fp32 LSE and delta of its query rows too, and with
    DQ_ATOMIC a fp32 dQ tile; 8 KiB for the rest. Checked against the
    allocations of Triton 3.6 (sm_90a, 200 configs compiled without a GPU, 2026-11-24): never under them;
    over them by up to one stage (where Triton keeps stages - 1 buffers) or one kept tile (the forward keeps
    q alone)."""
    dkdv_pass = "DQ_ATOMIC" in cfg
    streamed, kept = (cfg["BLOCK_M"], cfg["BLOCK_N"]) if dkdv_pass else (cfg["BLOCK_N"], cfg["BLOCK_M"])
    rows = 2 * streamed * cfg["num_stages"] + 2 * kept
    dq_tile = cfg["BLOCK_M"] * 4 if cfg.get("DQ_ATOMIC") else 0
    row_statistics = 2 * 4 * cfg["BLOCK_M"] * cfg["num_stages"] if dkdv_pass else 0
    return (rows * cfg.get("ELEMENT_BYTES", 2) + dq_tile) * cfg["HEAD_DIM"] + row_statistics + 8192


def fits(cfg: Mapping[str, int]) -> bool:
    """Whether the GPU can run a config well (the search skips the rest): it fits a Hopper SM's shared
    memory (`shared_memory_bytes`), DQ_ATOMIC has query blocks of 64 rows or more, an FP8 forward's key
    blocks hold whole 32-key blocks (v's keys are ordered within them: kernel.key_position), WS is on only at
    the head dims the pass's warp-specialized kernel serves (the fused backward's in the dK/dV buckets), and the
    warp-specialized forward's K/V ring (WS_BLOCK_N keys, WS_STAGES deep) fits beside its q tile."""
    if cfg.get("DQ_ATOMIC") and cfg["BLOCK_M"] < 64:
        return False  # dQ = dS K of 32 query rows is too short for wgmma: Triton falls back to mma.sync
    if cfg.get("ELEMENT_BYTES") == 1 and cfg["BLOCK_N"] % 32:
        return False
    ws_head_dims = hopper_ws.BWD_HEAD_DIMS if "DQ_ATOMIC" in cfg else hopper_ws.HEAD_DIMS
    if cfg.get("WS") and cfg["HEAD_DIM"] not in ws_head_dims:
        return False
    if "WS_STAGES" in cfg and cfg["HEAD_DIM"] in hopper_ws.HEAD_DIMS and hopper_ws.shared_bytes(
            cfg["HEAD_DIM"], cfg["WS_BLOCK_N"], cfg["WS_STAGES"], cfg.get("ELEMENT_BYTES", 2)) > SHARED_MEMORY_BYTES:
        return False
    return shared_memory_bytes(cfg) <= SHARED_MEMORY_BYTES
