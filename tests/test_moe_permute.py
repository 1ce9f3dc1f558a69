"""Token permute / unpermute (kernels/moe) against float64 torch references (argsort + index_copy_ /
index_add_), forward and backward, on skewed, empty and one-token routings; GPU: CUDA-graph replay."""

import importlib
import math

import pytest
import torch

from harness.snr import snr_db, snr_threshold
from kernels.common.dtypes import dtype_name
from kernels.grouped_gemm_fp8 import grouped_gemm_fp8
from kernels.moe import RowMap, capacity_for, permute, unpermute
from kernels.moe.permute import SCAN_EXPERTS, rank_block, route_and_scatter, scatter_rows, sort_by_expert
from tests.graph_replay import replay_and_eager


def routing(case: str, T: int, topk: int, E: int, device, seed: int = 0) -> torch.Tensor:
    """expert_ids [T, topk], distinct experts per token. hot: expert 0 in every token's top-k (half of
    all pairs at top-2); empty: only the even experts are picked; uniform: any experts."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(T, E, generator=g)
    if case == "hot":
        scores[:, 0] += 2.0
    elif case == "empty":
        scores[:, 1::2] -= 2.0
    return scores.topk(topk, dim=1).indices.to(device)


def reference_permute(x, ids, probs, E, pad_to):
    """float64: (permuted, permuted_probs, rows, group_lens, group_offs) by a stable argsort."""
    T, K = ids.shape
    flat = ids.reshape(-1).long().cpu()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E)
    lens = (counts + pad_to - 1) // pad_to * pad_to
    offs = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    sorted_starts = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])[:-1]
    e_sorted = flat[order]
    rows = torch.empty_like(flat)
    rows[order] = offs[:-1][e_sorted] + torch.arange(flat.numel()) - sorted_starts[e_sorted]
    rows = rows.to(x.device)
    capacity = capacity_for(T, K, E, pad_to)
    token_of_pair = torch.arange(T * K, device=x.device) // K
    permuted = x.new_zeros(capacity, x.shape[1], dtype=torch.float64).index_copy(
        0, rows, x.double().index_select(0, token_of_pair))
    pprobs = None
    if probs is not None:
        pprobs = probs.new_zeros(capacity, dtype=torch.float64).index_copy(0, rows, probs.double().reshape(-1))
    return permuted, pprobs, rows.view(T, K), lens, offs


def reference_unpermute(permuted, rows, probs):
    """float64: out[t] = sum_k probs[t, k] * permuted[rows[t, k]] by index_select + index_add_."""
    T, K = rows.shape
    picked = permuted.double().index_select(0, rows.reshape(-1).long())
    if probs is not None:
        picked = picked * probs.double().reshape(-1, 1)
    token_of_pair = torch.arange(T * K, device=rows.device) // K
    return picked.new_zeros(T, permuted.shape[1]).index_add_(0, token_of_pair, picked)


# (routing, T, topk, E, H): skewed, empty experts, one token, top-1, top-8; "blocks" spans several rank
# blocks (T*topk > BLOCK_PAIRS) so the scan across blocks counts, and "experts" several scan programs too
# (more than SCAN_EXPERTS experts, the last program's short, odd ones empty); H is no power of two (masked
# columns).
CASES = {
    "hot-top2": ("hot", 37, 2, 5, 40),
    "empty-top4": ("empty", 29, 4, 12, 24),
    "one-token-top8": ("uniform", 1, 8, 16, 72),
    "top1": ("hot", 21, 1, 3, 16),
    "top8": ("uniform", 19, 8, 9, 40),
    "blocks": ("hot", 300, 4, 8, 8),
    "experts": ("empty", 300, 4, 72, 8),
}
assert rank_block(300 * 4) < 300 * 4 and CASES["experts"][3] > 2 * SCAN_EXPERTS


def make(case: str, device, dtype, seed: int = 0):
    kind, T, K, E, H = CASES[case]
    torch.manual_seed(seed)
    x = torch.randn(T, H, dtype=dtype, device=device)
    probs = torch.rand(T, K, dtype=torch.float32, device=device)
    return x, routing(kind, T, K, E, device, seed), probs, E


@pytest.mark.parametrize("pad_to", [1, 16, 128])
@pytest.mark.parametrize("case", CASES)
def test_permute_forward_is_the_stable_sort_into_poisoned_buffers(case, pad_to, device, half_dtype):
    """Every row of NaN-filled output buffers is written: each copy exact, in token order within an
    expert, padding and tail rows zero, group_lens multiples of pad_to."""
    x, ids, probs, E = make(case, device, half_dtype)
    T, K = ids.shape
    capacity = capacity_for(T, K, E, pad_to)
    permuted = torch.full((capacity, x.shape[1]), math.nan, dtype=x.dtype, device=device)
    pprobs = torch.full((capacity,), math.nan, dtype=probs.dtype, device=device)
    row_map, lens = route_and_scatter(x, ids, probs, E, pad_to, capacity, permuted, pprobs)
    ref_permuted, ref_pprobs, ref_rows, ref_lens, ref_offs = reference_permute(x, ids, probs, E, pad_to)
    assert torch.equal(row_map.rows.long(), ref_rows)
    assert lens.dtype == torch.int64 and torch.equal(lens.cpu(), ref_lens)
    assert torch.equal(row_map.group_offs.cpu(), ref_offs)
    assert bool((lens % pad_to == 0).all())
    assert torch.equal(permuted.double(), ref_permuted)  # exact copies, zeros elsewhere: no NaN left
    assert torch.equal(pprobs.double(), ref_pprobs)


@pytest.mark.parametrize("pad_to", [1, 128])
@pytest.mark.parametrize("case", CASES)
def test_sort_by_expert_is_permute_without_the_copies(case, pad_to, device, half_dtype):
    """The same row map and groups as permute; sources the inverse of the row map (-1 on the rows no
    pair fills); each filled row's probability."""
    x, ids, probs, E = make(case, device, half_dtype)
    order = sort_by_expert(ids, probs, num_experts=E, pad_to=pad_to)
    p = permute(x, ids, probs, num_experts=E, pad_to=pad_to)
    assert torch.equal(order.row_map.rows, p.row_map.rows) and torch.equal(order.group_offs, p.group_offs)
    assert torch.equal(order.group_lens, p.group_lens) and order.sources.numel() == p.row_map.capacity
    rows = p.row_map.rows.long()
    want = torch.full((p.row_map.capacity,), -1, dtype=torch.int32, device=device)
    want[rows[rows >= 0]] = torch.arange(ids.shape[0], device=device)[:, None].expand_as(rows)[rows >= 0].int()
    assert torch.equal(order.sources, want)
    filled = want >= 0
    assert torch.equal(order.permuted_probs[filled], p.permuted_probs[filled])


