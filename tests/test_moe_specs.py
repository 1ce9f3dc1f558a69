"""The MoE ops as the harness sees them: registered by name (moe_permute, moe_unpermute, moe_router), benched
on the interpreter through every check (the baselines too), their rates in GB/s of the bytes they move,
frozen headers, and presets for the five models with skewed routing."""

import math

import pytest
import torch
import yaml

from agent.manifest import Manifest
from harness.files import REPO_ROOT
from harness.quick_test_bench import check_probe, prepare_bench, run_bench, write_bench
from harness.registry import get_spec, op_names
from harness.schema import (
    MOE_MLP_HEADER,
    MOE_PERMUTE_HEADER,
    MOE_ROUTER_HEADER,
    MOE_UNPERMUTE_HEADER,
    get_schema,
    read_summary,
)
from harness.shapes import MOE_LAYER_MODELS, load_shapes
from kernels.common.opspec import Problem
from kernels.moe.specs import skewed_ids

MOE_OPS = {"moe_permute": MOE_PERMUTE_HEADER, "moe_unpermute": MOE_UNPERMUTE_HEADER, "moe_router": MOE_ROUTER_HEADER,
           "moe_mlp": MOE_MLP_HEADER}
GBPS_OPS = ("moe_permute", "moe_unpermute", "moe_router")


def test_registered_with_frozen_schemas_gbps_for_the_memory_bound_ops():
    assert set(MOE_OPS) <= set(op_names()) and "moe" not in op_names()
    for name, header in MOE_OPS.items():
        spec = get_spec(name)
        schema = get_schema(spec.schema)
        assert schema.header == header and schema.outputs == spec.outputs
        assert schema.metric == ("GB/s" if name in GBPS_OPS else "TFLOPS")
        assert all(f.startswith("kernels/moe/") for f in spec.mutable_files)


@pytest.mark.parametrize("op", MOE_OPS)
def test_smoke_bench_passes_every_check_and_reports_its_rate(op, tmp_path):
    """GB/s = bytes moved / 1e9 a second for the memory-bound ops; TFLOPS of the expert GEMMs for moe_mlp."""
    spec = get_spec(op)
    shapes = load_shapes(spec.shape_family, "smoke")[-2:]
    run = run_bench(spec, shapes, shapes_source="smoke", repeats=1, warmup=0, compare_baselines=True)
    assert all(r.check == "PASS" for results in run.results.values() for r in results), \
        {name: [r.error for r in results] for name, results in run.results.items()}
    write_bench(run, tmp_path / "out.csv")
    summary = read_summary(tmp_path / "out.csv")
    assert summary.schema.name == spec.schema
    for shape, row in zip(shapes, summary.frame.itertuples(index=False), strict=True):
        dims = dict(zip(summary.schema.dims, row[1:1 + len(summary.schema.dims)], strict=True))
        problem = Problem(dims, run.dtype, run.timer.device)
        gbps = op in GBPS_OPS
        fwd_work, bwd_work = spec.bytes_moved(problem) if gbps else spec.flops(problem)
        unit, metric = (1e9, "GB/s") if gbps else (1e12, "TFLOPS")
        got = summary.frame.set_index("label").loc[shape.label]
        for work, direction in ((fwd_work, "Forward"), (bwd_work, "Backward")):
            rate = work / (got[f"{direction} Time (ms)"] * 1e-3) / unit
            assert got[f"{direction} {metric}"] == pytest.approx(rate, rel=1e-4)


@pytest.mark.parametrize("family", ["moe_tokens", "moe_router", "moe_mlp"])
def test_presets_of_the_five_models(family):
    assert set(MOE_LAYER_MODELS) == {"deepseek-v3", "qwen3-235b", "qwen3-30b", "gpt-oss-120b", "sonicmoe"}
    sonic = load_shapes(family, "sonicmoe")
    assert 32768 in {s.dims["T"] for s in sonic} and all(s.dims["E"] == 128 for s in sonic)
    for model in MOE_LAYER_MODELS:
        shapes = load_shapes(family, model)
        assert shapes and all(s.label.endswith("/skewed") for s in shapes)
    dsv3 = load_shapes(family, "deepseek-v3")[0].dims
    assert dsv3["E"] == (32 if family == "moe_mlp" else 256) and dsv3["topk"] == 8
    if family == "moe_router":
        assert (dsv3["n_group"], dsv3["topk_group"], dsv3["sigmoid"]) == (8, 4, 1)


def test_every_problem_routes_skewed_with_empty_experts(device):
    ids = skewed_ids(4096, 128, 8, torch.Generator(device=device).manual_seed(0), device)
    counts = torch.bincount(ids.reshape(-1), minlength=128)
    assert counts[: 128 // 8].float().mean() > 2 * counts[128 // 8:].float().mean()
    assert not bool(counts[-8:].any()) and math.isclose(float(counts.sum()), 4096 * 8)



def test_campaign_preset_for_the_permute_ops_validates():
    text = (REPO_ROOT / "campaigns/moe_permute-deepseek-v3.yaml").read_text()
    manifest = Manifest.model_validate(yaml.safe_load(text))
    assert manifest.op == "moe_permute" and manifest.files == ["kernels/moe/permute.py"]
    assert load_shapes("moe_tokens", manifest.shapes)


@pytest.mark.parametrize("op", GBPS_OPS)
def test_unannounced_probe_shapes_pass(op):
    """The ragged probes a campaign draws for the MoE families (odd sizes, one token, groups, paddings)."""
    spec = get_spec(op)
    run = prepare_bench(spec, load_shapes(spec.shape_family, "smoke")[:1], shapes_source="smoke", repeats=1,
                        warmup=0, probe_seed=11)
    assert len(run.probes) == 3 and run.probes[-1].dims["T"] == 1
    assert {probe.label: check_probe(run, probe) for probe in run.probes} == dict.fromkeys(
        (probe.label for probe in run.probes), None)
