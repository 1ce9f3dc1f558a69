import pytest
import torch

import kernels.common.fp8 as fp8_module
from harness.snr import snr_db
from kernels.common.device import default_device
from kernels.common.fp8 import (
    AMAX_EPS,
    FP8_MAX,
    WHOLE_ROW_MAX,
    Granularity,
    Quantized,
    RowGroups,
    RowSource,
    quantize_blocks_2d,
    quantize_both,
    quantize_cols_t,
    quantize_rows,
    token_layout,
)
from kernels.grouped_gemm import group_offsets

E4M3 = torch.float8_e4m3fn


@pytest.mark.parametrize("granularity", list(Granularity))
def test_quantize_rows_round_trip(granularity):
    x = torch.randn(70, 300, device=default_device()) * torch.logspace(-2, 2, 70, device=default_device())[:, None]
    q, s = quantize_rows(x.half(), E4M3, granularity)
    if granularity == Granularity.BLOCKWISE:
        assert s.shape == (70, 3)
        deq = q.float() * s.repeat_interleave(128, dim=1)[:, :300]
    else:
        assert s.shape == ((1,) if granularity == Granularity.TENSORWISE else (70,))
        deq = q.float() * (s if s.numel() == 1 else s[:, None])
    floor = 10 if granularity == Granularity.TENSORWISE else 28  # rows span 4 decades: one scale loses the small ones
    assert snr_db(deq, x.half()) > floor


