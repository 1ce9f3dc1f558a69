import itertools

import pytest
import torch

import kernels.grouped_gemm.kernel as grouped_kernel
from harness.snr import snr_db
from kernels.common.device import SHARED_MEMORY_BYTES, default_device
from kernels.common.fp8 import Float8Config, Format, Granularity, token_layout
from kernels.common.tiles import TileConfig, config_from_table
from kernels.grouped_gemm import group_offsets, grouped_gemm
from kernels.grouped_gemm.kernel import epilogue_slices
from kernels.grouped_gemm.tuning import TUNABLE_SPACE, TUNED_TABLE
from kernels.grouped_gemm_fp8 import group_layout, grouped_gemm_fp8, prequantize_weight
from kernels.grouped_gemm_fp8 import tuning as fp8_tuning
from tests.compiled import BOTH_TRITONS, compiled_for_hopper
from tests.graph_replay import replay_and_eager
from tests.grouped_reference import grouped_reference

# Router-made splits: uniform, one expert with >= 50%, empty groups, odd sizes (none a block multiple).
SPLITS = {
    "uniform": [48, 48, 48, 48],
    "hot": [150, 20, 13, 17],
    "empty": [0, 61, 0, 35],
    "odd": [37, 1, 100, 5],
}


def run_op(op, lens, N, K, trans_b, dtype, device, **kwargs):
    torch.manual_seed(sum(lens) * 31 + N + K)
    G, M = len(lens), sum(lens)
    a = torch.randn(M, K, dtype=dtype, device=device, requires_grad=True)
    b = torch.randn((G, N, K) if trans_b else (G, K, N), dtype=dtype, device=device, requires_grad=True)
    group_lens = torch.tensor(lens, dtype=torch.int64, device=device)
    out = op(a, b, group_lens, trans_b=trans_b, **kwargs)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    ref = grouped_reference(a, b, lens, grad_out, trans_b)
    return [snr_db(x, r) for x, r in zip((out, a.grad, b.grad), ref, strict=True)]


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("trans_b", [True, False])
def test_bf16_grouped_fwd_dgrad_wgrad(split, trans_b, device, half_dtype):
    snrs = run_op(grouped_gemm, SPLITS[split], 40, 56, trans_b, half_dtype, device)
    floor = 50 if half_dtype == torch.float16 else 40
    assert min(snrs) > floor, snrs