@pytest.mark.parametrize("pad_to", [1, 16])
@pytest.mark.parametrize("case", ["hot-top2", "empty-top4", "one-token-top8", "top8"])
def test_permute_experts_unpermute_forward_and_backward_by_snr(case, pad_to, device, half_dtype):
    """permute -> a per-row scaling (stands in for the experts) -> unpermute, with a loss on the permuted
    probabilities too: the output and the gradients of tokens and probs against float64 autograd."""
    x, ids, probs, E = make(case, device, half_dtype, seed=1)
    T, K = ids.shape
    capacity = capacity_for(T, K, E, pad_to)
    scale = torch.randn(capacity, 1, dtype=half_dtype, device=device)
    grad_out = torch.randn_like(x)
    grad_pprobs = torch.randn(capacity, dtype=torch.float32, device=device)

    def run(tokens, p, permute_fn, unpermute_fn):
        permuted, pprobs, rows = permute_fn(tokens, p)
        out = unpermute_fn(permuted * scale, rows, p)
        ((out.double() * grad_out.double()).sum() + (pprobs.double() * grad_pprobs.double()).sum()).backward()
        return out

    def ours(tokens, p):
        r = permute(tokens, ids, p, num_experts=E, pad_to=pad_to)
        return r.permuted, r.permuted_probs, r.row_map

    def theirs(tokens, p):
        permuted, pprobs, rows, _, _ = reference_permute(tokens, ids, p, E, pad_to)
        return permuted, pprobs, rows

    x1, p1 = x.clone().requires_grad_(), probs.clone().requires_grad_()
    x2, p2 = x.double().requires_grad_(), probs.double().requires_grad_()
    out = run(x1, p1, ours, unpermute)
    ref = run(x2, p2, theirs, reference_unpermute)
    snrs = [snr_db(out, ref), snr_db(x1.grad, x2.grad), snr_db(p1.grad, p2.grad)]
    # the rules' threshold of the dtype: the stand-in experts' product rounds to it (bf16: 49-60 dB on the GPU)
    assert min(snrs) >= snr_threshold(dtype_name(half_dtype)), snrs


