"""The warp-specialized blockwise FP8 kernel (Hopper only) against float64 on the dequantized operands:
M-grouped (the forward and the dgrad) and the token reduction (the wgrad), dense and grouped (skewed,
empty groups, ragged edges), mixed FP8 formats, writing fresh outputs and adding into them."""

import dataclasses
import itertools

import pytest
import torch

from harness.snr import snr_db
from kernels.common import blockwise_ws
from kernels.common.fp8 import Granularity, RowGroups, quantize_blocks_2d, quantize_both, quantize_rows
from kernels.common.scales import Scales
from kernels.common.tiles import TileConfig
from kernels.grouped_gemm_fp8.kernel import QuantizedWeight, row_scale_strides
from kernels.grouped_gemm_fp8.tuning import config_for
from tests.compiled import compiled_for_hopper

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def test_takes_hopper_and_its_scale_layouts_only(device):
    """Elsewhere (the interpreter, other GPUs) blockwise GEMMs stay on the Triton kernel; on Hopper the
    M-grouped launch takes 128x128 weight blocks and the token reduction per-row ones, not the other's,
    and only tiles that fit."""
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
    narrow, wide = TileConfig(128, 128, 128, 8, 8, 4), TileConfig(128, 256, 128, 8, 8, 4)
    assert blockwise_ws.supported(a, b[0], out, per_column, narrow, token_reduction=True) == hopper
    assert not blockwise_ws.supported(a, b[0], out, scales, narrow, token_reduction=True)
    # 128x256 into bf16 up to 4 stages, M-grouped and as the token reduction (whose consumers' output tiles
    # are half as wide, beside its column ratios); into fp32 (an output tile twice the shared memory) 3
    out16 = out.to(torch.bfloat16)
    wide3 = dataclasses.replace(wide, num_stages=3)
    for token_reduction, b_operand, b_scales in ((False, b, scales), (True, b[0], per_column)):
        assert blockwise_ws.supported(a, b_operand, out16, b_scales, wide, token_reduction) == hopper
        assert not blockwise_ws.supported(a, b_operand, out16, b_scales, dataclasses.replace(wide, num_stages=5),
                                          token_reduction)
        assert not blockwise_ws.supported(a, b_operand, out, b_scales, wide, token_reduction)
        assert blockwise_ws.supported(a, b_operand, out, b_scales, wide3, token_reduction) == hopper
    # a table's stages that do not fit beside an output's tile come down to those that do
    assert blockwise_ws.fitted(wide, out16, token_reduction=True) is wide
    assert blockwise_ws.fitted(wide, out, token_reduction=True) == wide3
    assert blockwise_ws.fitted(wide, out) == wide3 and blockwise_ws.fitted(narrow, out) is narrow
    # what the ops ask: the fitted config where the kernel takes the call, else None
    assert blockwise_ws.runnable(a, b[0], out, per_column, wide, token_reduction=True) == (wide3 if hopper else None)
    assert blockwise_ws.runnable(a, b[0], out, scales, narrow, token_reduction=True) is None
    # where the Triton kernels run instead, the table's 256-wide tile narrows to theirs
    assert blockwise_ws.triton_tile(wide) == narrow and blockwise_ws.triton_tile(narrow) is narrow