@pytest.mark.parametrize("block_m", [64, 128])
@pytest.mark.parametrize("split", ["hot", "empty", "odd"])
def test_flat_and_nested_tile_loops_agree(split, block_m, device, half_dtype, monkeypatch):
    """The M-grouped kernel's two tile loops (every group's tiles in one loop, each tile's group from a token
    layout; or group by group) write the same output, right against float64 on skewed and empty groups. The
    layout handed in has 128-row blocks: under 64-row tiles the launch makes its own."""
    lens = SPLITS[split]
    G, M, N, K = len(lens), sum(lens), 72, 48
    torch.manual_seed(M + block_m)
    a = torch.randn(M, K, dtype=half_dtype, device=device)
    b = torch.randn(G, N, K, dtype=half_dtype, device=device)
    offs = group_offsets(torch.tensor(lens, device=device))
    cfg = TileConfig(BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_warps=4, num_stages=2)
    layout = token_layout(offs, M // 128 + G + 1)
    outs = {}
    for flat in (True, False):
        monkeypatch.setattr(grouped_kernel, "flat_tiles", lambda *_, flat=flat: flat)
        outs[flat] = grouped_kernel.grouped_mm(a, b, offs, torch.full((M, N), float("nan"), dtype=half_dtype,
                                                                        device=device), cfg, layout=layout)
    assert torch.equal(outs[True], outs[False])
    starts = [0, *torch.tensor(lens).cumsum(0).tolist()]
    ref = torch.cat([a[s:e].double() @ b[g].double().T for g, (s, e) in enumerate(itertools.pairwise(starts))])
    assert snr_db(outs[True], ref) > (50 if half_dtype == torch.float16 else 40)


@pytest.mark.parametrize("flat", [True, False])
@pytest.mark.parametrize("split", ["hot", "empty", "odd"])
def test_rows_read_through_an_index_equal_the_gathered_copy(split, flat, device, half_dtype, monkeypatch):
    """grouped_mm's a_rows (A's row r is a[a_rows[r]], zeros where negative): the output equals that of the
    gathered copy bit for bit, in both tile loops, 64- and 128-row tiles, skewed and empty groups."""
    lens = SPLITS[split]
    G, M, N, K, T = len(lens), sum(lens), 72, 48, 29
    torch.manual_seed(M)
    a = torch.randn(T, K, dtype=half_dtype, device=device)
    b = torch.randn(G, N, K, dtype=half_dtype, device=device)
    a_rows = torch.randint(-1, T, (M,), dtype=torch.int32, device=device)
    copy = torch.where((a_rows >= 0)[:, None], a[a_rows.clamp(min=0).long()], 0.0).to(half_dtype)
    offs = group_offsets(torch.tensor(lens, device=device))
    monkeypatch.setattr(grouped_kernel, "flat_tiles", lambda *_: flat)
    for block_m in (64, 128):
        cfg = TileConfig(BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_warps=4, num_stages=2)
        want = grouped_kernel.grouped_mm(copy, b, offs, torch.full((M, N), float("nan"), dtype=half_dtype,
                                                                   device=device), cfg)
        got = grouped_kernel.grouped_mm(a, b, offs, torch.full((M, N), float("nan"), dtype=half_dtype, device=device),
                                        cfg, a_rows=a_rows)
        assert torch.equal(got, want), block_m
    with pytest.raises(ValueError, match="a_rows must be int32"):
        grouped_kernel.grouped_mm(a, b, offs, torch.empty((M, N), dtype=half_dtype, device=device), cfg,
                                  a_rows=a_rows.long())


@pytest.mark.parametrize("granularity", list(Granularity))
@pytest.mark.parametrize("split", ["hot", "empty", "odd"])
def test_fp8_e4m3_grouped_all_granularities(granularity, split, device, half_dtype):
    cfg = Float8Config(Format.E4M3, granularity)
    # N and K straddle 128-blocks: partial blocks get their own scales.
    snrs = run_op(grouped_gemm_fp8, SPLITS[split], 200, 136, True, half_dtype, device, config=cfg)
    assert min(snrs) >= 25, snrs


@pytest.mark.parametrize("granularity", list(Granularity))
@pytest.mark.parametrize("fmt", [Format.HYBRID, Format.E5M2])
def test_fp8_hybrid_and_e5m2(fmt, granularity, device, half_dtype):
    cfg = Float8Config(fmt, granularity)
    out_snr, da_snr, db_snr = run_op(grouped_gemm_fp8, SPLITS["odd"], 72, 160, True, half_dtype, device, config=cfg)
    assert out_snr >= (25 if fmt == Format.HYBRID else 20)  # HYBRID's forward is E4M3
    assert da_snr >= 20 and db_snr >= 20


@pytest.mark.parametrize("granularity", list(Granularity))
def test_fp8_weight_stored_k_by_n(granularity, device, half_dtype):
    snrs = run_op(grouped_gemm_fp8, SPLITS["empty"], 130, 96, False, half_dtype, device,
                  config=Float8Config(Format.E4M3, granularity))
    assert min(snrs) >= 25, snrs


def test_group_offsets_on_device():
    lens = torch.tensor([3, 0, 5], dtype=torch.int64)
    assert group_offsets(lens).tolist() == [0, 3, 3, 8]


def _inputs(device, dtype=torch.float16, lens=(4, 4), K=16, N=8):
    a = torch.randn(sum(lens), K, dtype=dtype, device=device)
    b = torch.randn(len(lens), N, K, dtype=dtype, device=device)
    return a, b, torch.tensor(lens, dtype=torch.int64, device=device)


@pytest.mark.parametrize("op", [grouped_gemm, grouped_gemm_fp8])
def test_bad_inputs_raise_value_errors(op):
    device = default_device()
    a, b, lens = _inputs(device)
    cases = [
        ((a[:, :8], b, lens), "K differs"),
        ((a, b, lens[:1]), "1 groups but b has 2"),
        ((a, b, lens.int()), "int64"),
        ((a.float(), b.float(), lens), "dtype"),
        ((a, b[0], lens), r"\[G, N, K\]"),
    ]
    if device.type == "cpu":  # group sizes on a GPU are not read back: that would be a host sync
        cases += [
            ((a, b, torch.tensor([4, 5], device=device)), "sums to 9 but a has 8 rows"),
            ((a, b, torch.tensor([-1, 9], device=device)), "negative"),
        ]
    for args, match in cases:
        with pytest.raises(ValueError, match=match):
            op(*args)
    with pytest.raises(ValueError, match="group_offs"):
        op(a, b, lens, group_offs=torch.zeros(2, dtype=torch.int64, device=device))


def test_bad_fp8_config_raises():
    a, b, lens = _inputs(default_device())
    with pytest.raises(ValueError, match="Float8Config"):
        grouped_gemm_fp8(a, b, lens, config="rowwise")
    with pytest.raises(ValueError, match="block_size must be 128"):
        Float8Config(Format.E4M3, Granularity.BLOCKWISE, block_size=64)
    with pytest.raises(ValueError, match="granularity"):
        Float8Config(Format.E4M3, "columnwise")


def test_tuned_tables_lie_in_their_spaces():
    for key in TUNED_TABLE:
        config_from_table(TUNED_TABLE, TUNABLE_SPACE, key)
    for key in fp8_tuning.TUNED_TABLE:
        config_from_table(fp8_tuning.TUNED_TABLE, fp8_tuning.TUNABLE_SPACE, key)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["bf16", "e4m3-rowwise", "hybrid-blockwise", "e4m3-tensorwise", "e4m3-rowwise-ws",
                                     "e4m3-tensorwise-ws"])
