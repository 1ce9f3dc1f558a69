"""The OpSpec of attention: flash attention forward and backward, dense or packed, SDPA baselines.

A problem's dims: B, Hq, Hkv, Sq, Sk, D (q/k head dim), Dv (v head dim), causal (0/1) and window (keys
left of the diagonal; 0: none). A packed problem (documents of mixed lengths in one sequence) carries
its sequence lengths in `group_lens` (the same for queries and keys: self-attention): B is then the
number of sequences, Sq and Sk their mean, and the inputs are packed [total, H, D] with cu_seqlens.

The float64 reference needs no host read and no flag: make_inputs gives it, for every query row, the
range of key rows it sees (`key_lo`, `key_hi`, indices into k's rows), which says causal, window and
sequence boundaries at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels.attention import (
    AttentionShape,
    attention,
    attention_backward,
    attention_forward,
    attention_varlen,
    dense_shape,
    packed_shape,
)
from kernels.attention.kernel import quantize_qkv
from kernels.attention.tuning import FP8_VARIANT
from kernels.common.dtypes import dtype_name
from kernels.common.opspec import OpSpec, Problem, Runner, Tensors

# Scores of one reference chunk (float64 elements): bounds its memory (about 1 GiB a temporary).
REFERENCE_CHUNK = 2**27


def _options(problem: Problem) -> tuple[bool, int | None]:
    """(causal, window) of a problem; window 0 is none."""
    return bool(problem.dims["causal"]), problem.dims["window"] or None


def _seq_lens(problem: Problem) -> tuple[int, ...]:
    """Per-sequence lengths: group_lens when packed, else B sequences of Sq queries (Sk keys)."""
    return problem.group_lens if problem.group_lens is not None else (problem.dims["Sq"],) * problem.dims["B"]


def visible_keys(seqlen_q: int, seqlen_k: int, causal: bool, window: int | None) -> tuple[list[int], list[int]]:
    """For each query of one sequence, [first, last + 1) of the keys it sees (flash-attn's rules, bottom-right
    aligned); an empty range where it sees none."""
    diag = seqlen_k - seqlen_q
    lo = [max(0, i + diag - window) if window is not None else 0 for i in range(seqlen_q)]
    hi = [min(seqlen_k, i + diag + 1) if causal else seqlen_k for i in range(seqlen_q)]
    return lo, [max(h, low) for h, low in zip(hi, lo, strict=True)]


def make_inputs(problem: Problem) -> Tensors:
    """q, k, v and grad_out N(0, 1), seeded; key_lo / key_hi for the reference; cu_seqlens when packed."""
    d = problem.dims
    causal, window = _options(problem)
    gen = torch.Generator(device=problem.device).manual_seed(problem.seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=problem.device, dtype=problem.dtype)

    def index(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=problem.device)

    if problem.group_lens is None:
        lead_q, lead_k = (d["B"], d["Sq"]), (d["B"], d["Sk"])
        lo, hi = visible_keys(d["Sq"], d["Sk"], causal, window)
        extra = {}
    else:
        lens = problem.group_lens
        lead_q = lead_k = (sum(lens),)
        lo, hi, offsets = [], [], [0]
        for n in lens:  # each document attends within itself: key ranges offset by its first row
            doc_lo, doc_hi = visible_keys(n, n, causal, window)
            lo += [offsets[-1] + x for x in doc_lo]
            hi += [offsets[-1] + x for x in doc_hi]
            offsets.append(offsets[-1] + n)
        extra = {"cu_seqlens": torch.tensor(offsets, dtype=torch.int32, device=problem.device)}
    return {
        "q": randn(*lead_q, d["Hq"], d["D"]),
        "k": randn(*lead_k, d["Hkv"], d["D"]),
        "v": randn(*lead_k, d["Hkv"], d["Dv"]),
        "grad_out": randn(*lead_q, d["Hq"], d["Dv"]),
        "key_lo": index(lo),
        "key_hi": index(hi),
        **extra,
    }


def _shape(problem: Problem, inputs: Tensors) -> AttentionShape:
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    if problem.group_lens is None:
        return dense_shape(q, k, v)
    longest = max(problem.group_lens, default=0)
    return packed_shape(q, k, v, inputs["cu_seqlens"], inputs["cu_seqlens"], longest, longest)


def make_outputs(problem: Problem, inputs: Tensors) -> Tensors:
    """out, the gradients, and the LSE the forward leaves for the backward (not checked)."""
    shape, q = _shape(problem, inputs), inputs["q"]
    return {
        "out": q.new_empty(shape.out_shape(q.shape[0])),
        "dq": torch.empty_like(q),
        "dk": torch.empty_like(inputs["k"]),
        "dv": torch.empty_like(inputs["v"]),
        "lse": torch.empty(shape.lse_shape(q.shape[0]), device=q.device, dtype=torch.float32),
    }


def reference(inputs: Tensors) -> Tensors:
    """out, dq, dk, dv in float64, one chunk of query rows at a time (bounded memory at 32k tokens)."""
    q, k, v, g = (inputs[name].double() for name in ("q", "k", "v", "grad_out"))
    if q.ndim == 3:  # packed: one batch over all rows; key_lo / key_hi keep documents apart
        q, k, v, g = (t.unsqueeze(0) for t in (q, k, v, g))
    (B, Sq, Hq, D), (Sk, Hkv), Dv = q.shape, k.shape[1:3], v.shape[-1]
    group, scale = Hq // Hkv, 1.0 / math.sqrt(D)
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    out, dq = torch.empty_like(g), torch.empty_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    cols = torch.arange(Sk, device=q.device)
    rows_per_chunk = max(1, REFERENCE_CHUNK // max(1, B * Hq * Sk))
    for r0 in range(0, Sq, rows_per_chunk):
        rows = slice(r0, r0 + rows_per_chunk)
        seen = (cols[None, :] >= inputs["key_lo"][rows, None]) & (cols[None, :] < inputs["key_hi"][rows, None])
        s = torch.einsum("bqhd,bkhd->bhqk", q[:, rows], k) * scale
        p = torch.softmax(s.masked_fill(~seen, -math.inf), dim=-1).nan_to_num(0.0)  # rows that see nothing: 0
        out[:, rows] = o = torch.einsum("bhqk,bkhd->bqhd", p, v)
        delta = (g[:, rows] * o).sum(-1).transpose(1, 2)[..., None]  # rowsum(dO * O): [B, Hq, rows, 1]
        ds = p * (torch.einsum("bqhd,bkhd->bhqk", g[:, rows], v) - delta)
        dq[:, rows] = torch.einsum("bhqk,bkhd->bqhd", ds, k) * scale
        dk += torch.einsum("bhqk,bqhd->bkhd", ds, q[:, rows]) * scale
        dv += torch.einsum("bhqk,bqhd->bkhd", p, g[:, rows])
    # A kv head's gradient sums over the q heads that read it.
    dk = dk.view(B, Sk, Hkv, group, D).sum(3)
    dv = dv.view(B, Sk, Hkv, group, Dv).sum(3)
    result = {"out": out, "dq": dq, "dk": dk, "dv": dv}
    if inputs["q"].ndim == 3:
        result = {name: t.squeeze(0) for name, t in result.items()}
    return result


def _visible_pairs(problem: Problem) -> float:
    """(query, key) pairs computed, as FlashAttention counts them: all of them, half when causal; with a
    window, the pairs it lets through (counting half of 8k x 8k for a 128-key window would overstate 30x)."""
    causal, window = _options(problem)
    d = problem.dims
    total = 0.0
    for n in _seq_lens(problem):
        sq, sk = (n, n) if problem.group_lens is not None else (d["Sq"], d["Sk"])
        if window is not None:
            lo, hi = visible_keys(sq, sk, causal, window)
            total += sum(hi) - sum(lo)
        else:
            total += sq * sk / (2 if causal else 1)
    return total


def flops(problem: Problem) -> tuple[float, float]:
    """Forward: Q K^T (2*D per pair) and P V (2*Dv per pair) per head; backward 2.5x (FlashAttention's count)."""
    d = problem.dims
    fwd = 2.0 * d["Hq"] * _visible_pairs(problem) * (d["D"] + d["Dv"])
    return fwd, 2.5 * fwd


def bytes_moved(problem: Problem) -> tuple[float, float]:
    """Forward: q, k, v read (1 byte each in the FP8 forward), out written (and the fp32 LSE); backward: q, k,
    v, out, dO and the LSE read, dq, dk, dv written."""
    d = problem.dims
    size = torch.tensor([], dtype=problem.dtype).element_size()
    rows_q = sum(_seq_lens(problem))
    rows_k = rows_q if problem.group_lens is not None else d["B"] * d["Sk"]
    q = rows_q * d["Hq"] * d["D"] * size
    kv = rows_k * d["Hkv"] * (d["D"] + d["Dv"]) * size
    out = rows_q * d["Hq"] * d["Dv"] * size
    lse = rows_q * d["Hq"] * 4
    inputs_read = (q + kv) // size if problem.variant == FP8_VARIANT else q + kv
    return float(inputs_read + out + lse), float(2 * (q + kv) + 2 * out + lse)


def snr_formats(problem: Problem) -> dict[str, str]:
    """The inputs' dtype; `e4m3-attention` (rules/iteration_rules.yaml) for every output of the FP8 forward
    (the gradients read its out and LSE)."""
    name = "e4m3-attention" if problem.variant == FP8_VARIANT else dtype_name(problem.dtype)
    return dict.fromkeys(("out", "dq", "dk", "dv"), name)


def _forward_high_precision(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    causal, window = _options(problem)
    attention_forward(inputs["q"], inputs["k"], inputs["v"], _shape(problem, inputs), causal, None, window,
                      out=outputs["out"], lse=outputs["lse"])


def _forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    """Our forward; in FP8_VARIANT with its quantization of q, k and v (per sequence and head), as a training
    step's forward pays it."""
    if problem.variant != FP8_VARIANT:
        _forward_high_precision(problem, inputs, outputs)
        return
    causal, window = _options(problem)
    (q, k, v), scales = quantize_qkv(inputs["q"], inputs["k"], inputs["v"], _shape(problem, inputs))
    attention_forward(q, k, v, _shape(problem, inputs | {"q": q, "k": k, "v": v}), causal, None, window,
                      out=outputs["out"], lse=outputs["lse"], scales=scales)


def _backward(problem: Problem, inputs: Tensors, outputs: Tensors) -> None:
    causal, window = _options(problem)
    attention_backward(inputs["grad_out"], inputs["q"], inputs["k"], inputs["v"], outputs["out"], outputs["lse"],
                       _shape(problem, inputs), causal, None, window,
                       dq=outputs["dq"], dk=outputs["dk"], dv=outputs["dv"])


def train_step(problem: Problem, inputs: Tensors) -> Tensors:
    """out = attention(q, k, v) on leaf copies, then the backward of sum(out * grad_out) (see gemm_train_step)."""
    causal, window = _options(problem)
    q, k, v = (inputs[name].detach().clone().requires_grad_() for name in ("q", "k", "v"))
    fp8_forward = problem.variant == FP8_VARIANT
    if problem.group_lens is None:
        out = attention(q, k, v, causal=causal, window=window, fp8_forward=fp8_forward)
    else:
        cu, longest = inputs["cu_seqlens"], max(problem.group_lens, default=0)
        out = attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal, window=window,
                               fp8_forward=fp8_forward)
    (out * inputs["grad_out"]).sum().backward()
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


# --- baselines: torch SDPA on one backend ---------------------------------------------------------------


# The autograd graph of each baseline's last forward (its output and the leaves it was called on), so that
# its backward can be timed alone (autograd.grad with retain_graph: the harness calls it repeatedly).
# One slot per baseline, replaced by its next forward: a saved activation, not a result cache.
_GRAPHS: dict[str, tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = {}


def _leaves(inputs: Tensors) -> tuple[torch.Tensor, ...]:
    """q, k, v as autograd leaves sharing the inputs' storage, batched ([1, total, H, D] when packed)."""
    return tuple(t.detach().requires_grad_() for t in (inputs[n] for n in ("q", "k", "v")))


def _record(name: str, out: torch.Tensor, leaves: tuple[torch.Tensor, ...], packed: bool) -> Tensors:
    """Keep the graph for the backward; return out in our layout ([B, S, H, D], or [total, H, D])."""
    out = out.transpose(1, 2)
    out = out[0] if packed else out
    _GRAPHS[name] = (out, leaves)
    return {"out": out.detach()}


def _baseline_backward(name: str) -> Callable[[Problem, Tensors, Tensors], Tensors]:
    def backward(problem: Problem, inputs: Tensors, outputs: Tensors) -> Tensors:
        out, leaves = _GRAPHS[name]
        dq, dk, dv = torch.autograd.grad(out, leaves, inputs["grad_out"], retain_graph=True)
        return {"dq": dq, "dk": dk, "dv": dv}

    return backward


def _sdpa_runner(name: str, backend: SDPBackend) -> Runner:
    """SDPA restricted to one backend, in its [B, H, S, D] layout (transposed views of ours). GQA runs with
    k/v expanded to Hq heads inside the timed call (what enable_gqa does for backends without native GQA).
    SDPA aligns causal masks top-left and has no window or packed form: those problems are refused (a FAIL
    row for the baseline)."""

    def forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> Tensors:
        causal, window = _options(problem)
        d = problem.dims
        if problem.group_lens is not None or window is not None or (causal and d["Sq"] != d["Sk"]):
            raise ValueError(f"{name}: SDPA has no packed, windowed or bottom-right causal form")
        leaves = _leaves(inputs)
        q, k, v = (t.transpose(1, 2) for t in leaves)
        group = d["Hq"] // d["Hkv"]
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return _record(name, out, leaves, packed=False)

    return Runner(name, forward, _baseline_backward(name))


# Compiled flex_attention and the block mask of each problem (by dims and sequence lengths): building a
# block mask evaluates the mask over every (query, key) block, so it is made once, outside the timing.
_FLEX: dict[str, object] = {}


def _flex_forward(problem: Problem, inputs: Tensors, outputs: Tensors) -> Tensors:
    """torch.compile'd flex_attention with the reference's visibility (key_lo <= key < key_hi for each query
    row, which holds causal, window and document boundaries): the windowed and packed shapes SDPA refuses."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    _, window = _options(problem)
    if problem.device.type != "cuda" or (window is None and problem.group_lens is None):
        raise ValueError("flex_attention: compiled for the GPU, on windowed or packed shapes only")
    key = repr((sorted(problem.dims.items()), problem.group_lens))
    if key not in _FLEX:
        lo, hi = inputs["key_lo"], inputs["key_hi"]

        def visible(b, h, q_idx, kv_idx):
            return (kv_idx >= lo[q_idx]) & (kv_idx < hi[q_idx])

        _FLEX.setdefault("fn", torch.compile(flex_attention, dynamic=False))
        rows_q, rows_k = inputs["q"].shape[-3], inputs["k"].shape[-3]
        _FLEX[key] = create_block_mask(visible, None, None, rows_q, rows_k, device=problem.device)
    packed = problem.group_lens is not None
    leaves = _leaves(inputs)
    q, k, v = (t[None] if packed else t for t in leaves)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out = _FLEX["fn"](q, k, v, block_mask=_FLEX[key], enable_gqa=problem.dims["Hq"] != problem.dims["Hkv"])
    return _record("flex_attention", out, leaves, packed)


SPEC = OpSpec(
    name="attention",
    description="flash attention fwd+bwd (bf16/fp16, fp32 accumulation): GQA, causal, sliding window, packed "
                "sequences, head dims 64-256 and MLA's 192/128",
    mutable_files=("kernels/attention/kernel.py", "kernels/attention/tuning.py"),
    schema="attention",
    shape_family="attention",
    dtypes=("bf16", "fp16"),
    forward_outputs=("out",),
    backward_outputs=("dq", "dk", "dv"),
    make_inputs=make_inputs,
    make_outputs=make_outputs,
    reference=reference,
    flops=flops,
    bytes_moved=bytes_moved,
    snr_formats=snr_formats,
    runner=Runner("turbo-opt", _forward, _backward),
    baselines=(
        _sdpa_runner("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
        _sdpa_runner("sdpa-flash", SDPBackend.FLASH_ATTENTION),
        Runner("flex_attention", _flex_forward, _baseline_backward("flex_attention")),
        # The FP8 forward's anchor: our own forward in the inputs' dtype.
        Runner("turbo-opt bf16", _forward_high_precision, _backward, variants=(FP8_VARIANT,)),
    ),
    variants=("default", FP8_VARIANT),
    default_preset="llama3-8b",
    train_step=train_step,
    fp32_accumulation=True,
)