def test_compiles_for_hopper_without_spills_or_serialized_wgmmas():
    """Triton's own ptxas (no GPU needed) on the kernel as the ops launch it, M-grouped and as the wgrad's
    token reduction (fresh and accumulating), and scaled in the epilogue (rowwise): E4M3 wgmmas fed by TMA,
    no register spills, and no serialization (ptxas waits for each wgmma when an instruction may touch one's
    accumulator in flight, as promoting each K block's product one block late did: 0.6-0.7x on the H100),
    and 128x256 tiles 4 stages deep within an H100's shared memory (the token reduction fresh and adding into
    a bf16 main_grad, and at 3 into an fp32 one).
    A subprocess, since the kernels must be compiled, not interpreted."""
    cases = ((False, False), (True, False), (True, True), (False, False, 256), (True, False, 256, 3),
             (True, True, 256, 3, "*bf16"), (True, True, 256, 4, "*bf16"), (True, True, 256, 3, "*fp32"),
             (False, False, 256, 4, None, False), (False, False, 128, 4, None, False),
             (True, False, 256, 3, None, False), (True, True, 128, 4, "*fp32", False))
    reports = compiled_for_hopper(f"[hopper_compile.compile_blockwise_ws(*c) for c in {cases!r}]")
    expected = ((128, 4, 2), (128, 4, 2), (128, 4, 4), (256, 4, 2), (256, 3, 2), (256, 3, 2), (256, 4, 2),
                (256, 3, 4), (256, 4, 2), (128, 4, 2), (256, 3, 2), (128, 4, 4))
    for report, case, (block_n, stages, out_bytes) in zip(reports, cases, expected, strict=True):
        # the 256-wide token reduction: each consumer two 64x128 MMAs a block (its columns, all 128 rows)
        wide_token_reduction = case[0] and block_n == 256 and (len(case) < 6 or case[5])
        assert (report["wgmma_e4m3"], report["tma_loads"]) == (16 if wide_token_reduction else 8, 3), report
        assert report["spill_bytes"] == 0 and report["wgmma_serialized"] == 0, report
        # `supported` bounds the kernel's shared memory from above, and the tested tiles fit an H100
        bound = blockwise_ws.shared_bytes(block_n, stages, out_bytes, case[0], len(case) < 6 or case[5])
        assert report["shared_bytes"] <= bound <= blockwise_ws.SHARED_MEMORY_BYTES, (report, bound)
    assert blockwise_ws.fits(256, 4, 2) and not blockwise_ws.fits(256, 5, 2)
    assert blockwise_ws.fits(256, 4, 2, token_reduction=True) and not blockwise_ws.fits(256, 5, 2, token_reduction=True)


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
    # 128x256 tiles span two weight blocks; N 640 and 384 leave a last tile whose upper half is past N
    "dense-256": ([1024], 1024, 1024, E4M3, 256, 4),
    "grouped-skewed-empty-256": ([2100, 0, 300, 1, 1000, 0, 695, 0], 640, 1024, E4M3, 256, 3),
    "grouped-e5m2-a-256": ([700, 0, 90], 384, 640, E5M2, 256, 4),
}


@pytest.mark.gpu
@pytest.mark.parametrize("ping_pong", [True, False], ids=["in-turns", "free"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_float64_on_its_operands(name, ping_pong):
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
    blockwise_ws.blockwise_mm(aq, bq, out, scales, cfg, offs if G > 1 else None, ping_pong)
    assert not out.isnan().any()
    assert snr_db(out, grouped_reference(aq, sa, bq, sb, lens, 128)) >= 45.0  # bf16 rounding of the output


@pytest.mark.gpu
@pytest.mark.parametrize("ping_pong", [True, False], ids=["in-turns", "free"])
@pytest.mark.parametrize("granularity", [Granularity.ROWWISE, Granularity.TENSORWISE], ids=["rowwise", "tensorwise"])
@pytest.mark.parametrize("name", list(CASES))
def test_scales_in_the_epilogue_match_float64(name, granularity, ping_pong):
    """Scales constant along K (rowwise: A's per row, the weight's per group and output column; tensorwise: one
    of each per group) multiply the sum once, before the store: the MMAs run back to back, one in flight."""
    lens, N, K, a_dtype, block_n, stages = CASES[name]
    torch.manual_seed(len(name))
    G, M = len(lens), sum(lens)
    aq, sa = quantize_rows(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), a_dtype, granularity)
    w = torch.randn(G, N, K, device="cuda", dtype=torch.bfloat16)
    weight = QuantizedWeight.quantize(w, False, E4M3, granularity)
    scales = Scales(sa, row_scale_strides(sa, granularity), weight.scale, weight.strides)
    cfg = TileConfig(128, block_n, 128, 8, 8, stages)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert blockwise_ws.supported(aq, weight.data, out, scales, cfg)
    offs = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int64)
    blockwise_ws.blockwise_mm(aq, weight.data, out, scales, cfg, offs if G > 1 else None, ping_pong)
    assert not out.isnan().any()
    a = aq.double() * sa.double().reshape(-1, 1).expand(M, 1)
    b_scale = weight.scale.double().reshape(G, -1).expand(G, N)
    expected = torch.cat([a[start:start + n] @ (weight.data[g].double() * b_scale[g][:, None]).t()
                          for g, (start, n) in enumerate(zip(offs.tolist(), lens, strict=False))])
    assert snr_db(out, expected) >= 45.0  # bf16 rounding of the output