def test_gpu_step_under_cuda_graph_replays_the_same_result(variant, monkeypatch):
    """The whole fwd+bwd step is captured once and replayed on new inputs: no host sync, same result. `-ws`: every
    pass of the variant on the warp-specialized kernel (WS 1 in its buckets: the rowwise dgrad's weight side by
    side along K, the wgrad's token reduction scaled in the epilogue)."""
    if variant.endswith("-ws"):
        variant = variant.removesuffix("-ws")
        for name, entry in fp8_tuning.TUNED_TABLE.items():
            monkeypatch.setitem(fp8_tuning.TUNED_TABLE, name, entry | {"WS": 1})
    torch.manual_seed(0)
    lens = [3000, 0, 517, 9000, 1]  # skewed, empty, odd
    G, M, N, K = len(lens), sum(lens), 1536, 1024
    a = torch.randn(M, K, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    b = torch.randn(G, N, K, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    group_lens = torch.tensor(lens, dtype=torch.int64, device="cuda")
    grad_out = torch.randn(M, N, dtype=torch.bfloat16, device="cuda")
    if variant == "bf16":
        def op():
            return grouped_gemm(a, b, group_lens)
    else:
        fmt, gran = variant.split("-")
        cfg = Float8Config(Format(fmt), Granularity(gran))

        def op():
            return grouped_gemm_fp8(a, b, group_lens, config=cfg)

    def step():
        a.grad = b.grad = None
        out = op()
        out.backward(grad_out)
        return out, a.grad, b.grad

    replayed, eager = replay_and_eager(step, (a, b))
    ref = grouped_reference(a, b, lens, grad_out, True)
    floor = 40 if variant == "bf16" else 20
    for got, eager_t, want in zip(replayed, eager, ref, strict=True):
        assert torch.equal(got, eager_t)  # the replay computes what eager mode computes
        assert snr_db(got, want) > floor


@pytest.mark.parametrize("granularity", [Granularity.ROWWISE, Granularity.BLOCKWISE], ids=lambda g: g.value)
@pytest.mark.parametrize("wants", ["input", "weight"])
def test_fp8_step_that_wants_one_gradient_gets_it_right(granularity, wants, device, half_dtype):
    """Only the wanted gradient's operands are kept by the forward; each path alone matches float64."""
    lens = SPLITS["empty"]
    G, M, N, K = len(lens), sum(lens), 72, 136
    torch.manual_seed(5)
    a = torch.randn(M, K, dtype=half_dtype, device=device, requires_grad=wants == "input")
    b = torch.randn(G, N, K, dtype=half_dtype, device=device, requires_grad=wants == "weight")
    out = grouped_gemm_fp8(a, b, torch.tensor(lens, device=device), config=Float8Config(Format.E4M3, granularity))
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    _, ref_da, ref_db = grouped_reference(a.detach(), b.detach(), lens, grad_out, True)
    got, ref, other = (a.grad, ref_da, b.grad) if wants == "input" else (b.grad, ref_db, a.grad)
    assert other is None and snr_db(got, ref) >= 25


@pytest.mark.parametrize("granularity", [Granularity.ROWWISE, Granularity.BLOCKWISE], ids=lambda g: g.value)
@pytest.mark.parametrize("trans_b", [True, False])
def test_fp8_weights_quantized_once_give_the_same_step(granularity, trans_b, device, half_dtype):
    """prequantize_weight once, then the op reads that copy instead of quantizing b: the same output and
    gradients (b's included), bit for bit."""
    lens, N, K = SPLITS["empty"], 72, 136
    cfg = Float8Config(Format.HYBRID, granularity)
    torch.manual_seed(11)
    a0 = torch.randn(sum(lens), K, dtype=half_dtype, device=device)
    b0 = torch.randn((len(lens), N, K) if trans_b else (len(lens), K, N), dtype=half_dtype, device=device)
    grad = torch.randn(sum(lens), N, dtype=half_dtype, device=device)
    group_lens = torch.tensor(lens, device=device)
    results = []
    for prequantized in (False, True):
        a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
        b_fp8 = prequantize_weight(b, trans_b, cfg) if prequantized else None
        out = grouped_gemm_fp8(a, b, group_lens, trans_b=trans_b, config=cfg, b_fp8=b_fp8)
        out.backward(grad)
        results.append((out, a.grad, b.grad))
    for plain, reused in zip(*results, strict=True):
        assert torch.equal(plain, reused)


@pytest.mark.parametrize("granularity", [Granularity.ROWWISE, Granularity.BLOCKWISE], ids=lambda g: g.value)
@pytest.mark.parametrize("trans_b", [True, False])
@pytest.mark.parametrize("buffer_dtype", ["fp32", "b's dtype"])
def test_fp8_wgrad_accumulates_into_main_grad(granularity, trans_b, buffer_dtype, device, half_dtype):
    """Two microbatches (other splits, group 0 empty in both) adding their weight gradients into one
    main_grad that holds an earlier sum: the buffer ends at that sum plus both float64 wgrads, group 0
    untouched; b.grad stays None and a's gradient is the plain op's, bit for bit."""
    N, K, G = 40, 136, 4
    cfg = Float8Config(Format.E4M3, granularity)
    torch.manual_seed(5)
    b = torch.randn((G, N, K) if trans_b else (G, K, N), dtype=half_dtype, device=device, requires_grad=True)
    main_grad = torch.randn(b.shape, dtype=torch.float32 if buffer_dtype == "fp32" else half_dtype, device=device)
    start = main_grad.clone()
    added = torch.zeros(b.shape, dtype=torch.float64, device=device)
    for lens in ([0, 61, 0, 35], [0, 7, 130, 1]):
        a = torch.randn(sum(lens), K, dtype=half_dtype, device=device, requires_grad=True)
        grad = torch.randn(sum(lens), N, dtype=half_dtype, device=device)
        group_lens = torch.tensor(lens, device=device)
        grouped_gemm_fp8(a, b, group_lens, trans_b=trans_b, config=cfg, main_grad=main_grad).backward(grad)
        da = a.grad
        a.grad = None
        grouped_gemm_fp8(a, b.detach(), group_lens, trans_b=trans_b, config=cfg).backward(grad)
        assert torch.equal(da, a.grad)
        added += grouped_reference(a, b, lens, grad, trans_b)[2]
    assert b.grad is None
    assert torch.equal(main_grad[0], start[0])
    assert snr_db(main_grad.double() - start.double(), added) >= 25


def test_a_main_grad_the_wgrad_cannot_add_into_is_refused(device):
    lens = torch.tensor([3, 5], device=device)
    a = torch.randn(8, 32, dtype=torch.float16, device=device)
    b = torch.randn(2, 16, 32, dtype=torch.float16, device=device, requires_grad=True)
    for bad, what in ((torch.zeros(2, 32, 16, device=device), r"b's shape \[2, 16, 32\]"),
                      (torch.zeros(2, 16, 32, device=device, dtype=torch.bfloat16), "float32 or torch.float16"),
                      (torch.zeros(2, 32, 16, device=device).transpose(1, 2), "non-contiguous")):
        with pytest.raises(ValueError, match=what):
            grouped_gemm_fp8(a, b, lens, main_grad=bad)
    with pytest.raises(ValueError, match="does not require grad"):
        grouped_gemm_fp8(a, b.detach(), lens, main_grad=torch.zeros(2, 16, 32, device=device))


def test_a_foreign_fp8_weight_copy_is_refused(device):
    lens = torch.tensor([3, 5], device=device)
    a = torch.randn(8, 32, dtype=torch.float16, device=device)
    b = torch.randn(2, 16, 32, dtype=torch.float16, device=device, requires_grad=True)
    b_fp8 = prequantize_weight(b)
    with pytest.raises(ValueError, match=r"the config wants torch\.float8_e4m3fn blockwise"):
        grouped_gemm_fp8(a, b, lens, config=Float8Config(granularity=Granularity.BLOCKWISE), b_fp8=b_fp8)
    with pytest.raises(ValueError, match="trans_b"):
        grouped_gemm_fp8(a, b.detach().transpose(1, 2).contiguous(), lens, trans_b=False, b_fp8=b_fp8)
    with pytest.raises(ValueError, match="prequantize_weight"):
        grouped_gemm_fp8(a, b, lens, b_fp8="w8")


def test_a_token_layout_of_other_groups_or_fewer_rows_is_refused(device):
    lens = torch.tensor([100, 200], device=device)
    a = torch.randn(300, 32, dtype=torch.float16, device=device)
    b = torch.randn(2, 16, 32, dtype=torch.float16, device=device)
    offs = group_offsets(lens)
    for bad, what in ((group_layout(offs, 8), r"group_layout\(group_offs, 300\): 5 blocks of 128 rows over 2 "
                                              "groups, got 3 blocks of 128 over 2"),
                      (group_layout(group_offsets(torch.tensor([300], device=device)), 300), "over 1$"),
                      (offs, "layout must be a TokenLayout")):
        with pytest.raises(ValueError, match=what):
            grouped_gemm_fp8(a, b, lens, offs, layout=bad)


@BOTH_TRITONS
def test_the_gathered_forward_tile_does_not_spill(triton_dir):
    """The FP8 forward with A's rows read through an index (cp.async, the MoE layer's GateUP forward and Down
    dgrad) on the tuned 128x256 tiles, K a multiple of 16 (16-byte rows: every preset's hidden size): nothing
    spilled, as with A by TMA (a spill there would be reloaded on every K step; at an odd K the byte-wide
    copies spill 2.8 KB a thread under Triton 3.6)."""
    reports = compiled_for_hopper("[hopper_compile.compile_grouped_forward(g) for g in (False, True)]", triton_dir)
    assert [report["spill_bytes"] for report in reports] == [0, 0], reports


@BOTH_TRITONS
def test_the_fp8_forward_fits_shared_memory_for_each_output_dtype(triton_dir):
    """Compiled for sm_90a as grouped_mm launches them (the tile loop `flat_tiles` picks for the output's dtype):
    the tuned FP8 forward and dgrad tiles (128x256 on 8 warps, 3 and 4 stages) fit an SM's shared memory with a
    bf16 and an fp32 output. The flattened loop keeps its stages' buffers through the epilogue: with an fp32
    output there it asked for 328 KB at 4 stages (the campaign's accumulation probe on the H100: OutOfResources),
    so an fp32 output takes the nested loops."""
    stages = sorted({cfg["num_stages"] for key, cfg in fp8_tuning.TUNED_TABLE.items()
                     if key.startswith(("fwd/", "dgrad/")) and "blockwise" not in key})
    cases = [(output, n, grouped_kernel.flat_tiles(1, 4096, nbytes)) for output, nbytes in (("*bf16", 2), ("*fp32", 4))
             for n in stages]
    assert [flat for *_, flat in cases] == [True] * len(stages) + [False] * len(stages)
    cases.append(("*fp32", max(stages), True))  # what the flattened loop would ask for
    reports = compiled_for_hopper(f"[hopper_compile.compile_grouped_forward(False, *c) for c in {cases!r}]",
                                  triton_dir)
    shared = {case: report["shared_bytes"] for case, report in zip(cases, reports, strict=True)}
    assert all(shared[case] <= SHARED_MEMORY_BYTES for case in cases[:-1]), shared
    assert shared[cases[-1]] > SHARED_MEMORY_BYTES, shared


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", list(Granularity), ids=lambda g: g.value)
def test_gpu_fp8_forward_into_fp32_on_a_long_k(granularity):
    """The campaign's accumulation probe as a test: two groups, K 16384, inputs x64, an fp32 output (its tile
    loop must fit the shared memory), against float64."""
    torch.manual_seed(0)
    lens, N, K = [128, 128], 192, 16384
    a = torch.randn(sum(lens), K, dtype=torch.bfloat16, device="cuda") * 64
    b = torch.randn(len(lens), N, K, dtype=torch.bfloat16, device="cuda") * 64
    out = grouped_gemm_fp8(a, b, torch.tensor(lens, device="cuda"), out_dtype=torch.float32,
                           config=Float8Config(Format.E4M3, granularity))
    assert out.dtype == torch.float32
    want = grouped_reference(a, b, lens, torch.zeros_like(out), True)[0]
    assert snr_db(out, want) >= 25


@BOTH_TRITONS
def test_the_accumulating_epilogue_in_slices_spills_less(triton_dir):
    """Compiled for sm_90a here (Triton's own ptxas, no GPU): adding into a main_grad, the grouped kernels' epilogue
    in epilogue_slices(True) column slices spills less than one whole tile (176-956 bytes a thread, both Tritons,
    128x256 on 8 warps and 128x128 on 4, the tuned wgrad tiles), and nothing in the grouped wgrad into a bf16
    main_grad (the MoE layer's; 1.018-1.025x its FP8 microbatch on the H100)."""
    slices = epilogue_slices(True)
    cases = [(var_k, block_n, warps, c_type, n) for var_k in (True, False) for block_n, warps in ((256, 8), (128, 4))
             for c_type in ("*bf16", "*fp32") for n in (1, slices)]
    reports = compiled_for_hopper(f"[hopper_compile.compile_grouped_epilogue(*c) for c in {cases!r}]", triton_dir)
    spills = {case: report["spill_bytes"] for case, report in zip(cases, reports, strict=True)}
    for var_k, block_n, warps, c_type, n in cases:
        if n == slices:
            whole = spills[(var_k, block_n, warps, c_type, 1)]
            assert whole > 0 and spills[(var_k, block_n, warps, c_type, n)] < whole, spills
            if var_k and c_type == "*bf16":
                assert spills[(var_k, block_n, warps, c_type, n)] == 0, spills
