"""The one SNR function: 10*log10(|ref|^2 / |test - ref|^2), in float64.

Sums are taken a chunk at a time: a float64 copy of a whole output (an lm_head's weight gradient is
10^9 elements, 8 GB in float64), its difference and its square would need three times that next to the
reference, which ran an 80 GB GPU out of memory on the llama3 lm_head shapes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from harness.rules import load_rules

# Elements per float64 pass (128 MiB): small next to any GPU, and few passes for the largest outputs.
CHUNK_ELEMENTS = 1 << 24


def _chunks(t: torch.Tensor) -> Iterator[torch.Tensor]:
    flat = t.detach().reshape(-1)
    for start in range(0, flat.numel(), CHUNK_ELEMENTS):
        yield flat[start:start + CHUNK_ELEMENTS]


def norm(t: torch.Tensor) -> float:
    """The L2 norm of `t`, accumulated in float64."""
    total = torch.zeros((), dtype=torch.float64, device=t.device)
    for chunk in _chunks(t):
        total += chunk.to(torch.float64).square().sum()
    return math.sqrt(total.item())


def snr_db(test: torch.Tensor, ref: torch.Tensor) -> float:
    """SNR of `test` against `ref` in dB.

    +inf when test equals ref exactly; -inf when test holds NaN/Inf (always a FAIL) or when the
    reference is all zeros and test is not. A non-finite reference is a bug in the reference.
    """
    if test.shape != ref.shape:
        raise ValueError(f"SNR: shapes differ: test {tuple(test.shape)} vs reference {tuple(ref.shape)}")
    device = ref.device
    signal, noise = (torch.zeros((), dtype=torch.float64, device=device) for _ in range(2))
    ref_finite, test_finite = (torch.ones((), dtype=torch.bool, device=device) for _ in range(2))
    for test_chunk, ref_chunk in zip(_chunks(test), _chunks(ref), strict=True):
        ref64 = ref_chunk.to(torch.float64)
        test64 = test_chunk.to(device=device, dtype=torch.float64)
        ref_finite &= torch.isfinite(ref64).all()
        test_finite &= torch.isfinite(test64).all()
        signal += ref64.square().sum()
        noise += (test64 - ref64).square().sum()
    if not ref_finite.item():
        raise ValueError("SNR: the reference holds NaN or Inf")
    if not test_finite.item():
        return -math.inf
    noise_sum = noise.item()
    if noise_sum == 0.0:
        return math.inf
    signal_sum = signal.item()
    if signal_sum == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal_sum / noise_sum)


def snr_threshold(fmt: str) -> float:
    """The minimum SNR (dB) for outputs of number format `fmt` (bf16, fp16, e4m3, ...), from rules/."""
    return load_rules().snr_threshold(fmt)


def snr_passes(snr: float, fmt: str) -> bool:
    return not math.isnan(snr) and snr >= snr_threshold(fmt)