@pytest.mark.gpu
def test_zero_blocks_and_rows_scale_without_nans():
    """The M-grouped walk divides by each K block's scale: all-zero blocks of A, of the weight and of
    both (the quantizer's smallest scales), and all-zero rows, still give the float64 result."""
    torch.manual_seed(7)
    M, N, K = 512, 512, 1024
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    a[:, 256:384] = 0  # one K block of every row
    a[100:200] = 0     # whole rows
    w = torch.randn(1, N, K, device="cuda", dtype=torch.bfloat16)
    w[0, :128, 256:384] = 0  # the same K block of the first weight block row: both operands zero there
    w[0, 256:, 640:768] = 0
    aq, sa = quantize_rows(a, E4M3, Granularity.BLOCKWISE)
    bq, _, sb = quantize_blocks_2d(w, E4M3)
    scales = Scales(sa, sa.stride(), sb, sb.stride(), 128, per_k_block=True)
    expected = grouped_reference(aq, sa, bq, sb, [M], 128)
    for block_n in (128, 256):
        out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        blockwise_ws.blockwise_mm(aq, bq, out, scales, TileConfig(128, block_n, 128, 8, 8, 4))
        assert not out.isnan().any()
        assert out[100:200].eq(0).all()
        assert snr_db(out, expected) >= 45.0


def dequantized_t(qt: torch.Tensor, scale_t: torch.Tensor) -> torch.Tensor:
    """quantize_both's cols_t layout back in float64: qt [P, capacity] with scale_t [capacity / 128, P]."""
    return qt.double() * scale_t.double().t().repeat_interleave(128, 1)[:, :qt.shape[1]]


TOKEN_CASES = {
    # name: (tokens per group, None: dense, P, Q, out dtype, accumulate, BLOCK_N, stages)
    "dense": ([1000], None, 1024, 896, torch.bfloat16, False, 128, 4),
    "dense-accumulate-fp32": ([4096], None, 512, 640, torch.float32, True, 128, 4),
    "grouped-skewed-empty": ([2100, 0, 300, 1, 1000, 0, 695, 0], True, 384, 512, torch.bfloat16, False, 128, 4),
    "grouped-accumulate-bf16": ([512, 512, 512, 0, 77], True, 256, 320, torch.bfloat16, True, 64, 3),
    # 128x256: the consumers split the columns, each sum rescaled (column ratios through shared memory); Q 320
    # and 640 leave a last tile whose upper half is past Q; the accumulating ones start their sums from C
    "dense-256": ([1000], None, 1024, 896, torch.bfloat16, False, 256, 3),
    "grouped-skewed-empty-256": ([2100, 0, 300, 1, 1000, 0, 695, 0], True, 384, 640, torch.bfloat16, False, 256, 3),
    "grouped-accumulate-bf16-256": ([512, 512, 512, 0, 77], True, 256, 320, torch.bfloat16, True, 256, 3),
    "dense-accumulate-fp16-256": ([4096], None, 512, 640, torch.float16, True, 256, 3),
    "grouped-accumulate-fp32-256": ([2100, 0, 300, 1, 1000, 0, 695, 0], True, 384, 640, torch.float32, True, 256, 3),
    "dense-256-s4": ([1000], None, 1024, 896, torch.bfloat16, False, 256, 4),
}


