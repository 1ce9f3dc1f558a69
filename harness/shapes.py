"""Benchmark shapes: presets for dense GEMM (Llama-3), grouped GEMM (MoE models, with skewed token
splits) and attention (model heads, long context, packed documents), and shapes read from a YAML file.

A YAML shape file is a list of shapes (or `shapes: [...]`), each a label, its dims and, for grouped
ops, optional explicit `group_lens`:

    - {label: square-4k, M: 4096, N: 4096, K: 4096}
    - {label: one-hot, B: 4, M: 256, N: 512, K: 256, group_lens: [1024, 0, 0, 0]}
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, ValidationError, model_validator

from harness.errors import UserError
from harness.files import atomic_write_text
from harness.rules import first_error

SKEWS: tuple[str, ...] = ("uniform", "topk", "hot", "empty")
GROUP_MEAN_DIMS: tuple[str, ...] = ("M", "Sq", "Sk")


class Shape(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    label: str = Field(min_length=1)
    dims: dict[str, PositiveInt]
    # Tokens per group for grouped ops; M is then their mean, rounded down.
    group_lens: tuple[NonNegativeInt, ...] | None = None

    @model_validator(mode="before")
    @classmethod
    def _fold_flat_dims(cls, data: Any) -> Any:
        """Accept `{label, M, N, K}` as well as `{label, dims: {M, N, K}}`."""
        if isinstance(data, dict) and "dims" not in data:
            dims = {k: v for k, v in data.items() if k not in ("label", "group_lens")}
            data = {k: v for k, v in data.items() if k in ("label", "group_lens")} | {"dims": dims}
        return data

    @model_validator(mode="after")
    def _check_groups(self) -> Shape:
        if self.group_lens is None:
            return self
        groups = self.dims.get("B")
        if groups != len(self.group_lens):
            raise ValueError(f"group_lens has {len(self.group_lens)} entries but B is {groups}")
        mean = sum(self.group_lens) // groups
        # The per-group size dims: M (tokens per expert) for grouped GEMMs, Sq and Sk (tokens per packed
        # sequence) for attention.
        for dim in [d for d in GROUP_MEAN_DIMS if d in self.dims] or ["M"]:
            if self.dims.get(dim) != mean:
                raise ValueError(f"{dim} must be the mean of group_lens rounded down ({mean})")
        return self


class ShapeFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    shapes: list[Shape] = Field(min_length=1)


# --- token splits for grouped GEMM ------------------------------------------------------------------


def split_tokens(total: int, groups: int, skew: str, seed: int = 0) -> list[int]:
    """Split `total` routed tokens over `groups` experts.

    uniform: equal shares. topk: router imbalance (log-normal expert popularity) with a capacity
    factor of 1.25, tokens over capacity dropped. hot: one expert takes half the tokens. empty: a
    quarter of the experts (at least one) get none.
    """
    rng = np.random.default_rng(seed)
    if skew == "uniform":
        base, extra = divmod(total, groups)
        return [base + (i < extra) for i in range(groups)]
    if skew == "topk":
        popularity = rng.lognormal(mean=0.0, sigma=0.6, size=groups)
        counts = rng.multinomial(total, popularity / popularity.sum())
        capacity = math.ceil(1.25 * total / groups)
        return [int(c) for c in np.minimum(counts, capacity)]
    if skew == "hot":
        hot = math.ceil(total / 2)
        rest = rng.multinomial(total - hot, np.full(groups - 1, 1.0 / (groups - 1))) if groups > 1 else []
        return [hot, *(int(c) for c in rest)]
    if skew == "empty":
        n_empty = max(1, groups // 4)
        live = rng.multinomial(total, np.full(groups - n_empty, 1.0 / (groups - n_empty)))
        lens = [0] * n_empty + [int(c) for c in live]
        rng.shuffle(lens)
        return [int(c) for c in lens]
    raise UserError(f"unknown skew '{skew}' (known: {', '.join(SKEWS)})")


def grouped_shape(label: str, groups: int, tokens_per_group: int, N: int, K: int, skew: str, seed: int = 0) -> Shape:
    lens = split_tokens(groups * tokens_per_group, groups, skew, seed)
    return Shape(label=label, dims={"B": groups, "M": sum(lens) // groups, "N": N, "K": K}, group_lens=tuple(lens))


# --- model presets ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DenseModel:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int = 128
    vocab: int = 128256

    def projections(self) -> dict[str, tuple[int, int]]:
        """(N, K) of each Linear layer of a transformer block, and of the output head."""
        q = self.heads * self.head_dim
        return {
            "qkv": (q + 2 * self.kv_heads * self.head_dim, self.hidden),
            "o": (self.hidden, q),
            "gate_up": (2 * self.intermediate, self.hidden),
            "down": (self.hidden, self.intermediate),
            "lm_head": (self.vocab, self.hidden),
        }


@dataclass(frozen=True)
class MLADenseModel:
    """The dense layers of a multi-head-latent-attention model (DeepSeek-V3): low-rank query and
    key/value projections, the output projection, and the dense MLP of its first layers."""

    hidden: int
    intermediate: int
    heads: int
    q_rank: int
    kv_rank: int
    qk_nope_dim: int = 128
    qk_rope_dim: int = 64
    v_dim: int = 128

    def projections(self) -> dict[str, tuple[int, int]]:
        return {
            "q_a": (self.q_rank, self.hidden),
            "q_b": (self.heads * (self.qk_nope_dim + self.qk_rope_dim), self.q_rank),
            "kv_a": (self.kv_rank + self.qk_rope_dim, self.hidden),
            "kv_b": (self.heads * (self.qk_nope_dim + self.v_dim), self.kv_rank),
            "o": (self.hidden, self.heads * self.v_dim),
            "gate_up": (2 * self.intermediate, self.hidden),
            "down": (self.hidden, self.intermediate),
        }


@dataclass(frozen=True)
class MoEModel:
    hidden: int
    expert_intermediate: int
    experts: int
    top_k: int
    # Expert-parallel sizes: a rank holds experts // ep groups.
    ep_sizes: tuple[int, ...] = (8, 16, 32)

    def cases(self) -> dict[str, tuple[int, int]]:
        """(N, K) of the expert GEMMs: GateUP (fused gate and up) and Down."""
        return {"gateup": (2 * self.expert_intermediate, self.hidden), "down": (self.hidden, self.expert_intermediate)}


DENSE_MODELS: dict[str, DenseModel | MLADenseModel] = {
    "llama3-8b": DenseModel(hidden=4096, intermediate=14336, heads=32, kv_heads=8),
    "llama3-70b": DenseModel(hidden=8192, intermediate=28672, heads=64, kv_heads=8),
    "deepseek-v3-dense": MLADenseModel(hidden=7168, intermediate=18432, heads=128, q_rank=1536, kv_rank=512),
}
LLAMA3_MODELS = ("llama3-8b", "llama3-70b")
DENSE_TOKENS: tuple[int, ...] = (4096, 8192)

MOE_MODELS: dict[str, MoEModel] = {
    "deepseek-v3": MoEModel(hidden=7168, expert_intermediate=2048, experts=256, top_k=8),
    "qwen3-235b": MoEModel(hidden=4096, expert_intermediate=1536, experts=128, top_k=8),
    "qwen3-30b": MoEModel(hidden=2048, expert_intermediate=768, experts=128, top_k=8),
    "gpt-oss-120b": MoEModel(hidden=2880, expert_intermediate=2880, experts=128, top_k=4),
    "gpt-oss-20b": MoEModel(hidden=2880, expert_intermediate=2880, experts=32, top_k=4, ep_sizes=(8, 16)),
    "mixtral-8x7b": MoEModel(hidden=4096, expert_intermediate=14336, experts=8, top_k=2, ep_sizes=(1, 4)),
}
# Tokens per expert of the uniform shapes; skewed ones use the last, at the largest EP size
# (fewest groups: for DeepSeek-V3 the 8 x 4096 shape of the anchors).
MOE_TOKENS: tuple[int, ...] = (512, 4096)


def dense_preset(model: str) -> list[Shape]:
    spec = DENSE_MODELS[model]
    return [
        Shape(label=f"{model}/{proj}/t{tokens}", dims={"B": 1, "M": tokens, "N": n, "K": k})
        for proj, (n, k) in spec.projections().items()
        for tokens in DENSE_TOKENS
    ]


def moe_preset(model: str) -> list[Shape]:
    spec = MOE_MODELS[model]
    shapes = []
    for case, (n, k) in spec.cases().items():
        for ep in spec.ep_sizes:
            groups = spec.experts // ep
            for tokens in MOE_TOKENS:
                label = f"{model}/{case}/ep{ep}/m{tokens}/uniform"
                shapes.append(grouped_shape(label, groups, tokens, n, k, "uniform"))
        ep, tokens = spec.ep_sizes[-1], MOE_TOKENS[-1]
        groups = spec.experts // ep
        for seed, skew in enumerate(SKEWS[1:]):
            label = f"{model}/{case}/ep{ep}/m{tokens}/{skew}"
            shapes.append(grouped_shape(label, groups, tokens, n, k, skew, seed=seed))
    return shapes


HEADLINE_MODELS = ("deepseek-v3", "qwen3-235b", "gpt-oss-120b")


def moe_headline() -> list[Shape]:
    """The expert GEMMs we report against the vendor libraries: GateUP and Down of DeepSeek-V3,
    Qwen3-235B and GPT-OSS-120B at the largest EP size, 4096 tokens per expert, uniform and with one
    expert taking half of the same total."""
    shapes = []
    for model in HEADLINE_MODELS:
        spec = MOE_MODELS[model]
        ep, tokens = spec.ep_sizes[-1], MOE_TOKENS[-1]
        for case, (n, k) in spec.cases().items():
            for skew in ("uniform", "hot"):
                label = f"{model}/{case}/ep{ep}/m{tokens}/{skew}"
                shapes.append(grouped_shape(label, spec.experts // ep, tokens, n, k, skew))
    return shapes


def dense_smoke() -> list[Shape]:
    """Small, odd shapes for the CPU interpreter: edges in every dimension."""
    return [
        Shape(label="smoke/square-128", dims={"B": 1, "M": 128, "N": 128, "K": 128}),
        Shape(label="smoke/odd-97x75x61", dims={"B": 1, "M": 97, "N": 75, "K": 61}),
        Shape(label="smoke/tall-192x48x80", dims={"B": 1, "M": 192, "N": 48, "K": 80}),
        Shape(label="smoke/long-k-40x56x300", dims={"B": 1, "M": 40, "N": 56, "K": 300}),
    ]


def grouped_smoke() -> list[Shape]:
    """Small grouped shapes for the CPU interpreter: uniform, skewed, empty groups, odd sizes."""
    return [grouped_shape(f"smoke/g4/{skew}", 4, 37, 40, 56, skew, seed=i) for i, skew in enumerate(SKEWS)]


# --- attention presets ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionModel:
    heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int | None = None  # MLA: v's head dim differs from q/k's
    window: int = 0  # sliding window (keys left of the diagonal) of its windowed layers; 0: none

    def dims(self, batch: int, seqlen: int, window: int = 0) -> dict[str, int]:
        """Causal self-attention dims, as models train (window left out when 0: the schema's default)."""
        dims = {"B": batch, "Hq": self.heads, "Hkv": self.kv_heads, "Sq": seqlen, "Sk": seqlen, "D": self.head_dim,
                "Dv": self.v_head_dim or self.head_dim, "causal": 1}
        return dims | ({"window": window} if window else {})


ATTENTION_MODELS: dict[str, AttentionModel] = {
    "llama3-8b": AttentionModel(heads=32, kv_heads=8, head_dim=128),
    "llama3-70b": AttentionModel(heads=64, kv_heads=8, head_dim=128),
    # MLA after the up-projections: every head has its own k (192 = 128 + 64 rope) and v (128).
    "deepseek-v3": AttentionModel(heads=128, kv_heads=128, head_dim=192, v_head_dim=128),
    # GPT-OSS alternates full layers and 128-token sliding-window layers.
    "gpt-oss": AttentionModel(heads=64, kv_heads=8, head_dim=64, window=128),
}
# Tokens per step of every model preset: B x S = 16k, at 4k and 8k tokens per sequence.
ATTENTION_TOKENS = 16384
ATTENTION_SEQLENS: tuple[int, ...] = (4096, 8192)
# Packed documents of mixed lengths, 16k tokens in all (one 8k document down to a few short ones).
PACKED_DOC_LENS: tuple[int, ...] = (8192, 3000, 2048, 1500, 900, 400, 200, 100, 33, 11)


def attention_preset(model: str) -> list[Shape]:
    spec = ATTENTION_MODELS[model]
    windows = (0, spec.window) if spec.window else (0,)
    return [
        Shape(label=f"{model}/s{seqlen}" + (f"/w{window}" if window else ""),
              dims=spec.dims(ATTENTION_TOKENS // seqlen, seqlen, window))
        for window in windows
        for seqlen in ATTENTION_SEQLENS
    ]


def attention_long_context() -> list[Shape]:
    """One sequence of 16k and of 32k tokens with Llama-3 8B's heads."""
    spec = ATTENTION_MODELS["llama3-8b"]
    return [Shape(label=f"long/llama3-8b/s{seqlen}", dims=spec.dims(1, seqlen)) for seqlen in (16384, 32768)]


def attention_packed() -> list[Shape]:
    """Packed documents of mixed lengths (varlen) with Llama-3 8B's heads, and with GPT-OSS's heads and window."""
    lens, shapes = PACKED_DOC_LENS, []
    for model, window in (("llama3-8b", 0), ("gpt-oss", ATTENTION_MODELS["gpt-oss"].window)):
        dims = ATTENTION_MODELS[model].dims(len(lens), sum(lens) // len(lens), window)
        shapes.append(Shape(label=f"packed/{model}" + (f"/w{window}" if window else ""), dims=dims, group_lens=lens))
    return shapes


def attention_headline() -> list[Shape]:
    """Issue 16's acceptance setting (8k tokens per sequence, B x S = 16k, d64 / d128 / d256, causal and
    not) with FlashAttention's benchmark convention for the heads: hidden 2048, so 2048 / D heads, no GQA."""
    return [
        Shape(label=f"headline/d{d}" + ("/causal" if causal else ""),
              dims={"B": 2, "Hq": 2048 // d, "Hkv": 2048 // d, "Sq": 8192, "Sk": 8192, "D": d, "Dv": d}
              | ({"causal": 1} if causal else {}))
        for d in (64, 128, 256)
        for causal in (False, True)
    ]


def attention_smoke() -> list[Shape]:
    """Small attention shapes for the CPU interpreter: odd lengths, GQA, Sq != Sk, MLA head dims, a window,
    packed sequences with an empty and a one-token one."""
    def dims(B: int, Hq: int, Hkv: int, Sq: int, Sk: int, D: int, Dv: int, **flags: int) -> dict[str, int]:
        return {"B": B, "Hq": Hq, "Hkv": Hkv, "Sq": Sq, "Sk": Sk, "D": D, "Dv": Dv, **flags}

    lens = (0, 1, 70, 29)
    return [
        Shape(label="smoke/mha-d64-s77", dims=dims(1, 2, 2, 77, 77, 64, 64)),
        Shape(label="smoke/gqa-causal-d128-q45-k80", dims=dims(2, 4, 2, 45, 80, 128, 128, causal=1)),
        Shape(label="smoke/mla-causal-d192-s61", dims=dims(1, 2, 2, 61, 61, 192, 128, causal=1)),
        Shape(label="smoke/window-d64-s90-w16", dims=dims(1, 2, 1, 90, 90, 64, 64, causal=1, window=16)),
        Shape(label="smoke/packed-causal-d64", dims=dims(len(lens), 2, 1, 25, 25, 64, 64, causal=1), group_lens=lens),
    ]


# --- MoE layer ops (permute / unpermute, router) --------------------------------------------------------

# The SonicMoE paper's configuration: fine-grained experts (hidden 4096, 128 experts, top-8, inter 512).
SONICMOE = MoEModel(hidden=4096, expert_intermediate=512, experts=128, top_k=8)
MOE_LAYER_MODELS: dict[str, MoEModel] = {
    **{name: MOE_MODELS[name] for name in ("deepseek-v3", "qwen3-235b", "qwen3-30b", "gpt-oss-120b")},
    "sonicmoe": SONICMOE,
}
# Tokens of a step (a rank's micro-batch); SonicMoE's published numbers are at 32k.
MOE_LAYER_TOKENS: tuple[int, ...] = (4096, 32768)
# DeepSeek-V3 routes group-limited: 8 groups of its 256 experts, the best 4 kept, by sigmoid scores.
ROUTER_GROUPS: dict[str, dict[str, int]] = {"deepseek-v3": {"n_group": 8, "topk_group": 4, "sigmoid": 1}}


def moe_token_preset(model: str) -> list[Shape]:
    """Permute / unpermute of a model's layer: all its experts, unpadded and padded to 128 (FP8 GEMMs).
    The routing is skewed in every problem (the ops' specs draw it: hot experts and empty ones)."""
    spec = MOE_LAYER_MODELS[model]
    return [
        Shape(label=f"{model}/t{tokens}/pad{pad_to}/skewed",
              dims={"T": tokens, "H": spec.hidden, "E": spec.experts, "topk": spec.top_k, "pad_to": pad_to})
        for tokens in MOE_LAYER_TOKENS
        for pad_to in (1, 128)
    ]


def moe_router_preset(model: str) -> list[Shape]:
    spec = MOE_LAYER_MODELS[model]
    return [Shape(label=f"{model}/t{tokens}/skewed",
                  dims={"T": tokens, "E": spec.experts, "topk": spec.top_k, **ROUTER_GROUPS.get(model, {})})
            for tokens in MOE_LAYER_TOKENS]


# Experts an EP rank holds in the moe_mlp presets (a float64 reference of all 256 of DeepSeek-V3's would
# not fit): the global count over 8 ranks; SonicMoE's configuration as published (128).
MLP_LOCAL_EXPERTS: dict[str, int] = {"deepseek-v3": 32, "qwen3-235b": 16, "qwen3-30b": 16, "gpt-oss-120b": 16,
                                     "sonicmoe": 128}


def moe_mlp_preset(model: str) -> list[Shape]:
    """The layer's experts of a model on one EP rank, 4096 tokens (SonicMoE: 32k, its paper's), skewed."""
    spec = MOE_LAYER_MODELS[model]
    tokens = (32768,) if model == "sonicmoe" else (4096,)
    return [Shape(label=f"{model}/e{MLP_LOCAL_EXPERTS[model]}/t{t}/skewed",
                  dims={"T": t, "H": spec.hidden, "I": spec.expert_intermediate, "E": MLP_LOCAL_EXPERTS[model],
                        "topk": spec.top_k})
            for t in tokens]


def moe_mlp_smoke() -> list[Shape]:
    """Small layers for the CPU interpreter: odd sizes, top-1 and top-4, one token."""
    return [
        Shape(label="smoke/t37-h48-i40-e6-top2", dims={"T": 37, "H": 48, "I": 40, "E": 6, "topk": 2}),
        Shape(label="smoke/t1-h32-i24-e8-top4", dims={"T": 1, "H": 32, "I": 24, "E": 8, "topk": 4}),
        Shape(label="smoke/t29-h16-i8-e3-top1", dims={"T": 29, "H": 16, "I": 8, "E": 3, "topk": 1}),
    ]


def moe_token_smoke() -> list[Shape]:
    """Small permute / unpermute problems for the CPU interpreter: one token, top-1, top-8, padding, odd H."""
    def dims(T: int, H: int, E: int, topk: int, pad_to: int) -> dict[str, int]:
        return {"T": T, "H": H, "E": E, "topk": topk, "pad_to": pad_to}

    return [
        Shape(label="smoke/t37-h40-e6-top2", dims=dims(37, 40, 6, 2, 1)),
        Shape(label="smoke/t29-h24-e16-top8-pad16", dims=dims(29, 24, 16, 8, 16)),
        Shape(label="smoke/t1-h72-e16-top8", dims=dims(1, 72, 16, 8, 1)),
        Shape(label="smoke/t21-h16-e3-top1-pad128", dims=dims(21, 16, 3, 1, 128)),
    ]


def moe_router_smoke() -> list[Shape]:
    """Small router problems for the CPU interpreter: softmax top-1 and top-8, one token, DeepSeek-V3's
    groups on fewer tokens."""
    return [
        Shape(label="smoke/t37-e6-top1", dims={"T": 37, "E": 6, "topk": 1}),
        Shape(label="smoke/t21-e24-top8", dims={"T": 21, "E": 24, "topk": 8}),
        Shape(label="smoke/t1-e16-top4-sigmoid", dims={"T": 1, "E": 16, "topk": 4, "sigmoid": 1}),
        Shape(label="smoke/t19-e256-top8-dsv3", dims={"T": 19, "E": 256, "topk": 8, **ROUTER_GROUPS["deepseek-v3"]}),
    ]


PRESETS: dict[str, dict[str, Callable[[], list[Shape]]]] = {
    "dense_gemm": {
        "smoke": dense_smoke,
        **{name: (lambda name=name: dense_preset(name)) for name in DENSE_MODELS},
        "llama3": lambda: [s for name in LLAMA3_MODELS for s in dense_preset(name)],
        "square": lambda: [Shape(label=f"square/{n}", dims={"B": 1, "M": n, "N": n, "K": n}) for n in (4096, 8192)],
    },
    "grouped_gemm": {
        "smoke": grouped_smoke,
        "headline": moe_headline,
        **{name: (lambda name=name: moe_preset(name)) for name in MOE_MODELS},
    },
    "attention": {
        "smoke": attention_smoke,
        **{name: (lambda name=name: attention_preset(name)) for name in ATTENTION_MODELS},
        "long-context": attention_long_context,
        "packed": attention_packed,
        "headline": attention_headline,
    },
    "moe_tokens": {
        "smoke": moe_token_smoke,
        **{name: (lambda name=name: moe_token_preset(name)) for name in MOE_LAYER_MODELS},
    },
    "moe_router": {
        "smoke": moe_router_smoke,
        **{name: (lambda name=name: moe_router_preset(name)) for name in MOE_LAYER_MODELS},
    },
    "moe_mlp": {
        "smoke": moe_mlp_smoke,
        **{name: (lambda name=name: moe_mlp_preset(name)) for name in MOE_LAYER_MODELS},
    },
}


def preset_names(family: str) -> list[str]:
    return list(PRESETS.get(family, {}))


def write_shape_file(path: Path, shapes: list[Shape]) -> Path:
    """A YAML shape file (`shapes: [...]`) that load_shape_file reads back, written atomically."""
    return atomic_write_text(path, yaml.safe_dump({"shapes": [s.model_dump(mode="json") for s in shapes]}))


def load_shape_file(path: str | Path) -> list[Shape]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise UserError(f"cannot read shape file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if isinstance(data, list):
        data = {"shapes": data}
    try:
        shapes = ShapeFile.model_validate(data).shapes
    except ValidationError as exc:
        raise UserError(first_error(exc, str(path))) from None
    labels = [s.label for s in shapes]
    dupes = {label for label in labels if labels.count(label) > 1}
    if dupes:
        raise UserError(f"{path}: labels must be unique, repeated: {sorted(dupes)}")
    return shapes


def load_shapes(family: str, preset_or_path: str) -> list[Shape]:
    """Shapes of a named preset of `family`, or of a YAML file."""
    presets = PRESETS.get(family, {})
    if preset_or_path in presets:
        return presets[preset_or_path]()
    if preset_or_path.endswith((".yaml", ".yml")) or Path(preset_or_path).is_file():
        return load_shape_file(preset_or_path)
    raise UserError(
        f"unknown shape preset '{preset_or_path}' for {family} "
        f"(presets: {', '.join(presets) or 'none'}; or a path to a .yaml file)"
    )
