import math

import pytest
import torch

import harness.snr
from harness.snr import norm, snr_db, snr_passes, snr_threshold


def test_equal_tensors_are_infinite():
    x = torch.randn(64, 32)
    assert snr_db(x.clone(), x) == math.inf


def test_known_noise_level():
    ref = torch.ones(10_000, dtype=torch.float64)
    test = ref + 0.01  # noise power 1e-4 of the signal: 40 dB
    assert snr_db(test, ref) == pytest.approx(40.0, abs=1e-9)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_output_fails(bad):
    ref = torch.randn(16, 16)
    test = ref.clone()
    test[3, 5] = bad
    assert snr_db(test, ref) == -math.inf
    assert not snr_passes(snr_db(test, ref), "fp16")


def test_zero_reference():
    zeros = torch.zeros(8, 8)
    assert snr_db(zeros.clone(), zeros) == math.inf
    assert snr_db(zeros + 1e-3, zeros) == -math.inf


def test_all_zero_output_against_nonzero_reference_is_0_db_and_fails():
    ref = torch.randn(32, 32)
    assert snr_db(torch.zeros_like(ref), ref) == pytest.approx(0.0)
    assert not snr_passes(0.0, "e5m2")


def test_computed_in_float64():
    ref = torch.randn(256, dtype=torch.float64) * 1e3
    test = (ref + 1e-9).to(torch.float64)
    assert snr_db(test, ref) > 200  # float32 arithmetic could not resolve this noise


def test_non_finite_reference_and_shape_mismatch_raise():
    with pytest.raises(ValueError, match="reference"):
        snr_db(torch.zeros(2), torch.tensor([1.0, math.nan]))
    with pytest.raises(ValueError, match="shapes differ"):
        snr_db(torch.zeros(2, 3), torch.zeros(3, 2))


def test_thresholds_come_from_rules():
    assert snr_threshold("e4m3") == 25.0
    assert snr_threshold("e5m2") == 20.0
    assert snr_threshold("bf16") > 30 and snr_threshold("fp16") > snr_threshold("bf16")


def test_chunked_sums_equal_the_whole_tensor_formula(monkeypatch):
    """Sums taken a chunk at a time (the last one partial) give the SNR and norm of the one-pass formula,
    and a NaN or Inf in a late chunk is still found."""
    monkeypatch.setattr(harness.snr, "CHUNK_ELEMENTS", 1000)
    ref = torch.randn(37, 101, dtype=torch.float64)
    test = (ref + 0.01 * torch.randn_like(ref)).float()
    expected = 10 * math.log10(ref.square().sum().item() / (test.double() - ref).square().sum().item())
    assert snr_db(test, ref) == pytest.approx(expected, rel=1e-12)
    assert norm(test) == pytest.approx(torch.linalg.vector_norm(test.double()).item(), rel=1e-12)
    test[36, 100] = math.nan
    assert snr_db(test, ref) == -math.inf
    ref[30, 0] = math.inf
    with pytest.raises(ValueError, match="reference"):
        snr_db(test, ref)
