"""The ping-pong FP8 GEMM (Hopper only, rowwise and tensorwise, M-grouped) against float64 on its dequantized
operands: dense and grouped (skewed, empty groups, ragged edges), both tile widths, into a poisoned output;
what it takes; and its compiled form (no GPU needed)."""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.snr import snr_db
from kernels.common import pingpong_ws
from kernels.common.fp8 import Granularity, quantize_rows
from kernels.common.scales import Scales
from kernels.common.tiles import TileConfig

E4M3 = torch.float8_e4m3fn


def test_takes_hopper_rowwise_and_its_tiles_only(device):
    """Off Hopper (the interpreter, other GPUs) nothing; on Hopper per-row and per-column scales, not blockwise
    ones, and configs that mean its tile (128 rows a consumer warpgroup of 4 warps) with a ring that fits."""
    a = torch.randn(256, 256, device=device).to(E4M3)
    b = torch.randn(1, 256, 256, device=device).to(E4M3)
    out = torch.empty(256, 256, device=device, dtype=torch.bfloat16)
    rowwise = Scales(torch.ones(256, device=device), (1, 0), torch.ones(256, device=device), (256, 1, 0))
    blockwise = Scales(torch.ones(256, 2, device=device), (2, 1), torch.ones(1, 2, 2, device=device), (4, 2, 1), 128,
                       per_k_block=True)
    hopper = device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)
    cfg = TileConfig(128, 128, 128, 8, 4, 6)
    assert pingpong_ws.supported(a, b, out, rowwise, cfg) == hopper
    assert not pingpong_ws.supported(a, b, out, blockwise, cfg)
    for other in (TileConfig(128, 128, 128, 8, 8, 3), TileConfig(64, 128, 128, 8, 4, 3),
                  TileConfig(128, 256, 128, 8, 4, 2), TileConfig(128, 128, 128, 8, 4, 8)):
        assert not pingpong_ws.supported(a, b, out, rowwise, other), other


def test_compiles_for_hopper_without_spills_or_serialized_wgmmas():
    """Triton's own ptxas (no GPU needed) on the kernel as `pingpong_mm` launches it: E4M3 wgmmas fed by TMA,
    no register spills, no serialized wgmmas, and shared memory within `shared_bytes` and an H100's. A
    subprocess, since the kernel must be compiled, not interpreted."""
    cases = ((128, 6), (128, 4), (64, 8))
    code = ("import json; from tests.hopper_compile import compile_pingpong_ws; print(json.dumps("
            f"[compile_pingpong_ws(*c) for c in {cases!r}]))")
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=os.environ | {"TRITON_INTERPRET": "0"},
                          cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for report, (block_n, stages) in zip(json.loads(done.stdout.splitlines()[-1]), cases, strict=True):
        assert report["wgmma_e4m3"] > 0 and report["tma_loads"] == 2, report
        assert report["spill_bytes"] == 0 and report["wgmma_serialized"] == 0, report
        bound = pingpong_ws.shared_bytes(block_n, stages)
        assert report["shared_bytes"] <= bound <= pingpong_ws.SHARED_MEMORY_BYTES, (report, bound)


CASES = {
    # name: (lens, N, K, granularity, BLOCK_N, stages)
    "dense-ragged": ([1000], 1000, 1056, Granularity.ROWWISE, 128, 6),
    "dense-one-row": ([1], 256, 512, Granularity.ROWWISE, 64, 8),
    "grouped-uniform": ([512] * 8, 384, 2048, Granularity.ROWWISE, 128, 4),
    # tiles that alternate between the consumers across groups, some past a group's last row; 3 stages for
    # 8 K blocks a tile: the ring laps within each tile
    "grouped-skewed-empty": ([2100, 0, 300, 1, 1000, 0, 695, 0], 640, 1024, Granularity.ROWWISE, 128, 3),
    "grouped-tensorwise": ([700, 0, 90], 384, 640, Granularity.TENSORWISE, 64, 6),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_matches_float64_on_its_operands(name):
    lens, N, K, granularity, block_n, stages = CASES[name]
    torch.manual_seed(len(name))
    G, M = len(lens), sum(lens)
    aq, sa = quantize_rows(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), E4M3, granularity)
    # tensorwise: one scale for all of a, one an expert for the weight
    wq, sw = quantize_rows(torch.randn(G * N, K, device="cuda", dtype=torch.bfloat16), E4M3, granularity, N)
    bq = wq.view(G, N, K)
    tensorwise = granularity == Granularity.TENSORWISE
    scales = Scales(sa, (0, 0) if tensorwise else (1, 0), sw, (1, 0, 0) if tensorwise else (N, 1, 0))
    cfg = TileConfig(128, block_n, 128, 8, 4, stages)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert pingpong_ws.supported(aq, bq, out, scales, cfg)
    offs = torch.tensor([0, *itertools.accumulate(lens)], device="cuda", dtype=torch.int64)
    pingpong_ws.pingpong_mm(aq, bq, out, scales, cfg, offs if G > 1 else None)
    assert not out.isnan().any()
    a = aq.double() * sa.double().reshape(-1, 1)  # [M, 1] or [1, 1]
    w = bq.double() * sw.double().reshape(G, -1, 1)  # [G, N, 1] or [G, 1, 1]
    expected = torch.cat([a[lo:hi] @ w[g].t() for g, (lo, hi) in enumerate(itertools.pairwise(offs.tolist()))])
    assert snr_db(out, expected) >= 45.0  # bf16 rounding of the output
