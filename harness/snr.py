"""The one SNR function: 10*log10(|ref|^2 / |test - ref|^2), in float64."""

from __future__ import annotations

import math

import torch

from harness.rules import load_rules


def snr_db(test: torch.Tensor, ref: torch.Tensor) -> float:
    """SNR of `test` against `ref` in dB.

    +inf when test equals ref exactly; -inf when test holds NaN/Inf (always a FAIL) or when the
    reference is all zeros and test is not. A non-finite reference is a bug in the reference.
    """
    if test.shape != ref.shape:
        raise ValueError(f"SNR: shapes differ: test {tuple(test.shape)} vs reference {tuple(ref.shape)}")
    ref64 = ref.detach().to(torch.float64)
    if not torch.isfinite(ref64).all():
        raise ValueError("SNR: the reference holds NaN or Inf")
    test64 = test.detach().to(device=ref64.device, dtype=torch.float64)
    if not torch.isfinite(test64).all():
        return -math.inf
    noise = (test64 - ref64).square().sum().item()
    if noise == 0.0:
        return math.inf
    signal = ref64.square().sum().item()
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def snr_threshold(fmt: str) -> float:
    """The minimum SNR (dB) for outputs of number format `fmt` (bf16, fp16, e4m3, ...), from rules/."""
    return load_rules().snr_threshold(fmt)


def snr_passes(snr: float, fmt: str) -> bool:
    return not math.isnan(snr) and snr >= snr_threshold(fmt)