@pytest.mark.parametrize("with_probs", [True, False])
@pytest.mark.parametrize("case", ["hot-top2", "empty-top4", "top8"])
def test_unpermute_gradients_and_zero_padding_rows(case, with_probs, device, half_dtype):
    """unpermute alone on a random [capacity, H] input: forward and both gradients by SNR; the gradient
    of the rows no pair reads is exactly zero."""
    x, ids, probs, E = make(case, device, half_dtype, seed=2)
    r = permute(x, ids, num_experts=E, pad_to=16)
    h = torch.randn_like(r.permuted).requires_grad_()
    p = probs.clone().requires_grad_() if with_probs else None
    out = unpermute(h, r.row_map, p)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    h64 = h.detach().double().requires_grad_()
    p64 = probs.double().requires_grad_() if with_probs else None
    ref = reference_unpermute(h64, r.row_map.rows, p64)
    ref.backward(grad_out.double())
    assert snr_db(out, ref) >= 50 and snr_db(h.grad, h64.grad) >= 50
    if with_probs:
        assert snr_db(p.grad, p64.grad) >= 50
    unread = torch.ones(h.shape[0], dtype=torch.bool, device=device)
    unread[r.row_map.rows.reshape(-1).long()] = False
    assert bool(unread.any()) and not bool(h.grad[unread].any())


def test_unpermute_backward_writes_every_row_of_poisoned_buffers(device, half_dtype):
    """unpermute's backward kernel (the weighted scatter with the probabilities' dots, and the zeroing
    of unread rows) into NaN-filled buffers: nothing left unwritten."""
    x, ids, probs, E = make("empty-top4", device, half_dtype, seed=3)
    r = permute(x, ids, num_experts=E, pad_to=128)
    h = torch.randn_like(r.permuted)
    grad_out = torch.randn_like(x)
    grad_h = torch.full_like(h, math.nan)
    grad_p = torch.full_like(probs, math.nan)
    scatter_rows(grad_out, r.row_map, probs, grad_h, h, grad_p)
    h64 = h.double().requires_grad_()
    p64 = probs.double().requires_grad_()
    reference_unpermute(h64, r.row_map.rows, p64).backward(grad_out.double())
    assert snr_db(grad_h, h64.grad) >= 50 and snr_db(grad_p, p64.grad) >= 50


@pytest.mark.parametrize("case", ["hot-top2", "top8"])
def test_rows_wider_than_a_block_take_several_blocks(case, device, half_dtype, monkeypatch):
    """Rows of 40 columns through 16-column blocks (the H100's 8192 and 1024 stand for hidden sizes past
    them): permute's row held block by block, the weighted scatter's and the gather's tiles, the zeroing's,
    each with a partial last block; into poisoned buffers."""
    permute_module = importlib.import_module("kernels.moe.permute")  # the package's `permute` is the function
    for name in ("SCATTER_BLOCK_H", "TILE_BLOCK_H", "ZERO_BLOCK_H"):
        monkeypatch.setattr(permute_module, name, 16)
    x, ids, probs, E = make(case, device, half_dtype, seed=5)
    T, K = ids.shape
    assert x.shape[1] == 40
    capacity = capacity_for(T, K, E, 16)
    permuted = torch.full((capacity, x.shape[1]), math.nan, dtype=x.dtype, device=device)
    row_map, _ = route_and_scatter(x, ids, probs, E, 16, capacity, permuted,
                                   torch.empty(capacity, dtype=probs.dtype, device=device))
    assert torch.equal(permuted.double(), reference_permute(x, ids, probs, E, 16)[0])
    h = torch.randn_like(permuted)
    out = unpermute(h, row_map, probs)
    grad_out = torch.randn_like(x)
    grad_h = torch.full_like(h, math.nan)
    grad_p = torch.full_like(probs, math.nan)
    scatter_rows(grad_out, row_map, probs, grad_h, h, grad_p)
    h64 = h.double().requires_grad_()
    p64 = probs.double().requires_grad_()
    ref = reference_unpermute(h64, row_map.rows, p64)
    ref.backward(grad_out.double())
    assert snr_db(out, ref) >= 50 and snr_db(grad_h, h64.grad) >= 50 and snr_db(grad_p, p64.grad) >= 50


