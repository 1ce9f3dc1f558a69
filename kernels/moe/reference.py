"""Torch implementations of the MoE ops: the float64 references of the tests (called on float64 inputs)
and the torch baselines the benchmarks time (called on the GPU's own dtypes). Plain torch ops with
autograd, written the way Megatron-LM and Hugging Face's DeepSeek-V3 write them."""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernels.moe.router import RENORM_EPS, RouterConfig


def torch_route(logits: torch.Tensor, config: RouterConfig, expert_bias: torch.Tensor | None = None,
                chosen_ids: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(probs, expert_ids, tokens_per_expert, aux_loss, z_loss) as kernels.moe.route defines them:
    topk + softmax / sigmoid, in float32 (float64 for float64 logits). `chosen_ids` [T, topk]: the experts
    taken as chosen instead of selecting them (a reference on logits computed at another precision, where a
    near tie could pick differently)."""
    x = logits if logits.dtype == torch.float64 else logits.float()
    T, E = x.shape
    scores = torch.sigmoid(x) if config.score_func == "sigmoid" else torch.softmax(x, dim=-1)
    ids = _select(scores.detach(), config, expert_bias) if chosen_ids is None else chosen_ids.long()
    probs = scores.gather(1, ids)
    if config.renormalize:
        probs = probs / (probs.sum(-1, keepdim=True) + RENORM_EPS)
    probs = probs * config.scaling_factor
    flat = ids.reshape(-1)
    counts = torch.zeros(E, dtype=torch.int64, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
    balance = scores / (scores.sum(-1, keepdim=True) + RENORM_EPS) if config.score_func == "sigmoid" else scores
    aux_loss = (balance.sum(0) * counts.to(x.dtype)).sum() * config.balance_scale(T)
    z_loss = torch.logsumexp(x, dim=-1).square().mean()
    return probs, ids, counts, aux_loss, z_loss


def _select(scores: torch.Tensor, config: RouterConfig, expert_bias: torch.Tensor | None) -> torch.Tensor:
    """The top-k experts of each token by scores (+ bias), within its best topk_group groups."""
    T, E = scores.shape
    sel = scores + expert_bias.to(scores.dtype) if expert_bias is not None else scores
    if config.n_group > 1:
        group_scores = sel.view(T, config.n_group, -1).topk(config.group_pick, dim=-1).values.sum(-1)
        kept = group_scores.topk(config.topk_group, dim=-1).indices
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
        sel = sel.masked_fill(~group_mask.repeat_interleave(E // config.n_group, dim=1), float("-inf"))
    return sel.topk(config.topk, dim=-1).indices


ExpertMatmul = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def grouped_mm_experts(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Rows of x sorted by expert (counts [E] of them each) times each expert's w[e]^T: torch._grouped_mm."""
    return torch._grouped_mm(x, w.transpose(-2, -1), offs=counts.cumsum(0).to(torch.int32))


def torch_moe_experts(x: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor, w_gate_up: torch.Tensor,
                      w_down: torch.Tensor, experts: ExpertMatmul = grouped_mm_experts) -> torch.Tensor:
    """kernels.moe.moe_experts in torch: a stable argsort and index_select, `experts` for GateUP and Down
    (torch._grouped_mm; a loop for float64), silu * up, the probabilities' weighted index_add_."""
    flat = ids.reshape(-1)
    counts = torch.zeros(w_gate_up.shape[0], dtype=torch.int64, device=x.device).scatter_add_(
        0, flat, torch.ones_like(flat))
    order = torch.argsort(flat, stable=True)
    tokens = order // ids.shape[1]
    h = experts(x.index_select(0, tokens), w_gate_up, counts)
    gate_half, up = h.chunk(2, dim=-1)
    y = experts(torch.nn.functional.silu(gate_half) * up, w_down, counts)
    weighted = y * probs.reshape(-1)[order].to(y.dtype)[:, None]
    return torch.zeros_like(x).index_add(0, tokens, weighted)


def torch_moe_mlp(x: torch.Tensor, gate: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                  config: RouterConfig, expert_bias: torch.Tensor | None = None,
                  chosen_ids: torch.Tensor | None = None, experts: ExpertMatmul = grouped_mm_experts,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, aux_loss, z_loss) of kernels.moe.MoEMLP in torch: torch_route, then torch_moe_experts."""
    probs, ids, _, aux_loss, z_loss = torch_route(x @ gate.t(), config, expert_bias, chosen_ids)
    return torch_moe_experts(x, ids, probs, w_gate_up, w_down, experts), aux_loss, z_loss


def loop_experts(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Rows of x sorted by expert times each expert's w[e]^T, one matmul per expert (any dtype and device,
    float64 included): the group sizes read on the host."""
    return torch.cat([rows @ w[e].t() for e, rows in enumerate(x.split(counts.tolist()))])


def torch_permute_rows(ids: torch.Tensor, num_experts: int, pad_to: int
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows [T, topk] int32, group_offs [E+1] int64, counts [E] int64) of permute's layout: the pairs
    sorted by expert (stable: token order within an expert), each group padded to pad_to. No host sync
    (scatter_add_, not bincount)."""
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    lens = (counts + pad_to - 1) // pad_to * pad_to
    group_offs = torch.cat([lens.new_zeros(1), lens.cumsum(0)])
    sorted_starts = counts.cumsum(0) - counts
    experts = flat[order]
    rank = torch.arange(flat.numel(), device=ids.device) - sorted_starts[experts]
    rows = torch.empty_like(flat).index_put_((order,), group_offs[experts] + rank)
    return rows.view(ids.shape).int(), group_offs, counts
