"""The warp-specialized blockwise FP8 kernel (Hopper only) against float64 on the dequantized operands:
dense and grouped (skewed, empty groups, ragged edges), mixed FP8 formats."""

import pytest
import torch

from harness.snr import snr_db
from kernels.common import blockwise_ws
from kernels.common.fp8 import Granularity, quantize_blocks_2d, quantize_rows
from kernels.common.scales import Scales
from kernels.common.tiles import TileConfig
from kernels.grouped_gemm_fp8.tuning import config_for

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def test_takes_hopper_and_128x128_weight_blocks_only(device):
    """Elsewhere (the interpreter, other GPUs), and for per-column B scales (the wgrad), blockwise GEMMs
    stay on the Triton kernel."""
    a = torch.randn(256, 256, device=device).to(E4M3)
    b = torch.randn(1, 256, 256, device=device).to(E4M3)
    out = torch.empty(256, 256, device=device)
    scales = Scales(torch.ones(256, 2, device=device), (2, 1), torch.ones(1, 2, 2, device=device), (4, 2, 1), 128,
                    per_k_block=True)
    hopper = device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)
    cfg = config_for("fwd", 256, 1, Granularity.BLOCKWISE, b.shape[1:])
    assert blockwise_ws.supported(a, b, out, scales, cfg) == hopper
    per_column = Scales(scales.a, scales.a_strides, torch.ones(256, 2, device=device), (0, 2, 1), per_k_block=True)
    assert not blockwise_ws.supported(a, b, out, per_column, cfg)


def dequantized(q: torch.Tensor, scale: torch.Tensor, row_block: int) -> torch.Tensor:
    rows, k = q.shape
    s = scale.double().repeat_interleave(row_block, 0)[:rows].repeat_interleave(128, 1)[:, :k]
    return q.double() * s


def grouped_reference(aq, sa, bq, sb, lens, b_row_block):
    a = dequantized(aq, sa, 1)
    outs, start = [], 0
    for g, n in enumerate(lens):
        outs.append(a[start:start + n] @ dequantized(bq[g], sb[g], b_row_block).t())
        start += n
    return torch.cat(outs)


CASES = {
    # name: (lens, N, K, a_dtype, BLOCK_N, stages)
    "dense-square": ([1024], 1024, 1024, E4M3, 128, 4),
    "dense-ragged": ([1000], 1000, 1056, E4M3, 128, 3),
    "dense-one-row": ([1], 256, 512, E4M3, 64, 4),
    "grouped-uniform": ([512] * 8, 1024, 2048, E4M3, 128, 4),
    "grouped-skewed-empty": ([2100, 0, 300, 1, 1000, 0, 695, 0], 512, 1024, E4M3, 128, 5),
    "grouped-e5m2-a": ([700, 0, 90], 384, 640, E5M2, 64, 4),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_matches_float64_on_its_operands(name):
    lens, N, K, a_dtype, block_n, stages = CASES[name]
    torch.manual_seed(len(name))
    G, M = len(lens), sum(lens)
    aq, sa = quantize_rows(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), a_dtype, Granularity.BLOCKWISE)
    bq, _, sb = quantize_blocks_2d(torch.randn(G, N, K, device="cuda", dtype=torch.bfloat16), E4M3)
    scales = Scales(sa, sa.stride(), sb, sb.stride(), 128, per_k_block=True)
    cfg = TileConfig(128, block_n, 128, 8, 8, stages)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert blockwise_ws.supported(aq, bq, out, scales, cfg)
    offs = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int64)
    blockwise_ws.blockwise_mm(aq, bq, out, scales, cfg, offs if G > 1 else None)
    assert not out.isnan().any()
    assert snr_db(out, grouped_reference(aq, sa, bq, sb, lens, 128)) >= 45.0  # bf16 rounding of the output
