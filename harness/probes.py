"""Unannounced probes: shapes and value ranges a campaign did not announce, drawn from a seed for each
measurement (`bench --probe-seed`), on which our runner is checked (never timed) after the benchmark's
own shapes. A kernel right only on the announced shapes fails here.

- Ragged shapes (`probe_shapes` of rules/iteration_rules.yaml): M odd; N and K odd (the pointer
  kernels) or 8 more than a multiple of 16 (rows still 16-byte aligned, so the TMA kernels read them):
  multiples of no tile size either way, so every tile grid ends in a partial tile. For grouped ops 3
  to 6 groups split with skew, one group empty and one holding a single token. Sized by device: tiny
  under the interpreter.
- Attention: odd sequence lengths (no block multiple, Sq and Sk drawn apart), GQA groups of 1, 2 or
  4, head dims 64, 128 and MLA's 192/128; the first full attention, the rest causal, every other
  one with a sliding window; the last of three or more packs sequences of skewed lengths with an
  empty one and a one-token one.
- The accumulation probe, for ops that promise fp32 accumulation: a long K, inputs scaled by 64 so
  that the sums pass fp16's largest value (65504), and an fp32 forward output, checked at the fp32
  SNR threshold (at the op's FP8 format threshold for FP8 variants). An fp16 accumulator overflows to
  inf, a bf16 one loses the precision the threshold asks for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from kernels.common.opspec import Problem

# Multiplies the accumulation probe's inputs: N(0, 1) x 64 squared, summed over K >= 2048, passes 65504.
ACCUMULATION_SCALE = 64.0
SIXTEEN_BIT_FORMATS = ("fp16", "bf16")


@dataclass(frozen=True)
class Probe:
    label: str
    dims: dict[str, int]
    # Seed of the probe's inputs, drawn with it.
    seed: int
    # Tokens per group for grouped ops.
    group_lens: tuple[int, ...] | None = None
    # Inputs are multiplied by this; the accumulation probe (scale > 1) is forward only, into fp32.
    scale: float = 1.0

    @property
    def accumulation(self) -> bool:
        return self.scale != 1.0

    def problem(self, dtype: torch.dtype, device: torch.device, variant: str) -> Problem:
        return Problem(dims=self.dims, dtype=dtype, device=device, seed=self.seed, group_lens=self.group_lens,
                       variant=variant)


@dataclass(frozen=True)
class ProbeSizes:
    rows: tuple[int, int]  # range of M, N and of a group's tokens
    depth: tuple[int, int]  # range of K
    accumulation: tuple[int, int, int]  # M, N, K of the accumulation probe


INTERPRETER_SIZES = ProbeSizes(rows=(17, 200), depth=(17, 200), accumulation=(64, 48, 2048))
GPU_SIZES = ProbeSizes(rows=(300, 3000), depth=(300, 5000), accumulation=(256, 192, 16384))


def accumulation_format(fmt: str) -> str:
    """The SNR format the accumulation probe's fp32 output is held to: fp32 for 16-bit ops, the FP8
    format for FP8 ones (their quantization error dominates whatever the accumulator)."""
    return "fp32" if fmt in SIXTEEN_BIT_FORMATS else fmt


def _ragged(rng: np.random.Generator, bounds: tuple[int, int], aligned: bool) -> int:
    """An odd number, or (aligned) one 8 more than a multiple of 16, within `bounds`."""
    lo, hi = bounds
    if aligned:
        return int(rng.integers(lo // 16, hi // 16)) * 16 + 8
    return int(rng.integers(lo // 2, hi // 2)) * 2 + 1


def _label(kind: str, dims: dict[str, int], extra: str = "") -> str:
    return f"probe/{kind} ({','.join(f'{k}={v}' for k, v in dims.items())}{extra})"


def _seed(rng: np.random.Generator) -> int:
    return int(rng.integers(2**31))


def _dense_ragged(rng: np.random.Generator, sizes: ProbeSizes, index: int, count: int) -> Probe:
    aligned = index % 2 == 1
    # The last of three or more draws has a single row: the edge of every M tiling.
    M = 1 if count >= 3 and index == count - 1 else _ragged(rng, sizes.rows, aligned=False)
    dims = {"B": 1, "M": M, "N": _ragged(rng, sizes.rows, aligned), "K": _ragged(rng, sizes.depth, aligned)}
    return Probe(_label(f"ragged-{index + 1}", dims), dims, _seed(rng))


def _grouped_ragged(rng: np.random.Generator, sizes: ProbeSizes, index: int, count: int) -> Probe:
    aligned = index % 2 == 1
    groups = int(rng.integers(3, 7))
    lo, hi = sizes.rows
    # Log-uniform sizes for the other groups: a skewed split, some groups many times others.
    live = np.exp(rng.uniform(np.log(lo), np.log(hi), size=groups - 2)).astype(int)
    lens = [0, 1, *(int(n) for n in live)]
    rng.shuffle(lens)
    dims = {"B": groups, "M": sum(lens) // groups, "N": _ragged(rng, sizes.rows, aligned),
            "K": _ragged(rng, sizes.depth, aligned)}
    return Probe(_label(f"ragged-{index + 1}", dims, f", lens={lens}"), dims, _seed(rng), tuple(lens))


# (q/k, v) head dims an attention probe draws from.
ATTENTION_HEAD_DIMS: tuple[tuple[int, int], ...] = ((64, 64), (128, 128), (192, 128))


def _attention_ragged(rng: np.random.Generator, sizes: ProbeSizes, index: int, count: int) -> Probe:
    kv_heads, group = int(rng.integers(1, 3)), int(rng.choice([1, 2, 4]))
    d, dv = ATTENTION_HEAD_DIMS[int(rng.integers(len(ATTENTION_HEAD_DIMS)))]
    causal = int(index > 0)
    window = _ragged(rng, (3, 40), aligned=False) if causal and index % 2 == 1 else 0
    lens = None
    if count >= 3 and index == count - 1:  # packed documents: self-attention, Sq = Sk = their mean
        lo, hi = sizes.rows
        live = np.exp(rng.uniform(np.log(lo), np.log(hi), size=int(rng.integers(1, 4)))).astype(int)
        lens = [0, 1, *(int(n) for n in live)]
        rng.shuffle(lens)
        batch, seqlen_q = len(lens), sum(lens) // len(lens)
        seqlen_k = seqlen_q
    else:
        batch = int(rng.integers(1, 3))
        seqlen_q, seqlen_k = _ragged(rng, sizes.rows, False), _ragged(rng, sizes.rows, False)
    dims = {"B": batch, "Hq": kv_heads * group, "Hkv": kv_heads, "Sq": seqlen_q, "Sk": seqlen_k, "D": d, "Dv": dv,
            "causal": causal, "window": window}
    extra = f", lens={lens}" if lens else ""
    return Probe(_label(f"ragged-{index + 1}", dims, extra), dims, _seed(rng), tuple(lens) if lens else None)


def _accumulation(rng: np.random.Generator, sizes: ProbeSizes, grouped: bool) -> Probe:
    M, N, K = sizes.accumulation
    lens = (M // 2, M - M // 2) if grouped else None
    dims = {"B": 2 if grouped else 1, "M": M // 2 if grouped else M, "N": N, "K": K}
    extra = f", lens={list(lens)}" if lens else ""
    return Probe(_label("accumulation", dims, f"{extra}, x{ACCUMULATION_SCALE:g}, fp32 out"), dims, _seed(rng),
                 lens, ACCUMULATION_SCALE)


def _moe_tokens_ragged(rng: np.random.Generator, sizes: ProbeSizes, index: int, count: int) -> Probe:
    """Permute / unpermute: ragged tokens (one on the last of three or more draws) and hidden size, 3 to 40
    experts, top-1 to top-8, each padding."""
    experts = int(rng.integers(3, 41))
    T = 1 if count >= 3 and index == count - 1 else _ragged(rng, sizes.rows, aligned=False)
    dims = {"T": T, "H": _ragged(rng, sizes.depth, aligned=index % 2 == 1), "E": experts,
            "topk": int(rng.integers(1, min(8, experts) + 1)), "pad_to": int(rng.choice([1, 16, 128]))}
    return Probe(_label(f"ragged-{index + 1}", dims), dims, _seed(rng))


def _moe_router_ragged(rng: np.random.Generator, sizes: ProbeSizes, index: int, count: int) -> Probe:
    """The router: ragged tokens (one on the last of three or more draws), 3 to 300 experts, softmax and
    sigmoid, every other draw group-limited (2 to 8 groups, some kept)."""
    T = 1 if count >= 3 and index == count - 1 else _ragged(rng, sizes.rows, aligned=False)
    dims = {"T": T, "E": 0, "topk": 0, "n_group": 1, "topk_group": 1, "sigmoid": index % 2}
    if index % 2:
        n_group = int(rng.integers(2, 9))
        per_group = int(rng.integers(2, 38))
        topk_group = int(rng.integers(1, n_group + 1))
        dims |= {"E": n_group * per_group, "n_group": n_group, "topk_group": topk_group,
                 "topk": int(rng.integers(1, min(8, topk_group * per_group) + 1))}
    else:
        experts = int(rng.integers(3, 301))
        dims |= {"E": experts, "topk": int(rng.integers(1, min(8, experts) + 1))}
    return Probe(_label(f"ragged-{index + 1}", dims), dims, _seed(rng))


# Shape families whose ops are GEMMs: the accumulation probe's dims (M, N, K) are theirs.
GEMM_FAMILIES: tuple[str, ...] = ("dense_gemm", "grouped_gemm")
RAGGED: dict[str, Callable[[np.random.Generator, ProbeSizes, int, int], Probe]] = {
    "dense_gemm": _dense_ragged,
    "grouped_gemm": _grouped_ragged,
    "attention": _attention_ragged,
    "moe_tokens": _moe_tokens_ragged,
    "moe_router": _moe_router_ragged,
}


def draw_probes(family: str, fp32_accumulation: bool, seed: int, count: int, interpreter: bool) -> list[Probe]:
    """`count` ragged shapes of the shape family drawn from `seed`, and the accumulation probe where a
    GEMM-class op promises fp32 accumulation; none for a family without a probe drawer."""
    ragged = RAGGED.get(family)
    if ragged is None:
        return []
    sizes = INTERPRETER_SIZES if interpreter else GPU_SIZES
    rng = np.random.default_rng(seed)
    probes = [ragged(rng, sizes, i, count) for i in range(count)]
    if fp32_accumulation and family in GEMM_FAMILIES:  # the probe is a long-K GEMM
        probes.append(_accumulation(rng, sizes, family == "grouped_gemm"))
    return probes
