"""Token permute / unpermute for MoE layers: kernels, launchers and autograd Functions as one story.

    from kernels.moe import permute, unpermute
    p = permute(tokens, expert_ids, probs, num_experts=E, pad_to=128)   # tokens sorted by expert
    h = grouped_gemm_fp8(p.permuted, w, p.group_lens)                    # the expert GEMMs
    out = unpermute(h, p.row_map, probs)                                 # sum_k probs[t, k] * h[row(t, k)]

Routing on the GPU, no host sync (CUDA-graph safe, nothing specialized on the routing):
1. `_rank_kernel`: per block of (token, k) pairs in flat order t*topk + k, each pair's rank among the
   block's earlier pairs of its expert, and the block's count per expert: the block's pairs sorted by
   (expert, position), then a count along each expert's run (no atomics, so the order within an
   expert is the token order, and the work does not grow with the number of experts).
2. `_scan_kernel` (a program per SCAN_EXPERTS experts): the exclusive scan of those counts over blocks
   per expert, the tokens per expert and their padded sizes (group_lens); the program that finishes
   last writes the groups' offsets (group_offs), the scan of group_lens over all experts.
3. `_scatter_rows_kernel`: one program per token computes the rows of its topk copies
   (group_offs[e] + the block's offset + the rank) and writes them to the row map, then copies the
   token: its row read once (up to 8192 columns at a time) and stored whole to each of its topk rows.
   More programs of the same launch zero the rows no pair fills (each expert's padding, and the tail
   past the last group), so a grouped GEMM over the whole capacity reads zeros there.

The output capacity comes from host-known sizes only: T*topk, plus num_experts*(pad_to-1) when
padded. unpermute (and permute's backward) is `_gather_rows_kernel`, one program per token summing
its topk rows in fp32; unpermute's backward is the scatter kernel again (probs * grad_out to each row,
and <grad_out[t], permuted[row]> for the probabilities' gradient).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.common.device import cdiv, check_same_device, next_power_of_2
from kernels.common.launch import fast_launch

TOKEN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ID_DTYPES = (torch.int32, torch.int64)
PAD_TO = (1, 16, 128)
# Most (token, k) pairs per program of the rank kernel (see rank_block).
BLOCK_PAIRS = 1024
# Elements of one [blocks, experts] tile of the scan kernel: 32 registers a thread at 8 warps.
TILE_ELEMENTS = 8192
# Experts a scan program takes. One program for all 256 of DeepSeek-V3's walked its 128 rank blocks in four
# dependent tiles: 9.2 us of a 4096-token permute's 205 (3.7 us at 32 experts; H100, torch.profiler).
SCAN_EXPERTS = 32
# The scatter holds a token's row, up to 8192 columns, and stores it whole to each of its topk rows: one
# load for topk stores, 16-byte accesses (8 warps: 32 bf16 a thread). Loading 1024 columns at a time and
# storing [topk, 1024] tiles moved 2-4% fewer bytes a second (H100, DeepSeek-V3 sizes, 2026-11-25).
SCATTER_BLOCK_H = 8192
# The gather (unpermute, permute's backward) and the weighted scatter (unpermute's backward) work on
# [topk, 1024] tiles on 4 warps: 0.92-1.00x of a copy (docs/performance.md, Q); the weighted scatter
# 5% slower holding whole rows (its dot products then reduce across the program once per row).
TILE_BLOCK_H = 1024
TILE_WARPS = 4
ZERO_ROWS, ZERO_BLOCK_H = 8, 1024  # the tile a zeroing program writes at a time


# --- kernels ----------------------------------------------------------------------------------------


@triton.jit
def _same_expert_count(expert_a, count_a, expert_b, count_b):
    """Scan operator over pairs sorted by expert: a run of one expert keeps counting, a new one restarts.
    Associative on sorted input: when two adjacent ranges end on the same expert, the right one holds
    only that expert."""
    return expert_b, tl.where(expert_a == expert_b, count_a + count_b, count_b)


@fast_launch
@triton.jit
def _rank_kernel(ids_ptr, rank_ptr, block_counts_ptr, arrivals_ptr, n_pairs, E,
                 E_PAD: tl.constexpr, BLOCK_PAIRS: tl.constexpr):
    """rank[i] = how many earlier pairs of i's block have i's expert; block_counts[block, e] = the
    block's pairs of expert e. The block's pairs are sorted by (expert, position) as one key, and a
    scan along each expert's run counts them from both ends: the forward count less one is the rank,
    and where it is 1 (the run's first pair) both counts together give the run's length. Ids outside
    [0, E) sort as expert E, whose count is never stored (the scatter kernel drops those pairs).
    Block 0 also zeroes the scan kernel's arrival counter."""
    block = tl.program_id(0)
    if block == 0:
        tl.store(arrivals_ptr, 0)
    local = tl.arange(0, BLOCK_PAIRS)
    pairs = block * BLOCK_PAIRS + local
    e = tl.load(ids_ptr + pairs, mask=pairs < n_pairs, other=-1)
    e = tl.where((e >= 0) & (e < E), e, E).to(tl.int32)
    key = tl.sort(e * BLOCK_PAIRS + local)  # unique keys: the sort is stable by construction
    expert = key // BLOCK_PAIRS
    pair = block * BLOCK_PAIRS + key % BLOCK_PAIRS
    ones = tl.full((BLOCK_PAIRS,), 1, tl.int32)
    _, upto = tl.associative_scan((expert, ones), 0, _same_expert_count)
    _, onwards = tl.associative_scan((expert, ones), 0, _same_expert_count, reverse=True)
    tl.store(rank_ptr + pair, upto - 1, mask=pair < n_pairs)
    experts = tl.arange(0, E_PAD)
    tl.store(block_counts_ptr + block * E + experts, tl.zeros((E_PAD,), tl.int32), mask=experts < E)
    tl.debug_barrier()  # the zeros land before the counts of the experts the block has
    tl.store(block_counts_ptr + block * E + expert, upto + onwards - 1, mask=(upto == 1) & (expert < E))


@fast_launch
@triton.jit
def _scan_kernel(block_counts_ptr, block_offs_ptr, counts_ptr, lens_ptr, offs_ptr, arrivals_ptr, n_blocks, E, pad_to,
                 E_PAD: tl.constexpr, E_TILE: tl.constexpr, BLOCK_B: tl.constexpr, SPLIT: tl.constexpr):
    """Program p, experts [p E_TILE, (p + 1) E_TILE): block_offs[b, e] = pairs of expert e in blocks
    before b; counts[e] = all of them; lens[e] = counts[e] rounded up to pad_to. offs = [0, cumsum(lens)]
    over every expert: written by the only program, or (SPLIT) by the last to finish, counted on
    `arrivals` (zeroed by the rank kernel before this launch)."""
    experts = tl.program_id(0) * E_TILE + tl.arange(0, E_TILE)
    e_mask = experts < E
    total = tl.zeros((E_TILE,), dtype=tl.int32)
    for b0 in range(0, n_blocks, BLOCK_B):
        blocks = b0 + tl.arange(0, BLOCK_B)
        mask = (blocks < n_blocks)[:, None] & e_mask[None, :]
        ptrs = blocks[:, None] * E + experts[None, :]
        c = tl.load(block_counts_ptr + ptrs, mask=mask, other=0)
        tl.store(block_offs_ptr + ptrs, tl.cumsum(c, axis=0) - c + total[None, :], mask=mask)
        total += tl.sum(c, axis=0)
    lens = ((total + pad_to - 1) // pad_to * pad_to).to(tl.int64)
    tl.store(counts_ptr + experts, total.to(tl.int64), mask=e_mask)
    tl.store(lens_ptr + experts, lens, mask=e_mask)
    if SPLIT:
        tl.debug_barrier()  # every thread's lens stored before this program's arrival counts
        # acq_rel (Triton's default): the programs that arrived before released their lens to this one
        if tl.atomic_add(arrivals_ptr, 1) == tl.num_programs(0) - 1:
            every = tl.arange(0, E_PAD)
            _store_offsets(offs_ptr, tl.load(lens_ptr + every, mask=every < E, other=0, volatile=True), every, E)
    else:
        _store_offsets(offs_ptr, lens, experts, E)


@triton.jit
def _store_offsets(offs_ptr, lens, experts, E):
    """offs[e] = the sum of lens before e, offs[E] = all of them (lens 0 past E)."""
    ends = tl.cumsum(lens, axis=0)
    tl.store(offs_ptr + experts, ends - lens, mask=experts < E)
    tl.store(offs_ptr + E, tl.sum(lens, axis=0))


@triton.jit
def _scatter_token(
    t, x_ptr, out_ptr, rows_ptr, ids_ptr, rank_ptr, offs_ptr, block_offs_ptr, w_ptr, w_out_ptr, other_ptr, dot_ptr,
    sources_ptr, H, K, E, stride_x, stride_out, stride_other,
    ROUTE: tl.constexpr, STORE: tl.constexpr, WEIGHT: tl.constexpr, SCATTER_W: tl.constexpr,
    DOT: tl.constexpr, SOURCES: tl.constexpr, BLOCK_PAIRS: tl.constexpr, K_PAD: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """Token t: STORE: out[row(t, k)] = x[t] for each k (times w[t, k] if WEIGHT).

    ROUTE (permute): row(t, k) = offs[e] + block_offs[block, e] + rank[t, k] is computed and written to
    rows (-1 for an expert id outside [0, E): that pair is dropped). Not in place over the ranks: the
    warps of a program load the ranks each in its own layout, and one warp's store could land before
    another's load. Otherwise rows holds row(t, k). SCATTER_W: w_out[row(t, k)] = w[t, k] (permute's
    probabilities). DOT: dot[t, k] = <x[t], other[row(t, k)]> in fp32 (unpermute's gradient of the
    probabilities). SOURCES: sources[row(t, k)] = t (the inverse map: which token each row copies).
    """
    t = t.to(tl.int64)
    ks = tl.arange(0, K_PAD)
    k_mask = ks < K
    pairs = t * K + ks
    if ROUTE:
        e = tl.load(ids_ptr + pairs, mask=k_mask, other=-1)
        valid = k_mask & (e >= 0) & (e < E)
        e = tl.where(valid, e, 0)
        rank = tl.load(rank_ptr + pairs, mask=valid, other=0)
        base = tl.load(offs_ptr + e, mask=valid, other=0)
        row = base + tl.load(block_offs_ptr + (pairs // BLOCK_PAIRS) * E + e, mask=valid, other=0) + rank
        row = tl.where(valid, row, -1)
        tl.store(rows_ptr + pairs, row.to(tl.int32), mask=k_mask)
    else:
        row = tl.load(rows_ptr + pairs, mask=k_mask, other=-1)
        valid = row >= 0
    row = row.to(tl.int64)
    if WEIGHT or SCATTER_W:
        w = tl.load(w_ptr + pairs, mask=k_mask, other=0.0)
    if SCATTER_W:
        tl.store(w_out_ptr + row, w, mask=valid)
    if SOURCES:
        tl.store(sources_ptr + row, tl.full((K_PAD,), 0, tl.int32) + t.to(tl.int32), mask=valid)
    if WEIGHT or DOT:  # unpermute's backward: [topk, BLOCK_H] tiles, the dot products reduced along rows
        dot = tl.zeros((K_PAD,), dtype=tl.float32)
        for h0 in range(0, H, BLOCK_H):
            cols = h0 + tl.arange(0, BLOCK_H)
            h_mask = cols < H
            mask = valid[:, None] & h_mask[None, :]
            x = tl.load(x_ptr + t * stride_x + cols, mask=h_mask, other=0.0).to(tl.float32)
            if STORE:
                val = tl.broadcast_to(x[None, :], (K_PAD, BLOCK_H))
                if WEIGHT:
                    val = w.to(tl.float32)[:, None] * val
                tl.store(out_ptr + row[:, None] * stride_out + cols[None, :], val.to(out_ptr.dtype.element_ty),
                         mask=mask)
            if DOT:
                o = tl.load(other_ptr + row[:, None] * stride_other + cols[None, :], mask=mask, other=0.0)
                dot += tl.sum(o.to(tl.float32) * x[None, :], axis=1)
        if DOT:
            tl.store(dot_ptr + pairs, dot.to(dot_ptr.dtype.element_ty), mask=k_mask)
    elif STORE:  # permute's copy: the token's row held once (BLOCK_H columns at a time), stored to each row
        if ROUTE:
            tl.debug_barrier()  # the rows just stored are read back below, one at a time, by every thread
        for h0 in range(0, H, BLOCK_H):
            cols = h0 + tl.arange(0, BLOCK_H)
            x = tl.load(x_ptr + t * stride_x + cols, mask=cols < H, other=0.0)
            for k in tl.static_range(K_PAD):
                # k < K as a tensor, and an address inside the token's pairs either way (an unmasked scalar load)
                in_token = t * K + k < t * K + K
                row_k = tl.where(in_token, tl.load(rows_ptr + tl.minimum(t * K + k, t * K + K - 1)), -1)
                tl.store(out_ptr + row_k.to(tl.int64) * stride_out + cols, x.to(out_ptr.dtype.element_ty),
                         mask=cols < tl.where(row_k >= 0, H, 0))  # no column of a dropped pair


@triton.jit
def _zero_slack(out_ptr, vec_ptr, counts_ptr, offs_ptr, pid, programs, pad_programs, capacity, H, E, stride_out,
                HAS_VEC: tl.constexpr, ROWS: tl.constexpr, BLOCK_H: tl.constexpr):
    """Zero the rows no pair fills: pad_programs programs per expert its padding [offs[e] + counts[e],
    offs[e+1]), ROWS rows each (one program an expert left a tail of up to 2 MB to a program at pad_to
    128); the programs after them the tail [offs[E], capacity), in a grid-stride loop (the tail's length
    depends on the routing; the grid does not)."""
    padding = E * pad_programs
    tail = pid >= padding
    per_expert = tl.maximum(pad_programs, 1)
    e = tl.where(tail, E, pid // per_expert)
    start = tl.load(offs_ptr + e)
    lo = start + tl.where(tail, (pid - padding) * ROWS,
                          tl.load(counts_ptr + tl.minimum(e, E - 1)) + (pid % per_expert) * ROWS)
    hi = tl.where(tail, capacity, tl.minimum(tl.load(offs_ptr + e + 1, mask=e < E, other=0), lo + ROWS))
    step = tl.where(tail, (programs - padding) * ROWS, ROWS).to(tl.int64)
    for r0 in range(lo, hi, step):
        rows = r0 + tl.arange(0, ROWS)
        r_mask = rows < hi
        if HAS_VEC:
            tl.store(vec_ptr + rows, tl.zeros((ROWS,), dtype=vec_ptr.dtype.element_ty), mask=r_mask)
        for h0 in range(0, H, BLOCK_H):
            cols = h0 + tl.arange(0, BLOCK_H)
            tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :],
                     tl.zeros((ROWS, BLOCK_H), dtype=out_ptr.dtype.element_ty),
                     mask=r_mask[:, None] & (cols < H)[None, :])


@fast_launch
@triton.jit
def _scatter_rows_kernel(
    x_ptr, out_ptr, rows_ptr, ids_ptr, rank_ptr, offs_ptr, counts_ptr, block_offs_ptr,
    w_ptr, w_out_ptr, other_ptr, dot_ptr, sources_ptr,
    T, H, K, E, capacity, zero_programs, pad_programs, stride_x, stride_out, stride_other,
    ROUTE: tl.constexpr, STORE: tl.constexpr, WEIGHT: tl.constexpr, SCATTER_W: tl.constexpr,
    DOT: tl.constexpr, SOURCES: tl.constexpr, BLOCK_PAIRS: tl.constexpr, K_PAD: tl.constexpr, BLOCK_H: tl.constexpr,
    ZERO_ROWS: tl.constexpr, ZERO_BLOCK_H: tl.constexpr,
):
    """STORE: the first zero_programs programs zero the rows of out (and w_out) that no pair fills
    (_zero_slack; first, so that they leave no tail behind the tokens); the T programs after them one
    token each (_scatter_token)."""
    pid = tl.program_id(0)
    if pid >= zero_programs:
        _scatter_token(pid - zero_programs, x_ptr, out_ptr, rows_ptr, ids_ptr, rank_ptr, offs_ptr, block_offs_ptr,
                       w_ptr, w_out_ptr, other_ptr, dot_ptr, sources_ptr, H, K, E, stride_x, stride_out, stride_other,
                       ROUTE, STORE, WEIGHT, SCATTER_W, DOT, SOURCES, BLOCK_PAIRS, K_PAD, BLOCK_H)
    else:
        _zero_slack(out_ptr, w_out_ptr, counts_ptr, offs_ptr, pid, zero_programs, pad_programs, capacity, H, E,
                    stride_out, SCATTER_W, ZERO_ROWS, ZERO_BLOCK_H)


@fast_launch
@triton.jit
def _gather_rows_kernel(
    src_ptr, out_ptr, rows_ptr, w_ptr, vec_ptr, vec_out_ptr,
    H, K, stride_src, stride_out,
    WEIGHT: tl.constexpr, GATHER_VEC: tl.constexpr, K_PAD: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """Token t = program_id: out[t] = sum_k w[t, k] * src[row(t, k)] in fp32 (w = 1 without WEIGHT);
    pairs with row -1 add nothing. GATHER_VEC: vec_out[t, k] = vec[row(t, k)] (0 for a dropped pair)."""
    t = tl.program_id(0).to(tl.int64)
    ks = tl.arange(0, K_PAD)
    k_mask = ks < K
    pairs = t * K + ks
    row = tl.load(rows_ptr + pairs, mask=k_mask, other=-1).to(tl.int64)
    valid = row >= 0
    if WEIGHT:
        w = tl.load(w_ptr + pairs, mask=valid, other=0.0).to(tl.float32)
    if GATHER_VEC:
        v = tl.load(vec_ptr + row, mask=valid, other=0.0)
        tl.store(vec_out_ptr + pairs, v.to(vec_out_ptr.dtype.element_ty), mask=k_mask)
    for h0 in range(0, H, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        h_mask = cols < H
        src = tl.load(src_ptr + row[:, None] * stride_src + cols[None, :], mask=valid[:, None] & h_mask[None, :],
                      other=0.0).to(tl.float32)
        if WEIGHT:
            src = src * w[:, None]
        tl.store(out_ptr + t * stride_out + cols, tl.sum(src, axis=0).to(out_ptr.dtype.element_ty), mask=h_mask)


# --- launchers ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowMap:
    """Where each (token, k) pair went: rows [T, topk] int32 (row of `permuted`, -1 for a dropped
    pair), and the layout of `permuted` that tells its used rows from the zeroed ones: the groups'
    offsets [E+1], the tokens per expert before padding [E] (int64, on the device), its capacity."""

    rows: torch.Tensor
    group_offs: torch.Tensor
    counts: torch.Tensor
    capacity: int

    @property
    def slack(self) -> int:
        """Rows a valid routing leaves unfilled: the padding's upper bound, num_experts * (pad_to - 1)."""
        return self.capacity - self.rows.numel()


def _block_h(H: int, most: int) -> int:
    return min(most, next_power_of_2(max(H, 1)))


def rank_block(n_pairs: int) -> int:
    """Pairs per rank program: ~128 programs or more while that keeps blocks of 256 pairs, up to 1024,
    so that the single-program scan walks few blocks (256 at 32k tokens x top-8)."""
    return min(BLOCK_PAIRS, max(256, next_power_of_2(cdiv(n_pairs, 128))))


def route_and_scatter(
    tokens: torch.Tensor | None, ids: torch.Tensor, probs: torch.Tensor | None, num_experts: int, pad_to: int,
    capacity: int, permuted: torch.Tensor | None, permuted_probs: torch.Tensor | None,
    sources: torch.Tensor | None = None,
) -> tuple[RowMap, torch.Tensor]:
    """permute's forward into the given buffers (permuted: None to route without copying the tokens;
    permuted_probs: None to leave the probabilities behind; sources: int32 [capacity], filled with -1
    by the caller, gets each filled row's token): returns the row map and group_lens [E] (int64)."""
    T, K = ids.shape
    E, device = num_experts, ids.device
    n_pairs = T * K
    block_pairs = rank_block(n_pairs)
    n_blocks = cdiv(n_pairs, block_pairs)
    e_pad = next_power_of_2(E)
    # Scan programs: SCAN_EXPERTS experts each, one for all when nothing was ranked (no rank kernel then
    # zeroes the arrival counter, and there is nothing to scan).
    e_tile = min(e_pad, SCAN_EXPERTS) if n_blocks else e_pad
    scan_programs = cdiv(E, e_tile)
    # One allocation per integer type, cut into the kernels' buffers: each allocation costs host time,
    # which the launches of a small batch do not hide.
    rows, ranks, block_counts, block_offs, arrivals = torch.empty(
        2 * (n_pairs + n_blocks * E) + 1, dtype=torch.int32, device=device).split(
        (n_pairs, n_pairs, n_blocks * E, n_blocks * E, 1))
    rows = rows.view(T, K)
    counts, group_lens, group_offs = torch.empty(3 * E + 1, dtype=torch.int64, device=device).split((E, E, E + 1))
    if n_blocks:
        _rank_kernel[(n_blocks,)](ids, ranks, block_counts, arrivals, n_pairs, E, E_PAD=e_pad,
                                  BLOCK_PAIRS=block_pairs, num_warps=8)
    _scan_kernel[(scan_programs,)](block_counts, block_offs, counts, group_lens, group_offs, arrivals, n_blocks, E,
                                   pad_to, E_PAD=e_pad, E_TILE=e_tile, BLOCK_B=max(1, TILE_ELEMENTS // e_tile),
                                   SPLIT=scan_programs > 1, num_warps=8)
    row_map = RowMap(rows, group_offs, counts, capacity)
    _scatter(tokens, row_map, permuted, probs if permuted_probs is not None else None, permuted_probs,
             route=(ids, ranks, block_offs, block_pairs), sources=sources)
    return row_map, group_lens


def _scatter(
    x: torch.Tensor | None, row_map: RowMap, out: torch.Tensor | None, weights: torch.Tensor | None,
    w_out: torch.Tensor | None = None, other: torch.Tensor | None = None, dot: torch.Tensor | None = None,
    route: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None = None, sources: torch.Tensor | None = None,
) -> None:
    """Launch _scatter_rows_kernel: w_out given: scatter the weights there (permute), else scale by
    them (unpermute's backward); route: (ids, ranks, block_offs, pairs per rank block) to compute
    the rows (permute); x None: no row is read or copied (routing alone)."""
    T, K = row_map.rows.shape
    E, H = row_map.counts.numel(), 0 if x is None else x.shape[1]
    x = row_map.rows if x is None else x  # a placeholder pointer: nothing reads it without H
    # Zeroing programs: enough for each expert's padding (pad_to - 1 rows at most), and for all the padding
    # a valid routing can leave at the tail (one at least, for the rows that dropped pairs leave).
    pad_programs = cdiv(row_map.slack // E, ZERO_ROWS)
    zero_programs = E * pad_programs + max(1, cdiv(row_map.slack, ZERO_ROWS)) if out is not None else 0
    if T + zero_programs == 0:
        return

    def ptr(t: torch.Tensor | None) -> torch.Tensor:  # a placeholder where the variant reads nothing
        return t if t is not None else x

    ids, ranks, block_offs, block_pairs = route or (x, x, x, 1)
    weighted = weights is not None and w_out is None
    tiles = weighted or dot is not None  # [topk, BLOCK_H] tiles (_scatter_token)
    block_h = _block_h(H, TILE_BLOCK_H if tiles else SCATTER_BLOCK_H)
    _scatter_rows_kernel[(T + zero_programs,)](
        x, ptr(out), row_map.rows, ids, ranks, row_map.group_offs, row_map.counts, block_offs,
        ptr(weights), ptr(w_out), ptr(other), ptr(dot), ptr(sources),
        T, H, K, E, row_map.capacity, zero_programs, pad_programs,
        x.stride(0), ptr(out).stride(0), ptr(other).stride(0),
        ROUTE=route is not None, STORE=out is not None, WEIGHT=weighted,
        SCATTER_W=w_out is not None, DOT=dot is not None, SOURCES=sources is not None, BLOCK_PAIRS=block_pairs,
        K_PAD=next_power_of_2(K), BLOCK_H=block_h, ZERO_ROWS=ZERO_ROWS, ZERO_BLOCK_H=ZERO_BLOCK_H,
        num_warps=TILE_WARPS if tiles else max(1, min(8, block_h // 256)),  # 8 columns a thread at least
    )


def scatter_rows(x: torch.Tensor, row_map: RowMap, weights: torch.Tensor | None, out: torch.Tensor | None,
                 other: torch.Tensor | None = None, dot: torch.Tensor | None = None) -> None:
    """unpermute's backward: out[row(t, k)] = weights[t, k] * x[t] and zero on the rows no pair fills
    (skipped if out is None); dot[t, k] = <x[t], other[row(t, k)]> (if dot is given)."""
    _scatter(x, row_map, out, weights, other=other, dot=dot)


def gather_rows(src: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor | None, out: torch.Tensor,
                vec: torch.Tensor | None = None, vec_out: torch.Tensor | None = None) -> torch.Tensor:
    """out[t] = sum_k weights[t, k] * src[rows[t, k]] (weights 1 if None); vec_out[t, k] = vec[rows[t, k]]."""
    T, K = rows.shape
    if T:
        H = src.shape[1]
        _gather_rows_kernel[(T,)](
            src, out, rows, weights if weights is not None else src, vec if vec is not None else src,
            vec_out if vec_out is not None else src, H, K, src.stride(0), out.stride(0),
            WEIGHT=weights is not None, GATHER_VEC=vec is not None,
            K_PAD=next_power_of_2(K), BLOCK_H=_block_h(H, TILE_BLOCK_H), num_warps=TILE_WARPS,
        )
    return out


# --- autograd -------------------------------------------------------------------------------------------


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tokens, probs, ids, num_experts, pad_to, capacity):
        permuted = tokens.new_empty((capacity, tokens.shape[1]))
        permuted_probs = probs.new_empty(capacity) if probs is not None else None
        row_map, group_lens = route_and_scatter(tokens, ids, probs, num_experts, pad_to, capacity, permuted,
                                                permuted_probs)
        ctx.mark_non_differentiable(row_map.rows, group_lens, row_map.group_offs, row_map.counts)
        ctx.save_for_backward(row_map.rows)
        ctx.token_shape = tokens.shape
        return permuted, permuted_probs, row_map.rows, group_lens, row_map.group_offs, row_map.counts

    @staticmethod
    def backward(ctx, grad_permuted, grad_permuted_probs, *_):
        (rows,) = ctx.saved_tensors
        grad_tokens = grad_probs = None
        want_probs = ctx.needs_input_grad[1] and grad_permuted_probs is not None
        if want_probs:
            # contiguous: the gradient of a sum arrives expanded (stride 0), and the kernel reads unit strides
            grad_permuted_probs = grad_permuted_probs.contiguous()
            grad_probs = grad_permuted_probs.new_empty(rows.shape)
        if ctx.needs_input_grad[0]:
            grad_tokens = grad_permuted.new_empty(ctx.token_shape)
            gather_rows(grad_permuted.contiguous(), rows, None, grad_tokens,
                        grad_permuted_probs if want_probs else None, grad_probs)
        elif want_probs:  # the probabilities alone: a [T, topk] gather, no pass over the rows
            grad_probs = torch.where(rows >= 0, grad_permuted_probs[rows.clamp(min=0)], 0).to(grad_probs.dtype)
        return grad_tokens, grad_probs, None, None, None, None


class _Unpermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, permuted, probs, rows, group_offs, counts):
        out = permuted.new_empty((rows.shape[0], permuted.shape[1]))
        gather_rows(permuted, rows, probs, out)
        # permuted is kept only for the probabilities' gradient: <grad_out[t], permuted[row(t, k)]>.
        keep = permuted if probs is not None and ctx.needs_input_grad[1] else None
        ctx.save_for_backward(keep, probs, rows, group_offs, counts)
        ctx.capacity = permuted.shape[0]
        return out

    @staticmethod
    def backward(ctx, grad_out):
        permuted, probs, rows, group_offs, counts = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_permuted = grad_probs = None
        if ctx.needs_input_grad[0]:
            grad_permuted = grad_out.new_empty((ctx.capacity, grad_out.shape[1]))
        if permuted is not None:
            grad_probs = torch.empty(rows.shape, dtype=probs.dtype, device=rows.device)
        if grad_permuted is not None or grad_probs is not None:
            scatter_rows(grad_out, RowMap(rows, group_offs, counts, ctx.capacity), probs, grad_permuted, permuted,
                         grad_probs)
        return grad_permuted, grad_probs, None, None, None


# --- the public face -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Permuted:
    """permute's result. `permuted` [capacity, H]: the tokens sorted by expert (token order within an
    expert), one copy per (token, k) pair; `permuted_probs` [capacity]: their probabilities (None
    without probs); `group_lens` [E] int64: rows per expert (padded to pad_to), as the grouped GEMMs
    take them; `group_offs` [E+1] int64: the groups' first rows; `row_map`: what unpermute needs."""

    permuted: torch.Tensor
    permuted_probs: torch.Tensor | None
    group_lens: torch.Tensor
    group_offs: torch.Tensor
    row_map: RowMap


def capacity_for(tokens: int, topk: int, num_experts: int, pad_to: int) -> int:
    """Rows of `permuted`: T*topk, and room for each expert's padding when padded."""
    return tokens * topk + (num_experts * (pad_to - 1) if pad_to > 1 else 0)


def _check_probs(op: str, probs: torch.Tensor | None, pairs_shape: tuple[int, ...]) -> None:
    if probs is None:
        return
    if probs.dtype not in TOKEN_DTYPES:
        raise ValueError(f"{op}: probs must be float32, bfloat16 or float16, got {probs.dtype}")
    if tuple(probs.shape) != pairs_shape:
        raise ValueError(f"{op}: probs must be [T, topk] = {list(pairs_shape)}, got {list(probs.shape)}")


def _check_routing(op: str, expert_ids: torch.Tensor, probs: torch.Tensor | None, num_experts: int, pad_to: int,
                   validate: bool) -> int:
    """The checks permute and sort_by_expert share; returns the capacity."""
    if expert_ids.ndim != 2 or expert_ids.dtype not in ID_DTYPES:
        raise ValueError(f"{op}: expert_ids must be int32 or int64 [T, topk], got {expert_ids.dtype} "
                         f"{list(expert_ids.shape)}")
    _check_probs(op, probs, tuple(expert_ids.shape))
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"{op}: num_experts must be a positive int, got {num_experts!r}")
    if pad_to not in PAD_TO:
        raise ValueError(f"{op}: pad_to must be one of {PAD_TO}, got {pad_to!r}")
    T, K = expert_ids.shape
    capacity = capacity_for(T, K, num_experts, pad_to)
    if capacity >= 2**31:
        raise ValueError(f"{op}: {capacity} rows do not fit the int32 row map")
    if (validate or expert_ids.device.type == "cpu") and bool(((expert_ids < 0) | (expert_ids >= num_experts)).any()):
        raise ValueError(f"{op}: expert_ids holds ids outside [0, {num_experts})")
    return capacity


def permute(
    tokens: torch.Tensor,
    expert_ids: torch.Tensor,
    probs: torch.Tensor | None = None,
    *,
    num_experts: int,
    pad_to: int = 1,
    validate: bool = False,
) -> Permuted:
    """Sort tokens [T, H] by expert: each (token, k) pair's copy of tokens[t] goes to a row of its
    expert expert_ids[t, k]'s group, in token order. With autograd (tokens, probs).

    Drop-less, no host sync: the capacity is capacity_for(T, topk, num_experts, pad_to), whatever the
    routing. pad_to (1, 16 or 128) rounds each group up to a multiple (FP8 GEMM alignment). Rows that no
    pair fills (each group's padding, and the tail past group_offs[E]) are zero, in `permuted` and in
    `permuted_probs`, so a grouped GEMM over the whole capacity is harmless there.

    expert_ids: int32 or int64 [T, topk], assumed in [0, num_experts). That is checked where it costs
    no sync (CPU tensors) or when `validate` (a device-to-host sync); otherwise a pair with an id out of
    range is dropped (row -1 in the row map, no copy, zero rows at the tail) rather than written out of
    bounds.
    """
    if tokens.ndim != 2:
        raise ValueError(f"permute: tokens must be [T, H], got shape {list(tokens.shape)}")
    if tokens.dtype not in TOKEN_DTYPES:
        raise ValueError(f"permute: tokens must be bfloat16, float16 or float32, got {tokens.dtype}")
    if expert_ids.ndim == 2 and expert_ids.shape[0] != tokens.shape[0]:
        raise ValueError(f"permute: expert_ids has {expert_ids.shape[0]} tokens but tokens has {tokens.shape[0]}")
    capacity = _check_routing("permute", expert_ids, probs, num_experts, pad_to, validate)
    check_same_device(tokens=tokens, expert_ids=expert_ids, **({"probs": probs} if probs is not None else {}))
    permuted, permuted_probs, rows, group_lens, group_offs, counts = _Permute.apply(
        tokens.contiguous(), probs.contiguous() if probs is not None else None, expert_ids.contiguous(),
        num_experts, pad_to, capacity)
    return Permuted(permuted, permuted_probs, group_lens, group_offs, RowMap(rows, group_offs, counts, capacity))


@dataclass(frozen=True)
class ExpertOrder:
    """sort_by_expert's result: permute's layout without the rows themselves. `sources` [capacity] int32:
    the token each row would copy (-1 for the rows no pair fills), what kernels that read the tokens
    through an index take (kernels.common.fp8.RowSource); `permuted_probs` [capacity]: each row's
    probability (None without probs; unset on unfilled rows, which `sources` marks); `group_lens`,
    `group_offs` and `row_map` as Permuted's."""

    sources: torch.Tensor
    permuted_probs: torch.Tensor | None
    group_lens: torch.Tensor
    group_offs: torch.Tensor
    row_map: RowMap


def sort_by_expert(
    expert_ids: torch.Tensor,
    probs: torch.Tensor | None = None,
    *,
    num_experts: int,
    pad_to: int = 1,
    validate: bool = False,
) -> ExpertOrder:
    """permute's routing without copying a token: for kernels that read the tokens through `sources`
    (an MoE layer's FP8 GateUP quantizes the tokens in expert order straight from x). No autograd: the
    outputs are indices, and permuted_probs carries no gradient to probs. Same layout, checks and ids
    out of range as permute."""
    capacity = _check_routing("sort_by_expert", expert_ids, probs, num_experts, pad_to, validate)
    if probs is not None:
        check_same_device(expert_ids=expert_ids, probs=probs)
    device = expert_ids.device
    sources = torch.full((capacity,), -1, dtype=torch.int32, device=device)
    permuted_probs = torch.empty(capacity, dtype=probs.dtype, device=device) if probs is not None else None
    row_map, group_lens = route_and_scatter(
        None, expert_ids.contiguous(), probs.detach().contiguous() if probs is not None else None, num_experts,
        pad_to, capacity, None, permuted_probs, sources)
    return ExpertOrder(sources, permuted_probs, group_lens, row_map.group_offs, row_map)


def unpermute(permuted: torch.Tensor, row_map: RowMap, probs: torch.Tensor | None = None) -> torch.Tensor:
    """out[t] = sum_k probs[t, k] * permuted[row(t, k)] (probs 1 if None), accumulated in fp32, [T, H] in
    permuted's dtype. With autograd (permuted: probs[t, k] * grad_out[t] on each pair's row, zero on the
    rows no pair fills; probs: <grad_out[t], permuted[row(t, k)]>)."""
    if not isinstance(row_map, RowMap):
        raise ValueError(f"unpermute: row_map must be the RowMap permute returned, got {type(row_map).__name__}")
    if permuted.ndim != 2 or permuted.shape[0] != row_map.capacity:
        raise ValueError(f"unpermute: permuted must be [{row_map.capacity}, H] as permute made it, "
                         f"got {list(permuted.shape)}")
    if permuted.dtype not in TOKEN_DTYPES:
        raise ValueError(f"unpermute: permuted must be bfloat16, float16 or float32, got {permuted.dtype}")
    _check_probs("unpermute", probs, tuple(row_map.rows.shape))
    check_same_device(permuted=permuted, rows=row_map.rows, **({"probs": probs} if probs is not None else {}))
    return _Unpermute.apply(permuted.contiguous(), probs.contiguous() if probs is not None else None,
                            row_map.rows, row_map.group_offs, row_map.counts)