@pytest.mark.parametrize("cols", [48, 200, 7168, WHOLE_ROW_MAX])
def test_blockwise_rows_read_whole_equal_the_block_loop(cols, monkeypatch):
    """Blockwise rows read whole (every 1x128 block's scale from one [rows, blocks, 128] view of the row) write
    the same fp8 values and scales as the loop over 128-column blocks, bit for bit, including a last partial
    block and rows narrower than one block."""
    x = (torch.randn(3, cols, device=default_device()) * torch.logspace(-3, 3, cols, device=default_device())).half()
    whole = quantize_rows(x, E4M3, Granularity.BLOCKWISE)
    monkeypatch.setattr(fp8_module, "whole_row_blocks", lambda C: False)
    looped = quantize_rows(x, E4M3, Granularity.BLOCKWISE)
    assert whole[1].shape == (3, -(-cols // 128))
    assert torch.equal(whole[0].float(), looped[0].float()) and torch.equal(whole[1], looped[1])


@pytest.mark.parametrize("cols", [WHOLE_ROW_MAX - 100, WHOLE_ROW_MAX + 100])
def test_quantize_rows_rowwise_scale_is_each_rows_amax(cols):
    """Rows read whole (up to WHOLE_ROW_MAX) and rows looped over in 128-column blocks: scale = amax / 448."""
    x = (torch.randn(3, cols, device=default_device()) * torch.tensor([[1e-3], [1.0], [1e3]], device=default_device()))
    x = x.half()
    q, s = quantize_rows(x, E4M3, Granularity.ROWWISE)
    torch.testing.assert_close(s, x.float().abs().amax(dim=1) / 448.0)
    assert snr_db(q.float() * s[:, None], x) > 28


def test_quantize_cols_t_blocks_stay_in_their_group_and_pad_with_zeros():
    device = default_device()
    lens = torch.tensor([130, 0, 5], dtype=torch.int64, device=device)
    offs = group_offsets(lens)
    x = torch.randn(135, 40, device=device).half()
    qt, s, padded = quantize_cols_t(x, offs, E4M3, Granularity.BLOCKWISE)
    assert padded.tolist() == [0, 256, 256, 384]
    # group 0 fills blocks 0-1 (130 rows), group 2 starts a fresh block at column 256
    assert s.shape == (5, 40)  # [token blocks of the capacity, columns]
    deq = qt.float() * s.t().repeat_interleave(128, dim=1)
    assert snr_db(deq[:, :130].t(), x[:130]) > 28
    assert snr_db(deq[:, 256:261].t(), x[130:]) > 28
    assert (qt[:, 130:256].float() == 0).all() and (qt[:, 261:].float() == 0).all()


def test_quantize_cols_t_rowwise_scales_per_group():
    device = default_device()
    offs = group_offsets(torch.tensor([20, 12], dtype=torch.int64, device=device))
    x = torch.cat([torch.randn(20, 16, device=device), 100 * torch.randn(12, 16, device=device)]).half()
    _, s, _ = quantize_cols_t(x, offs, E4M3, Granularity.ROWWISE)
    assert s.shape == (2, 16)
    assert torch.allclose(s[0], x[:20].float().abs().amax(0) / 448)
    assert torch.allclose(s[1], x[20:].float().abs().amax(0) / 448)


def test_quantize_blocks_2d_serves_both_orientations():
    w = torch.randn(2, 200, 136, device=default_device()).half()
    q, qt, s = quantize_blocks_2d(w, E4M3)
    assert s.shape == (2, 2, 2)
    assert torch.equal(q.transpose(1, 2).float(), qt.float())
    deq = q.float() * s.repeat_interleave(128, dim=1).repeat_interleave(128, dim=2)[:, :200, :136]
    assert snr_db(deq, w) > 28
    # One orientation alone: the same bytes and scales, the other not written.
    q_only, no_qt, s_rows = quantize_blocks_2d(w, E4M3, cols_t=False)
    no_q, qt_only, s_cols = quantize_blocks_2d(w, E4M3, rows=False)
    assert no_qt is None and no_q is None
    assert torch.equal(q_only.float(), q.float()) and torch.equal(qt_only.float(), qt.float())
    assert torch.equal(s_rows, s) and torch.equal(s_cols, s)


def _dequantized_group(qt, scale, granularity, group, first_col, rows):
    """Group `group`'s rows back from quantize_both's transposed layout (columns first_col onwards)."""
    cols = qt[:, first_col:first_col + rows].float().t()
    if granularity == Granularity.ROWWISE:
        return cols * scale[group]
    if granularity == Granularity.BLOCKWISE:  # scale [token blocks, columns]
        blocks = scale[first_col // 128:(first_col + rows + 127) // 128].repeat_interleave(128, 0)
        return cols * blocks[:rows]
    return cols * scale[group if scale.numel() > 1 else 0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("granularity", list(Granularity), ids=lambda g: g.value)
def test_quantize_both_writes_what_each_pass_reads_on_skewed_and_empty_groups(granularity, dtype):
    """Both layouts against the input, on skewed and empty groups; fp32 tiles too (on the H100, Triton 3.6
    once wrote a wrong tensorwise q^T for them while fp16 inputs were right)."""
    device = default_device()
    lens = torch.tensor([130, 0, 5, 257], dtype=torch.int64, device=device)
    offs = group_offsets(lens)
    x = torch.randn(392, 200, device=device).half().to(dtype)
    both = quantize_both(x, E4M3, granularity, RowGroups.tokens(offs))
    q, s = quantize_rows(x, E4M3, granularity)
    assert torch.equal(both.rows[0].float(), q.float()) and torch.allclose(both.rows[1], s)
    qt, st = both.cols_t
    padded = both.padded_offs.tolist()
    assert padded == [0, 256, 256, 384, 768] and qt.shape == (200, 1024)  # room for any split
    for g, n in enumerate(lens.tolist()):
        rows = x[offs[g]:offs[g + 1]].float()
        if n:
            assert snr_db(_dequantized_group(qt, st, granularity, g, padded[g], n), rows) > 28
        assert (qt[:, padded[g] + n:padded[g + 1]].float() == 0).all()  # the padding reads as zeros
    if granularity == Granularity.ROWWISE:  # the empty group gets a finite scale of its own
        assert torch.equal(st[1], torch.full_like(st[1], 1e-12 / 448))


@pytest.mark.parametrize("granularity", list(Granularity), ids=lambda g: g.value)
def test_quantize_both_on_stacked_weights_matches_quantize_rows_per_expert(granularity):
    w = torch.randn(3 * 70, 40, device=default_device()).half()
    both = quantize_both(w, E4M3, granularity, RowGroups.equal(3, 70), tensor_per_group=True)
    q, s = quantize_rows(w, E4M3, granularity, 70 if granularity == Granularity.TENSORWISE else None)
    assert torch.equal(both.rows[0].float(), q.float()) and torch.allclose(both.rows[1], s)
    qt, st = both.cols_t
    assert qt.shape == (40, 3 * 128)  # each expert's rows start on a 128 boundary
    for g in range(3):
        assert snr_db(_dequantized_group(qt, st, granularity, g, 128 * g, 70), w[70 * g:70 * (g + 1)]) > 28


def _rows_as_read(quantized: Quantized) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows layout as a GEMM reads it: through `row_index` where quantize_both left the source's own rows
    (a negative index: a zero row, whose scale that of an all-zero row), else as written."""
    q, scale = quantized.rows
    index = quantized.row_index
    if index is None:
        return q, scale
    read = (index >= 0)[:, None]
    return (torch.where(read, q[index.clamp(min=0).long()].float(), 0.0).to(q.dtype),
            torch.where(read[:, 0], scale[index.clamp(min=0).long()], AMAX_EPS / FP8_MAX[q.dtype]))


@pytest.mark.parametrize("granularity", list(Granularity), ids=lambda g: g.value)
@pytest.mark.parametrize("read", ["gather", "gather-weighted", "gather-glu"])
def test_quantize_both_through_a_row_source_equals_quantizing_the_gathered_copy(granularity, read):
    """Rows read through an index (some -1: zero rows), scaled per row or a SwiGLU's input, on skewed and
    empty groups: every layout and scale equals quantize_both of the copy written out in fp32, but for the
    rowwise transposed layout, whose amaxes come from the source (one read of its tokens): there every
    group's column scale is the column's amax over all tokens times the largest |weight|, and each group
    dequantizes back to the copy."""
    device = default_device()
    T, C, R = 23, 272, 150
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T, C, generator=g).half().to(device)
    rows = torch.randint(-1, T, (R,), generator=g, dtype=torch.int32).to(device)
    weight = torch.rand(R, generator=g).to(device) if read == "gather-weighted" else None
    offs = group_offsets(torch.tensor([0, 131, 0, 2, 17], dtype=torch.int64, device=device))
    copy = torch.where((rows >= 0)[:, None], x[rows.clamp(min=0).long()].float(), 0.0)
    if weight is not None:
        copy = copy * weight[:, None]
    glu = read == "gather-glu"
    want = quantize_both(copy, E4M3, granularity, RowGroups.tokens(offs), glu=glu)
    got = quantize_both(x, E4M3, granularity, RowGroups.tokens(offs), glu=glu, source=RowSource(rows, weight))
    # The transposed layout alone (a backward that wants only the weight's gradient): the same.
    cols_only = quantize_both(x, E4M3, granularity, RowGroups.tokens(offs), rows=False, glu=glu,
                              source=RowSource(rows, weight))
    assert cols_only.rows is None
    for g_t, w_t in zip(cols_only.cols_t, got.cols_t, strict=True):
        assert torch.equal(g_t.float(), w_t.float())
    # Rowwise rows read unweighted are x's own rows, read through the source's index.
    assert (got.row_index is not None) == (granularity == Granularity.ROWWISE and read == "gather")
    for g_t, w_t in zip(_rows_as_read(got), want.rows, strict=True):
        assert torch.equal(g_t.float(), w_t.float())
    if granularity != Granularity.ROWWISE:
        for g_t, w_t in zip(got.cols_t, want.cols_t, strict=True):
            assert torch.equal(g_t.float(), w_t.float())
    assert torch.equal(got.padded_offs, want.padded_offs)
    if granularity == Granularity.ROWWISE:
        def swiglu(t):
            return t[:, :C // 2] * torch.sigmoid(t[:, :C // 2]) * t[:, C // 2:]
        source, quantized = (swiglu(x.float()), swiglu(copy)) if glu else (x.float(), copy)
        bound = source.abs().amax(0) * (1.0 if weight is None else weight.abs().max())
        qt, st = got.cols_t
        assert torch.allclose(st, (bound.clamp_min(AMAX_EPS) / FP8_MAX[E4M3]).expand_as(st), rtol=1e-6, atol=0)
        padded = got.padded_offs.tolist()
        for g in range(offs.numel() - 1):
            first, size = int(offs[g]), int(offs[g + 1] - offs[g])
            assert not qt[:, padded[g] + size:padded[g + 1]].float().any()  # the padding stays zero
            if size and quantized[first:first + size].any():
                assert snr_db(_dequantized_group(qt, st, granularity, g, padded[g], size),
                              quantized[first:first + size]) > 25


@pytest.mark.parametrize("granularity", [Granularity.ROWWISE, Granularity.BLOCKWISE], ids=lambda g: g.value)
def test_a_row_sources_unweighted_rows_leave_the_weight_to_the_transposed_layout(granularity):
    """weighted_rows=False: the rows layout is that of the rows read without their weight (quantized from the
    unweighted copy), the transposed layout that of the weighted rows (as weighted_rows=True writes it), with
    signed, zero and skewed weights; tensorwise, where both layouts share one scale, is refused."""
    device = default_device()
    T, C, R = 23, 272, 150
    g = torch.Generator().manual_seed(2)
    x = torch.randn(T, C, generator=g).half().to(device)
    rows = torch.randint(-1, T, (R,), generator=g, dtype=torch.int32).to(device)
    weight = (torch.randn(R, generator=g) * torch.rand(R, generator=g) ** 4).to(device)
    weight[::7] = 0.0
    groups = RowGroups.tokens(group_offsets(torch.tensor([0, 131, 0, 2, 17], dtype=torch.int64, device=device)))
    unweighted = quantize_both(x, E4M3, granularity, groups, source=RowSource(rows))
    weighted = quantize_both(x, E4M3, granularity, groups, source=RowSource(rows, weight))
    got = quantize_both(x, E4M3, granularity, groups, source=RowSource(rows, weight, weighted_rows=False))
    for g_t, w_t in zip(_rows_as_read(got), _rows_as_read(unweighted), strict=True):
        assert torch.equal(g_t.float(), w_t.float())
    for g_t, w_t in zip(got.cols_t, weighted.cols_t, strict=True):
        assert torch.equal(g_t.float(), w_t.float())
    with pytest.raises(ValueError, match="unweighted rows need rowwise or blockwise"):
        quantize_both(x, E4M3, Granularity.TENSORWISE, groups, source=RowSource(rows, weight, weighted_rows=False))


def test_quantize_both_refuses_a_row_source_of_the_wrong_kind():
    x = torch.randn(4, 128, device=default_device()).half()
    groups = RowGroups.equal(1, 8)
    with pytest.raises(ValueError, match="RowSource holds int32 rows"):
        quantize_both(x, E4M3, Granularity.ROWWISE, groups, source=RowSource(torch.zeros(8, dtype=torch.int64)))


def test_token_layout_maps_each_block_to_its_group_past_empty_groups():
    """Each 128-row block's group is the number of groups that end at or before it: empty groups are
    skipped, and the blocks past the last group (the slack and a grid's extra programs) find G."""
    device = default_device()
    lens = torch.tensor([0, 130, 0, 0, 5, 257, 0], dtype=torch.int64, device=device)
    layout = token_layout(group_offsets(lens), 12)
    assert layout.padded_offs.tolist() == [0, 0, 256, 256, 256, 384, 768, 768]
    assert layout.block_groups.tolist() == [1, 1, 4, 5, 5, 5, 7, 7, 7, 7, 7, 7]