@pytest.mark.parametrize("pad_to", [1, 128])
@pytest.mark.parametrize("case", ["top1", "hot-top2", "top8"])
def test_round_trip_with_probs_one_over_topk_is_the_identity(case, pad_to, device, half_dtype):
    """unpermute(permute(x), probs = 1/topk) == x bit for bit: 1/topk (1, 2, 8) is a power of two and the
    sum of topk exact copies in fp32 is exact."""
    x, ids, _, E = make(case, device, half_dtype, seed=4)
    probs = torch.full(ids.shape, 1.0 / ids.shape[1], device=device)
    r = permute(x, ids, probs, num_experts=E, pad_to=pad_to)
    assert torch.equal(unpermute(r.permuted, r.row_map, probs), x)
    assert torch.equal(unpermute(r.permuted, r.row_map) * (1.0 / ids.shape[1]), x)


def test_gradients_of_sums_arrive_expanded_and_are_read_right(device, half_dtype):
    """.sum() hands its gradient over expanded (stride 0): the backward kernels must not read it as is."""
    x, ids, probs, E = make("empty-top4", device, half_dtype, seed=8)
    x.requires_grad_()
    probs.requires_grad_()
    r = permute(x, ids, probs, num_experts=E, pad_to=16)
    (r.permuted.float().sum() + r.permuted_probs.sum() + unpermute(r.permuted, r.row_map).float().sum()).backward()
    assert torch.equal(x.grad, torch.full_like(x, 2 * ids.shape[1]))  # each copy: once from permuted, once via out
    assert torch.equal(probs.grad, torch.ones_like(probs))


def test_fp32_tokens_and_int32_ids(device):
    x, ids, probs, E = make("hot-top2", device, torch.float32, seed=5)
    r = permute(x, ids.int(), probs, num_experts=E)
    ref_permuted, ref_pprobs, ref_rows, _, _ = reference_permute(x, ids, probs, E, 1)
    assert torch.equal(r.permuted.double(), ref_permuted) and torch.equal(r.permuted_probs.double(), ref_pprobs)
    assert snr_db(unpermute(r.permuted, r.row_map, probs), reference_unpermute(ref_permuted, ref_rows, probs)) > 60


def test_ids_out_of_range_are_dropped_by_the_kernels_not_written_out_of_bounds(device, half_dtype):
    """What the kernels do with ids the host did not check (a GPU without validate=True): the pair gets
    row -1, no copy, and the rows it would have used stay zero."""
    x, ids, probs, E = make("hot-top2", device, half_dtype, seed=6)
    ids = ids.clone()
    ids[3, 1], ids[10, 0] = E, -1
    T, K = ids.shape
    permuted = torch.full((capacity_for(T, K, E, 16), x.shape[1]), math.nan, dtype=x.dtype, device=device)
    row_map, _ = route_and_scatter(x, ids, probs, E, 16, permuted.shape[0], permuted, None)
    assert row_map.rows[3, 1] == -1 and row_map.rows[10, 0] == -1
    assert int(row_map.counts.sum()) == T * K - 2
    assert not bool(permuted.isnan().any())
    valid_pairs = ((ids >= 0) & (ids < E)).sum(1, keepdim=True)
    assert torch.equal(unpermute(permuted, row_map).double(), x.double() * valid_pairs)


