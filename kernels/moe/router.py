"""Top-k MoE routing: the fused Triton kernels, their launchers and the autograd Function as one story.

    from kernels.moe import RouterConfig, route
    r = route(logits, RouterConfig.deepseek_v3(), expert_bias=bias)    # logits = x @ w_gate.T, [T, E]
    p = permute(x, r.expert_ids, r.probs, num_experts=256)              # then the experts, unpermute
    loss = task_loss + aux_coeff * r.aux_loss + z_coeff * r.z_loss      # gradients reach the logits

Forward, `_router_fwd_kernel` (each program walks a few blocks of tokens, all experts of a token in
registers): scores (softmax over the experts, or sigmoid), selection scores (scores + the per-expert
bias, which steers the choice only: DeepSeek-V3's auxiliary-loss-free balancing), group-limited top-k
(each group scored by the sum of its best topk/topk_group selection scores, the best topk_group groups
kept), the chosen experts' scores (renormalized over the k, scaled), and per program the tokens per
expert, the sum over its tokens of the load-balancing probabilities and of logsumexp^2. A one-program
`_router_losses_kernel` then reduces those partials over programs (deterministic: no atomics) into the
tokens per expert and the two losses. Nothing goes through the host: CUDA-graph safe.

Backward, `_router_bwd_kernel`: the logits re-read and the scores recomputed (cheaper than keeping
[T, E] of them), the gradient of the routing weights through the renormalization scattered onto the
chosen experts, the load-balancing loss's (a constant per expert: its token count) and the z-loss's
added, and all of it taken through softmax or sigmoid into grad_logits, in one pass.

The losses (both 1-scale numbers for the caller to weight):
- load balancing (Switch Transformer, as Megatron-LM computes it): E / (T^2 * topk) *
  sum_e count_e * sum_t q[t, e], where q is the softmax of the logits (sigmoid scores normalized over
  the experts for sigmoid routing); 1.0 when balanced. Counts carry no gradient.
- z-loss (ST-MoE): mean over tokens of logsumexp(logits)^2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import triton
import triton.language as tl

from kernels.common.device import cdiv, check_same_device, next_power_of_2
from kernels.common.launch import fast_launch

LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SCORE_FUNCS = ("softmax", "sigmoid")
# Elements of one [tokens, experts] tile: 8 fp32 registers a thread at 16 warps for each of the few
# tiles alive at once (logits, scores, selection scores, the counts and balance sums).
TILE_ELEMENTS = 4096
MAX_BLOCK_T = 64
# 16 warps: at 256 experts a warp holds one token's row, so a reduction over the experts stays in its
# warp, and the chain of dependent reductions a top-k is (one per pick) runs on 16 rows at once.
ROUTER_WARPS = 16
# The forward holds 92 registers a thread unbounded: one 16-warp program an SM. At 64 (8 bytes spilled)
# two share one: DeepSeek-V3's forward at 32k tokens 94 against 101 us (H100, 2026-11-25).
FWD_MAX_REGISTERS = 64
# Forward programs at most: each writes one column of partials that the losses kernel, a single program,
# reads back; 256 (about two an H100 SM) keeps that read at 512 KB for 256 experts.
MAX_PROGRAMS = 256


# --- kernels ----------------------------------------------------------------------------------------


# Added to the sums renormalized by (as DeepSeek-V3 and Megatron-LM do): a row of zero sigmoid scores.
RENORM_EPS = 1e-20


@triton.jit
def _renorm_total(x):
    """A row's sum to renormalize by, plus RENORM_EPS (written out: a compiled kernel sees no module-level
    float)."""
    return tl.sum(x, axis=1) + 1e-20


@triton.jit
def _load_logits(logits_ptr, rows, cols, T, E, stride_t):
    """[BLOCK_T, E_PAD] fp32 logits: -inf in the padding columns (no score, never chosen), 0 in the rows
    past T (finite: their results are computed and not stored)."""
    col_ok = cols < E
    mask = (rows < T)[:, None] & col_ok[None, :]
    x = tl.load(logits_ptr + rows.to(tl.int64)[:, None] * stride_t + cols[None, :], mask=mask, other=0.0)
    return tl.where(col_ok[None, :], x.to(tl.float32), float("-inf"))


@triton.jit
def _logits_at(logits_ptr, rows, experts, mask, other, stride_t):
    """The logits of chosen experts in fp32: rows shaped to broadcast against experts (one expert per
    row, or a [BLOCK_T, K_PAD] tile of them)."""
    return tl.load(logits_ptr + rows.to(tl.int64) * stride_t + experts, mask=mask, other=other).to(tl.float32)


@triton.jit
def _logsumexp(x):
    """logsumexp over the experts of a [BLOCK_T, E_PAD] tile."""
    row_max = tl.max(x, axis=1)
    return row_max + tl.log(tl.sum(tl.exp(x - row_max[:, None]), axis=1))


@triton.jit
def _score(x, lse, SIGMOID: tl.constexpr):
    """The score of logits x (a tile, or one expert's per token) with their rows' logsumexp lse (as
    broadcast to x): sigmoid, or softmax written as exp(x - lse), so that a chosen expert's score
    recomputed from its logit alone goes through the same operations as the tile's."""
    if SIGMOID:
        return tl.sigmoid(x)
    return tl.exp(x - lse)


@triton.jit
def _first_max(values):
    """Per row: the largest value and the first column holding it (ties go to the lower index), in one
    reduction."""
    return tl.max(values, axis=1, return_indices=True, return_indices_tie_break_left=True)


@triton.jit
def _keep_best_groups(sel, cols, group_size, N_GROUP: tl.constexpr, G_PAD: tl.constexpr,
                      TOPK_GROUP: tl.constexpr, GROUP_PICK: tl.constexpr, GROUP_AXIS: tl.constexpr):
    """sel with the experts outside each token's best TOPK_GROUP groups set to -inf; a group's score is
    the sum of its GROUP_PICK best selection scores. GROUP_AXIS (the experts fill E_PAD = N_GROUP *
    group_size, powers of two): the groups are an axis of a 3D view, so a group's picks are reductions
    over the few lanes holding it, all groups at once; otherwise one group at a time over the whole row."""
    groups = tl.arange(0, G_PAD)
    group_of_col = cols // group_size
    if GROUP_AXIS:
        sel3 = tl.reshape(sel, (sel.shape[0], G_PAD, sel.shape[1] // G_PAD))
        lanes = tl.arange(0, sel.shape[1] // G_PAD)
        picks = sel3
        group_scores = tl.zeros((sel.shape[0], G_PAD), tl.float32)
        for _ in tl.static_range(GROUP_PICK):
            group_best, group_first = tl.max(picks, axis=2, return_indices=True, return_indices_tie_break_left=True)
            group_scores += group_best
            picks = tl.where(lanes[None, None, :] == group_first[:, :, None], float("-inf"), picks)
    else:
        group_scores = tl.full((sel.shape[0], G_PAD), float("-inf"), tl.float32)
        for g in tl.static_range(N_GROUP):
            in_group = tl.where(group_of_col[None, :] == g, sel, float("-inf"))
            score = tl.zeros((sel.shape[0],), tl.float32)
            for _ in tl.static_range(GROUP_PICK):
                best, first = _first_max(in_group)
                score += best
                in_group = tl.where(cols[None, :] == first[:, None], float("-inf"), in_group)
            group_scores = tl.where(groups[None, :] == g, score[:, None], group_scores)
    kept = tl.zeros((sel.shape[0], G_PAD), tl.int1)
    keep = tl.zeros(sel.shape, tl.int1)
    for _ in tl.static_range(TOPK_GROUP):
        _, chosen = _first_max(group_scores)
        hit = groups[None, :] == chosen[:, None]
        group_scores = tl.where(hit, float("-inf"), group_scores)
        if GROUP_AXIS:
            kept = kept | hit
        else:
            keep = keep | (group_of_col[None, :] == chosen[:, None])
    if GROUP_AXIS:
        return tl.reshape(tl.where(kept[:, :, None], sel3, float("-inf")), sel.shape)
    return tl.where(keep, sel, float("-inf"))


@fast_launch
@triton.jit
def _router_fwd_kernel(
    logits_ptr, bias_ptr, probs_ptr, ids_ptr, part_counts_ptr, part_probs_ptr, part_z_ptr,
    T, E, stride_t, group_size, blocks_per_program, scaling_factor,
    K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, N_GROUP: tl.constexpr, G_PAD: tl.constexpr,
    TOPK_GROUP: tl.constexpr, GROUP_PICK: tl.constexpr, GROUP_AXIS: tl.constexpr, SIGMOID: tl.constexpr,
    RENORMALIZE: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """Route the tokens of `blocks_per_program` blocks of BLOCK_T; write the probabilities and ids
    [T, K] and this program's partials: tokens per expert, sum of the balancing probabilities per
    expert, sum of logsumexp^2."""
    pid = tl.program_id(0)
    cols = tl.arange(0, E_PAD)
    col_ok = cols < E
    ks = tl.arange(0, K_PAD)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    # Summed over the program's tokens elementwise, reduced over them once at the end: a reduction
    # across the tile's rows crosses warps.
    count_tile = tl.zeros((BLOCK_T, E_PAD), tl.int32)
    balance_tile = tl.zeros((BLOCK_T, E_PAD), tl.float32)
    z_sums = tl.zeros((BLOCK_T,), tl.float32)
    for b in range(blocks_per_program):
        rows = (pid * blocks_per_program + b) * BLOCK_T + tl.arange(0, BLOCK_T)
        row_ok = rows < T
        x = _load_logits(logits_ptr, rows, cols, T, E, stride_t)
        lse = _logsumexp(x)
        z_sums += tl.where(row_ok, lse * lse, 0.0)
        scores = _score(x, lse[:, None], SIGMOID)
        balance = scores / _renorm_total(scores)[:, None] if SIGMOID else scores
        balance_tile += tl.where(row_ok[:, None], balance, 0.0)
        sel = scores
        if HAS_BIAS:
            sel = sel + bias[None, :]
        sel = tl.where(col_ok[None, :], sel, float("-inf"))
        if N_GROUP > 1:
            sel = _keep_best_groups(sel, cols, group_size, N_GROUP, G_PAD, TOPK_GROUP, GROUP_PICK, GROUP_AXIS)
        ids = tl.zeros((BLOCK_T, K_PAD), tl.int32)
        for k in tl.static_range(K):
            _, expert = _first_max(sel)
            chosen = cols[None, :] == expert[:, None]
            sel = tl.where(chosen, float("-inf"), sel)
            ids = tl.where(ks[None, :] == k, expert[:, None], ids)
            count_tile += (chosen & row_ok[:, None]).to(tl.int32)
        pairs = rows.to(tl.int64)[:, None] * K + ks[None, :]
        pair_mask = row_ok[:, None] & (ks < K)[None, :]
        # The chosen scores from their logits (cached loads) rather than a reduction of the tile per pick;
        # -inf where there is no pick scores 0.
        chosen_x = _logits_at(logits_ptr, rows[:, None], ids, pair_mask, float("-inf"), stride_t)
        weights = _score(chosen_x, lse[:, None], SIGMOID)
        if RENORMALIZE:
            weights = weights / _renorm_total(weights)[:, None]
        tl.store(probs_ptr + pairs, weights * scaling_factor, mask=pair_mask)
        tl.store(ids_ptr + pairs, ids, mask=pair_mask)
    # One column of the [E, programs] partials: the losses kernel sums each expert's along its row.
    programs = tl.num_programs(0)
    tl.store(part_counts_ptr + cols * programs + pid, tl.sum(count_tile, axis=0), mask=col_ok)
    tl.store(part_probs_ptr + cols * programs + pid, tl.sum(balance_tile, axis=0), mask=col_ok)
    tl.store(part_z_ptr + pid, tl.sum(z_sums, axis=0))


@fast_launch
@triton.jit
def _router_losses_kernel(part_counts_ptr, part_probs_ptr, part_z_ptr, counts_ptr, aux_ptr, z_ptr,
                          n_parts, E, balance_scale, inv_tokens, E_PAD: tl.constexpr, BLOCK_P: tl.constexpr):
    """One program: the partials ([E, n_parts] each, an expert's contiguous) summed over the forward's
    programs, in a fixed order and along the tiles' contiguous dimension (within a warp); counts [E]
    int64, aux = balance_scale * sum_e counts_e * probs_e, z = inv_tokens * sum of logsumexp^2."""
    cols = tl.arange(0, E_PAD)
    col_ok = cols < E
    counts = tl.zeros((E_PAD,), tl.int32)
    prob_sums = tl.zeros((E_PAD,), tl.float32)
    z_sums = tl.zeros((BLOCK_P,), tl.float32)
    for p0 in range(0, n_parts, BLOCK_P):
        parts = p0 + tl.arange(0, BLOCK_P)
        part_ok = parts < n_parts
        offsets = cols[:, None] * n_parts + parts[None, :]
        mask = col_ok[:, None] & part_ok[None, :]
        counts += tl.sum(tl.load(part_counts_ptr + offsets, mask=mask, other=0), axis=1)
        prob_sums += tl.sum(tl.load(part_probs_ptr + offsets, mask=mask, other=0.0), axis=1)
        z_sums += tl.load(part_z_ptr + parts, mask=part_ok, other=0.0)
    tl.store(counts_ptr + cols, counts.to(tl.int64), mask=col_ok)
    tl.store(aux_ptr, balance_scale * tl.sum(counts.to(tl.float32) * prob_sums, axis=0))
    tl.store(z_ptr, inv_tokens * tl.sum(z_sums, axis=0))


@fast_launch
@triton.jit
def _router_bwd_kernel(
    logits_ptr, ids_ptr, grad_probs_ptr, counts_ptr, grad_aux_ptr, grad_z_ptr, grad_logits_ptr,
    T, E, stride_t, stride_grad, balance_scale, z_scale, scaling_factor,
    K: tl.constexpr, E_PAD: tl.constexpr, SIGMOID: tl.constexpr,
    RENORMALIZE: tl.constexpr, HAS_GRAD_PROBS: tl.constexpr, HAS_AUX: tl.constexpr, HAS_Z: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """grad_logits for BLOCK_T tokens: d(probs) through the renormalization onto the chosen experts,
    d(aux) (grad_aux * balance_scale * count_e on each q[t, e]), through the score function, plus
    d(z) = grad_z * z_scale * logsumexp * softmax."""
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = rows < T
    cols = tl.arange(0, E_PAD)
    x = _load_logits(logits_ptr, rows, cols, T, E, stride_t)
    lse = _logsumexp(x)
    softmax = _score(x, lse[:, None], False)
    scores = tl.sigmoid(x) if SIGMOID else softmax
    grad_scores = tl.zeros((BLOCK_T, E_PAD), tl.float32)
    if HAS_GRAD_PROBS:
        # Each pick's id and gradient loaded per row (no [BLOCK_T, topk] tile to take apart), its score
        # recomputed from its logit; the ids are in [0, E) by construction, of any numeric dtype.
        pairs = rows.to(tl.int64) * K
        if RENORMALIZE:  # p_k = w_k / S: dL/dw_j = g_j / S - sum_k g_k w_k / S^2
            total = tl.zeros((BLOCK_T,), tl.float32)
            dot = tl.zeros((BLOCK_T,), tl.float32)
            for k in tl.static_range(K):
                expert = tl.load(ids_ptr + pairs + k, mask=row_ok, other=0).to(tl.int32)
                weight = _score(_logits_at(logits_ptr, rows, expert, row_ok, 0.0, stride_t), lse, SIGMOID)
                total += weight
                dot += tl.load(grad_probs_ptr + pairs + k, mask=row_ok, other=0.0).to(tl.float32) * weight
            total += 1e-20  # RENORM_EPS, as the forward's _renorm_total adds it
        for k in tl.static_range(K):
            expert = tl.load(ids_ptr + pairs + k, mask=row_ok, other=0).to(tl.int32)
            grad_k = tl.load(grad_probs_ptr + pairs + k, mask=row_ok, other=0.0).to(tl.float32)
            if RENORMALIZE:
                grad_k = (grad_k - dot / total) / total
            grad_scores += tl.where(cols[None, :] == expert[:, None], (grad_k * scaling_factor)[:, None], 0.0)
    if HAS_AUX:
        counts = tl.load(counts_ptr + cols, mask=cols < E, other=0).to(tl.float32)
        grad_balance = (tl.load(grad_aux_ptr).to(tl.float32) * balance_scale) * counts[None, :]
        if SIGMOID:
            # q = s / Z with Z = sum_e s_e: dL/ds_e = (dL/dq_e - sum_j dL/dq_j q_j) / Z
            total = _renorm_total(scores)
            balance = scores / total[:, None]
            grad_scores += (grad_balance - tl.sum(grad_balance * balance, axis=1)[:, None]) / total[:, None]
        else:
            grad_scores += grad_balance
    if SIGMOID:
        grad_x = grad_scores * scores * (1.0 - scores)
    else:
        grad_x = scores * (grad_scores - tl.sum(grad_scores * scores, axis=1)[:, None])
    if HAS_Z:
        grad_x += (tl.load(grad_z_ptr).to(tl.float32) * z_scale) * lse[:, None] * softmax
    mask = row_ok[:, None] & (cols < E)[None, :]
    tl.store(grad_logits_ptr + rows.to(tl.int64)[:, None] * stride_grad + cols[None, :],
             grad_x.to(grad_logits_ptr.dtype.element_ty), mask=mask)


# --- launchers ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RouterConfig:
    """How a model routes. num_experts and topk; score_func "softmax" (over all experts) or "sigmoid";
    group-limited top-k: the experts split into n_group equal groups, topk_group of them kept per token
    (n_group=1: no groups); renormalize: the chosen k probabilities divided by their sum;
    scaling_factor: then multiplied by it (DeepSeek-V3's routed_scaling_factor)."""

    num_experts: int
    topk: int
    score_func: Literal["softmax", "sigmoid"] = "softmax"
    n_group: int = 1
    topk_group: int = 1
    renormalize: bool = False
    scaling_factor: float = 1.0

    def __post_init__(self) -> None:
        E, K = self.num_experts, self.topk
        if not isinstance(E, int) or E < 1:
            raise ValueError(f"route: num_experts must be a positive int, got {E!r}")
        if not isinstance(K, int) or not 1 <= K <= E:
            raise ValueError(f"route: topk must be an int in [1, num_experts={E}], got {K!r}")
        if self.score_func not in SCORE_FUNCS:
            raise ValueError(f"route: score_func must be one of {SCORE_FUNCS}, got {self.score_func!r}")
        if not isinstance(self.n_group, int) or self.n_group < 1 or E % self.n_group:
            raise ValueError(f"route: num_experts={E} is not divisible into n_group={self.n_group!r} groups")
        if not isinstance(self.topk_group, int) or not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"route: topk_group must be an int in [1, n_group={self.n_group}], got "
                             f"{self.topk_group!r}")
        kept_experts = self.topk_group * (E // self.n_group)
        if self.n_group > 1 and kept_experts < K:
            raise ValueError(f"route: topk={K} exceeds the {kept_experts} experts of topk_group={self.topk_group} "
                             f"groups of {E // self.n_group}")

    @classmethod
    def deepseek_v3(cls) -> RouterConfig:
        """256 experts in 8 groups, 4 groups kept, top-8 by sigmoid, renormalized and scaled by 2.5."""
        return cls(256, 8, "sigmoid", n_group=8, topk_group=4, renormalize=True, scaling_factor=2.5)

    @property
    def group_pick(self) -> int:
        """Selection scores summed into a group's score: topk // topk_group (2 for DeepSeek-V3)."""
        return max(1, self.topk // self.topk_group) if self.n_group > 1 else 1

    def balance_scale(self, tokens: int) -> float:
        """E / (T^2 * topk): the load-balancing loss is 1.0 when every expert gets T*topk/E pairs."""
        return self.num_experts / (tokens * tokens * self.topk)


def _block_t(e_pad: int) -> int:
    return max(1, min(MAX_BLOCK_T, TILE_ELEMENTS // e_pad))


def router_forward(
    logits: torch.Tensor, config: RouterConfig, expert_bias: torch.Tensor | None,
    probs: torch.Tensor | None = None, aux_loss: torch.Tensor | None = None, z_loss: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward launches: (probs [T, topk] fp32, expert_ids [T, topk] int32, tokens_per_expert [E]
    int64, aux_loss, z_loss) with logits [T, E] contiguous in its last dim; probs and the 0-dim fp32
    losses into the given buffers where there are some."""
    T, E = logits.shape
    K, device = config.topk, logits.device
    e_pad, g_pad = next_power_of_2(E), next_power_of_2(config.n_group)
    block_t = _block_t(e_pad)
    n_blocks = cdiv(T, block_t)
    blocks_per_program = cdiv(n_blocks, MAX_PROGRAMS)
    programs = cdiv(n_blocks, blocks_per_program)
    if probs is None:
        probs = torch.empty((T, K), dtype=torch.float32, device=device)
    ids = torch.empty((T, K), dtype=torch.int32, device=device)
    part_counts = torch.empty((E, programs), dtype=torch.int32, device=device)
    part_probs = torch.empty((E, programs), dtype=torch.float32, device=device)
    part_z = torch.empty(programs, dtype=torch.float32, device=device)
    counts = torch.empty(E, dtype=torch.int64, device=device)
    if aux_loss is None:
        aux_loss = torch.empty((), dtype=torch.float32, device=device)
    if z_loss is None:
        z_loss = torch.empty((), dtype=torch.float32, device=device)
    _router_fwd_kernel[(programs,)](
        logits, expert_bias if expert_bias is not None else logits, probs, ids, part_counts, part_probs, part_z,
        T, E, logits.stride(0), E // config.n_group, blocks_per_program, config.scaling_factor,
        K=K, K_PAD=next_power_of_2(K), E_PAD=e_pad, N_GROUP=config.n_group,
        G_PAD=g_pad, TOPK_GROUP=config.topk_group, GROUP_PICK=config.group_pick,
        GROUP_AXIS=e_pad == E and config.n_group == g_pad,
        SIGMOID=config.score_func == "sigmoid", RENORMALIZE=config.renormalize, HAS_BIAS=expert_bias is not None,
        BLOCK_T=block_t, num_warps=ROUTER_WARPS, maxnreg=FWD_MAX_REGISTERS,
    )
    _router_losses_kernel[(1,)](
        part_counts, part_probs, part_z, counts, aux_loss, z_loss, programs, E, config.balance_scale(T),
        1.0 / T, E_PAD=e_pad, BLOCK_P=max(1, min(MAX_PROGRAMS, TILE_ELEMENTS * 4 // e_pad)), num_warps=16,
    )
    return probs, ids, counts, aux_loss, z_loss


def router_backward(logits: torch.Tensor, ids: torch.Tensor, counts: torch.Tensor, config: RouterConfig,
                    grad_probs: torch.Tensor | None, grad_aux: torch.Tensor | None, grad_z: torch.Tensor | None,
                    grad_logits: torch.Tensor | None = None) -> torch.Tensor:
    """grad_logits [T, E] in the logits' dtype (into the given buffer if any); a None gradient is an output
    the loss did not use."""
    T, E = logits.shape
    if grad_logits is None:
        grad_logits = torch.empty_like(logits)
    e_pad = next_power_of_2(E)
    block_t = _block_t(e_pad)
    if grad_probs is not None:
        grad_probs = grad_probs.contiguous()  # a sum's gradient arrives expanded (stride 0)
    _router_bwd_kernel[(cdiv(T, block_t),)](
        logits, ids, grad_probs if grad_probs is not None else logits, counts,
        grad_aux if grad_aux is not None else logits, grad_z if grad_z is not None else logits, grad_logits,
        T, E, logits.stride(0), grad_logits.stride(0), config.balance_scale(T), 2.0 / T, config.scaling_factor,
        K=config.topk, E_PAD=e_pad,
        SIGMOID=config.score_func == "sigmoid", RENORMALIZE=config.renormalize,
        HAS_GRAD_PROBS=grad_probs is not None, HAS_AUX=grad_aux is not None, HAS_Z=grad_z is not None,
        BLOCK_T=block_t, num_warps=ROUTER_WARPS,
    )
    return grad_logits


# --- autograd -------------------------------------------------------------------------------------------


class _Route(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, expert_bias, config):
        probs, ids, counts, aux_loss, z_loss = router_forward(logits, config, expert_bias)
        ctx.mark_non_differentiable(ids, counts)
        # Outputs the loss does not use come back as None: their part of the backward is skipped.
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(logits, ids, counts)
        ctx.config = config
        return probs, ids, counts, aux_loss, z_loss

    @staticmethod
    def backward(ctx, grad_probs, _grad_ids, _grad_counts, grad_aux, grad_z):
        logits, ids, counts = ctx.saved_tensors
        if grad_probs is None and grad_aux is None and grad_z is None:
            return None, None, None
        return router_backward(logits, ids, counts, ctx.config, grad_probs, grad_aux, grad_z), None, None


# --- the public face -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Routing:
    """route's result. probs [T, topk] fp32 (the routing weights, differentiable), expert_ids [T, topk]
    int32 (best first), tokens_per_expert [E] int64 (on the device), aux_loss and z_loss (0-dim fp32,
    differentiable; unweighted: the caller multiplies by its coefficients)."""

    probs: torch.Tensor
    expert_ids: torch.Tensor
    tokens_per_expert: torch.Tensor
    aux_loss: torch.Tensor
    z_loss: torch.Tensor


def route(logits: torch.Tensor, config: RouterConfig, expert_bias: torch.Tensor | None = None) -> Routing:
    """Top-k routing of logits [T, E] (fp32, bf16 or fp16) as `config` says, with autograd to the
    logits (the bias steers the selection only and gets no gradient: it is updated from the counts)."""
    if not isinstance(config, RouterConfig):
        raise ValueError(f"route: config must be a RouterConfig, got {type(config).__name__}")
    if logits.ndim != 2 or logits.shape[1] != config.num_experts:
        raise ValueError(f"route: logits must be [T, num_experts={config.num_experts}], got {list(logits.shape)}")
    if logits.shape[0] == 0:
        raise ValueError("route: logits has no tokens")
    if logits.dtype not in LOGIT_DTYPES:
        raise ValueError(f"route: logits must be float32, bfloat16 or float16, got {logits.dtype}")
    if expert_bias is not None:
        if tuple(expert_bias.shape) != (config.num_experts,):
            raise ValueError(f"route: expert_bias must be [num_experts={config.num_experts}], got "
                             f"{list(expert_bias.shape)}")
        if expert_bias.dtype not in LOGIT_DTYPES:
            raise ValueError(f"route: expert_bias must be float32, bfloat16 or float16, got {expert_bias.dtype}")
        check_same_device(logits=logits, expert_bias=expert_bias)
        expert_bias = expert_bias.detach().contiguous()
    else:
        check_same_device(logits=logits)
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    probs, ids, counts, aux_loss, z_loss = _Route.apply(logits, expert_bias, config)
    return Routing(probs, ids, counts, aux_loss, z_loss)
