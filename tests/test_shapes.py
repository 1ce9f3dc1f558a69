import pytest

from harness.errors import UserError
from harness.shapes import PRESETS, Shape, load_shapes, split_tokens


def test_llama3_presets_have_the_model_projections():
    dims = {s.label: s.dims for s in load_shapes("dense_gemm", "llama3-8b")}
    assert dims["llama3-8b/qkv/t4096"] == {"B": 1, "M": 4096, "N": 6144, "K": 4096}
    assert dims["llama3-8b/gate_up/t8192"] == {"B": 1, "M": 8192, "N": 28672, "K": 4096}
    assert dims["llama3-8b/down/t4096"] == {"B": 1, "M": 4096, "N": 4096, "K": 14336}
    assert dims["llama3-8b/lm_head/t8192"] == {"B": 1, "M": 8192, "N": 128256, "K": 4096}
    mla = {s.label: s.dims for s in load_shapes("dense_gemm", "deepseek-v3-dense")}
    assert mla["deepseek-v3-dense/kv_b/t4096"] == {"B": 1, "M": 4096, "N": 32768, "K": 512}
    big = {s.label: s.dims for s in load_shapes("dense_gemm", "llama3-70b")}
    assert big["llama3-70b/qkv/t8192"]["N"] == 10240 and big["llama3-70b/o/t4096"]["K"] == 8192


def test_moe_presets_cover_cases_ep_sizes_and_skews():
    shapes = load_shapes("grouped_gemm", "deepseek-v3")
    labels = [s.label for s in shapes]
    assert "deepseek-v3/gateup/ep32/m4096/uniform" in labels
    anchor = next(s for s in shapes if s.label == "deepseek-v3/gateup/ep32/m4096/uniform")
    assert anchor.dims == {"B": 8, "M": 4096, "N": 4096, "K": 7168}
    down = next(s for s in shapes if s.label == "deepseek-v3/down/ep8/m512/uniform")
    assert down.dims == {"B": 32, "M": 512, "N": 7168, "K": 2048}
    for skew in ("topk", "hot", "empty"):
        assert any(label.endswith(skew) for label in labels)
    for model in PRESETS["grouped_gemm"]:
        for s in load_shapes("grouped_gemm", model):
            assert len(s.group_lens) == s.dims["B"] and s.dims["M"] == sum(s.group_lens) // s.dims["B"]


@pytest.mark.parametrize("groups", [2, 8, 32])
def test_skew_distributions(groups):
    total = groups * 1000
    uniform = split_tokens(total, groups, "uniform")
    assert sum(uniform) == total and max(uniform) - min(uniform) <= 1
    hot = split_tokens(total, groups, "hot", seed=3)
    assert sum(hot) == total and max(hot) >= total / 2
    empty = split_tokens(total, groups, "empty", seed=4)
    assert sum(empty) == total and empty.count(0) >= max(1, groups // 4)
    topk = split_tokens(total, groups, "topk", seed=5)
    assert max(topk) <= 1.25 * total / groups + 1 and sum(topk) <= total
    assert split_tokens(total, groups, "hot", seed=3) == hot  # seeded: reproducible


def test_yaml_shape_file(tmp_path):
    path = tmp_path / "shapes.yaml"
    path.write_text(
        "- {label: square, M: 256, N: 256, K: 256}\n"
        "- {label: one-hot, B: 4, M: 25, N: 64, K: 32, group_lens: [100, 0, 0, 0]}\n"
    )
    square, one_hot = load_shapes("dense_gemm", str(path))
    assert square.dims == {"M": 256, "N": 256, "K": 256}
    assert one_hot.group_lens == (100, 0, 0, 0)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("- {label: x, M: 0, N: 4, K: 4}\n", "field 'shapes.0.dims.M'"),
        ("- {label: x, B: 2, M: 5, N: 4, K: 4, group_lens: [1, 2, 3]}\n", "group_lens has 3 entries"),
        ("- {label: x, M: 4, N: 4, K: 4}\n- {label: x, M: 8, N: 4, K: 4}\n", "repeated"),
        ("shapes: [\n", "not valid YAML"),
    ],
)
def test_bad_yaml_is_one_clear_error(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=match):
        load_shapes("dense_gemm", str(path))


def test_unknown_preset_names_the_choices():
    with pytest.raises(UserError, match=r"unknown shape preset 'llama4'.*smoke"):
        load_shapes("dense_gemm", "llama4")


def test_shape_accepts_nested_dims():
    assert Shape(label="x", dims={"M": 1, "N": 2, "K": 3}).dims["K"] == 3