def test_bad_inputs_raise_one_line_value_errors(device):
    x = torch.randn(6, 16, dtype=torch.float16, device=device)
    # every expert picked: ids - 1 holds -1 and ids + 1 holds 4 (drawn at random, they did not always)
    ids = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0], [0, 2], [1, 3]], device=device)
    probs = torch.rand(6, 2, device=device)
    cases = [
        (lambda: permute(x, ids - 1, num_experts=4, validate=True), r"outside \[0, 4\)"),
        (lambda: permute(x, ids, probs[:, :1], num_experts=4), r"probs must be \[T, topk\] = \[6, 2\]"),
        (lambda: permute(x, ids, probs.long(), num_experts=4), "probs must be float32"),
        (lambda: permute(x, ids.float(), num_experts=4), "int32 or int64"),
        (lambda: permute(x, ids[:5], num_experts=4), "5 tokens but tokens has 6"),
        (lambda: permute(x[0], ids, num_experts=4), r"\[T, H\]"),
        (lambda: permute(x.to(torch.int8), ids, num_experts=4), "bfloat16, float16 or float32"),
        (lambda: permute(x, ids, num_experts=0), "positive int"),
        (lambda: permute(x, ids, num_experts=4, pad_to=64), "pad_to must be one of"),
        (lambda: permute(x, ids[:, 0], num_experts=4), "int32 or int64 \\[T, topk\\]"),
        (lambda: sort_by_expert(ids + 4, num_experts=4, validate=True),
         r"sort_by_expert: expert_ids holds ids outside \[0, 4\)"),
        (lambda: sort_by_expert(ids, probs[:, :1], num_experts=4), r"sort_by_expert: probs must be \[T, topk\]"),
        (lambda: sort_by_expert(ids, num_experts=4, pad_to=3), "sort_by_expert: pad_to must be one of"),
    ]
    if device.type == "cpu":  # ids on the GPU are checked only with validate=True (a host sync)
        cases.append((lambda: permute(x, ids + 1, num_experts=4), r"outside \[0, 4\)"))
    r = permute(x, ids, num_experts=4, pad_to=16)
    cases += [
        (lambda: unpermute(r.permuted[:-1], r.row_map), r"must be \[72, H\]"),
        (lambda: unpermute(r.permuted, r.row_map.rows), "RowMap"),
        (lambda: unpermute(r.permuted, r.row_map, probs.t()), "probs must be"),
        (lambda: unpermute(r.permuted.long(), r.row_map), "bfloat16, float16 or float32"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match) as err:
            call()
        assert "\n" not in str(err.value)


@pytest.mark.gpu
def test_gpu_permute_fp8_experts_unpermute_step_replays_under_cuda_graphs():
    """permute -> grouped_gemm_fp8 -> unpermute, forward and backward, captured once and replayed on new
    tokens, probabilities and weights: the same results as eager, and close to float64."""
    torch.manual_seed(0)
    T, K, E, H, N = 2048, 8, 32, 1024, 512
    ids = routing("hot", T, K, E, "cuda")
    x = torch.randn(T, H, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    probs = torch.rand(T, K, device="cuda", requires_grad=True)
    w = torch.randn(E, N, H, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    grad_out = torch.randn(T, N, dtype=torch.bfloat16, device="cuda")

    def step():
        x.grad = probs.grad = w.grad = None
        r = permute(x, ids, probs, num_experts=E, pad_to=128)
        out = unpermute(grouped_gemm_fp8(r.permuted, w, r.group_lens), r.row_map, probs)
        out.backward(grad_out)
        return out, x.grad, probs.grad, w.grad

    replayed, eager = replay_and_eager(step, (x, probs, w))
    for got, want in zip(replayed, eager, strict=True):
        assert torch.equal(got, want)
    # float64 reference of the bf16 math the FP8 step approximates
    x64, p64, w64 = (t.detach().double().requires_grad_() for t in (x, probs, w))
    permuted, _, rows, lens, _ = reference_permute(x64, ids, None, E, 1)
    h = torch.cat([seg @ w64[e].t() for e, seg in enumerate(permuted.split(lens.tolist()))])
    ref = reference_unpermute(h, rows, p64)
    ref.backward(grad_out.double())
    for got, want in zip(eager, (ref, x64.grad, p64.grad, w64.grad), strict=True):
        assert snr_db(got, want) >= 20


@pytest.mark.gpu
@pytest.mark.parametrize("pad_to", [1, 128])
def test_gpu_bf16_large_hidden_matches_reference(pad_to):
    """DeepSeek-V3's hidden size and 256 experts on the GPU: exact copies, bf16 combine by SNR, and
    validate=True catching an id out of range."""
    T, K, E, H = 1024, 8, 256, 7168
    ids = routing("hot", T, K, E, "cuda", seed=7)
    x = torch.randn(T, H, dtype=torch.bfloat16, device="cuda")
    probs = torch.rand(T, K, device="cuda")
    r = permute(x, ids, probs, num_experts=E, pad_to=pad_to)
    ref_permuted, _, ref_rows, ref_lens, _ = reference_permute(x, ids, probs, E, pad_to)
    assert torch.equal(r.permuted.double(), ref_permuted) and torch.equal(r.group_lens.cpu(), ref_lens)
    assert snr_db(unpermute(r.permuted, r.row_map, probs), reference_unpermute(ref_permuted, ref_rows, probs)) >= 40
    bad = ids.clone()
    bad[5, 3] = E
    with pytest.raises(ValueError, match="outside"):
        permute(x, bad, num_experts=E, validate=True)
    assert isinstance(r.row_map, RowMap)