@pytest.mark.gpu
def test_token_reduction_zero_blocks_scale_without_nans():
    """The 256-wide token reduction divides by each token block's row and column scales: token blocks
    where rows of x, of y, or of both are all zero (the quantizer's smallest scales), fresh and adding
    into a bf16 main_grad, still give the float64 result."""
    torch.manual_seed(11)
    T, P, Q = 1024, 256, 512
    x = torch.randn(T, P, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(T, Q, device="cuda", dtype=torch.bfloat16)
    x[256:384, :64] = 0    # a token block of some of x's rows
    y[256:384, :128] = 0   # ... and of y's: both zero there for 64 x 128 outputs
    y[640:768] = 0          # a whole token block of y
    x[:, 200:] = 0          # whole rows of x: their outputs are 0 (or the main_grad's)
    groups = RowGroups.equal(1, T)
    (xt, sx), (yt, sy) = (quantize_both(t, E4M3, Granularity.BLOCKWISE, groups, rows=False).cols_t for t in (x, y))
    scales = Scales(sx, (sx.stride(1), sx.stride(0)), sy, (0, sy.stride(1), sy.stride(0)), per_k_block=True)
    expected = dequantized_t(xt, sx) @ dequantized_t(yt, sy).t()
    for accumulate in (False, True):
        start = torch.randn(P, Q, device="cuda").to(torch.bfloat16)
        out = start.clone() if accumulate else torch.full((P, Q), float("nan"), device="cuda", dtype=torch.bfloat16)
        blockwise_ws.blockwise_token_mm(xt, yt, out, scales, TileConfig(128, 256, 128, 8, 8, 3), accumulate=accumulate)
        assert not out.isnan().any()
        assert out[200:].eq(start[200:] if accumulate else 0).all()
        assert snr_db(out, expected + (start.double() if accumulate else 0)) >= 45.0


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(TOKEN_CASES))
def test_token_reduction_matches_float64_on_its_operands(name):
    """out[g] (+)= x_g^T @ y_g over each group's tokens, both quantized 1x128 along the tokens into the
    padded transposed layout the FP8 wgrads read."""
    lens, grouped, P, Q, out_dtype, accumulate, block_n, stages = TOKEN_CASES[name]
    torch.manual_seed(len(name))
    G, T = len(lens), sum(lens)
    offs = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int64)
    groups = RowGroups.tokens(offs) if grouped else RowGroups.equal(1, T)
    x = quantize_both(torch.randn(T, P, device="cuda", dtype=torch.bfloat16), E4M3, Granularity.BLOCKWISE, groups,
                      rows=False)
    y = quantize_both(torch.randn(T, Q, device="cuda", dtype=torch.bfloat16), E4M3, Granularity.BLOCKWISE, groups,
                      rows=False)
    (xt, sx), (yt, sy) = x.cols_t, y.cols_t
    scales = Scales(sx, (sx.stride(1), sx.stride(0)), sy, (0, sy.stride(1), sy.stride(0)), per_k_block=True)
    cfg = TileConfig(128, block_n, 128, 8, 8, stages)
    shape = (G, P, Q) if grouped else (P, Q)
    start = torch.randn(shape, device="cuda").to(out_dtype)
    out = start.clone() if accumulate else torch.full(shape, float("nan"), device="cuda", dtype=out_dtype)
    assert blockwise_ws.supported(xt, yt, out, scales, cfg, token_reduction=True)
    blockwise_ws.blockwise_token_mm(xt, yt, out, scales, cfg, x.padded_offs if grouped else None, accumulate)
    assert not out.isnan().any()
    xd, yd = dequantized_t(xt, sx), dequantized_t(yt, sy)
    bounds = x.padded_offs.tolist() if grouped else [0, xt.shape[1]]
    expected = torch.stack([xd[:, a:b] @ yd[:, a:b].t() for a, b in itertools.pairwise(bounds)]).reshape(shape)
    if accumulate:
        expected += start.double()
    floor = 55.0 if out_dtype == torch.float32 else 45.0  # FP8 tensor cores' accumulation; the output's rounding
    assert snr_db(out, expected) >= floor


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(TOKEN_CASES))
def test_token_reduction_scaled_in_the_epilogue_matches_float64(name):
    """The rowwise wgrad: both operands quantized per row of each group along its tokens (quantize_both's
    transposed layout, scales [G, rows]), their scales applied once before the store; adding into C, 256-wide
    tiles narrow to 128 (at 256 the sum and C's tile spill registers)."""
    lens, grouped, P, Q, out_dtype, accumulate, block_n, stages = TOKEN_CASES[name]
    torch.manual_seed(len(name))
    G, T = len(lens), sum(lens)
    offs = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int64)
    groups = RowGroups.tokens(offs) if grouped else RowGroups.equal(1, T)
    x, y = (quantize_both(torch.randn(T, n, device="cuda", dtype=torch.bfloat16), E4M3, Granularity.ROWWISE, groups,
                          rows=False) for n in (P, Q))
    (xt, sx), (yt, sy) = x.cols_t, y.cols_t
    scales = Scales(sx, (sx.stride(1), sx.stride(0)), sy, (sy.stride(0), sy.stride(1), 0))
    shape = (G, P, Q) if grouped else (P, Q)
    start = torch.randn(shape, device="cuda").to(out_dtype)
    out = start.clone() if accumulate else torch.full(shape, float("nan"), device="cuda", dtype=out_dtype)
    cfg = blockwise_ws.runnable(xt, yt, out, scales, TileConfig(128, block_n, 128, 8, 8, stages), True, accumulate)
    assert cfg is not None and (min(block_n, 128) if accumulate else block_n) == cfg.BLOCK_N
    blockwise_ws.blockwise_token_mm(xt, yt, out, scales, cfg, x.padded_offs if grouped else None, accumulate)
    assert not out.isnan().any()
    bounds = x.padded_offs.tolist() if grouped else [0, xt.shape[1]]
    expected = torch.stack([(xt[:, a:b].double() * sx[g].double()[:, None]) @
                            (yt[:, a:b].double() * sy[g].double()[:, None]).t()
                            for g, (a, b) in enumerate(itertools.pairwise(bounds))]).reshape(shape)
    if accumulate:
        expected += start.double()
    floor = 55.0 if out_dtype == torch.float32 else 45.0
    assert snr_db(out, expected) >= floor


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["grouped-uniform", "grouped-skewed-empty-256", "grouped-e5m2-a-256"])
def test_a_weight_whose_groups_lie_side_by_side_along_k(name):
    """The rowwise dgrad's weight: quantize_both's transposed layout, [G, N, K] with each group's K range beside
    the others' (padded to 128) rather than one group's rows after another's; read through one [N, G * stride]
    descriptor at column g * stride."""
    lens, N, K, a_dtype, block_n, stages = CASES[name]
    torch.manual_seed(len(name))
    G, M = len(lens), sum(lens)
    aq, sa = quantize_rows(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), a_dtype, Granularity.ROWWISE)
    # w [G, K, N] quantized along K (its rows), written transposed: [G, N, K] with K side by side
    weight = QuantizedWeight.quantize(torch.randn(G, K, N, device="cuda", dtype=torch.bfloat16), True, E4M3,
                                      Granularity.ROWWISE)
    assert weight.data.stride(1) == G * weight.data.stride(0) and weight.data.stride(0) >= K
    scales = Scales(sa, row_scale_strides(sa, Granularity.ROWWISE), weight.scale, weight.strides)
    cfg = TileConfig(128, block_n, 128, 8, 8, stages)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert blockwise_ws.supported(aq, weight.data, out, scales, cfg)
    offs = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int64)
    blockwise_ws.blockwise_mm(aq, weight.data, out, scales, cfg, offs, ping_pong=False)
    assert not out.isnan().any()
    b_scale = weight.scale.double().reshape(G, N)
    a = aq.double() * sa.double()[:, None]
    expected = torch.cat([a[start:start + n] @ (weight.data[g].double() * b_scale[g][:, None]).t()
                          for g, (start, n) in enumerate(zip(offs.tolist(), lens, strict=False))])
    assert snr_db(out, expected) >= 45.0
