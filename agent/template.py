"""Manifests in the field names of Primus-Turbo's kernel-optimize template, read as turbo-opt's.

A template manifest (it has `target_op`) is mapped field by field: `target_op` -> op, `target_backend` ->
backend, `target_gpu` -> gpu, `primary_metric` ("Combined Step TFLOPS", "Forward GB/s", ...) -> step /
forward / backward, `target_shapes` (entries may carry model and op names) -> shapes,
`performance_target` ("1.2x", "+20%") -> target_speedup, `git_branch` (a name or none) -> branch,
`git_commit` -> git_commit, and the target fields (kernel_source, test_command, benchmark_command,
quick_command, representative_shapes, execution_mode, max_iterations) as they are. A kernel that is
not one of turbo-opt's ops lives in the git checkout holding the manifest unless `repo` says where.
What turbo-opt does not act on (target_lang, project_skill, created, unknown fields) is kept in
`metadata` with a note, never refused.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import git

from harness.registry import op_names

# Template field -> turbo-opt field, for those that carry over as they are.
SAME = ("kernel_source", "test_command", "benchmark_command", "quick_command", "rebuild_command",
        "representative_shapes", "execution_mode", "max_iterations", "repo", "campaign", "variant", "dtype",
        "proposer", "csv_schema", "git_commit")
RENAMED = {"target_op": "op", "target_gpu": "gpu"}
# Recorded for the report; turbo-opt has nothing to do with them.
KEPT = ("target_lang", "project_skill", "created")
# Translated by from_template, each in its own way.
TRANSLATED = ("target_backend", "primary_metric", "performance_target", "target_shapes", "git_branch")
METRIC = re.compile(r"^\s*(forward|backward|combined step|step)\s+(tflops|gb/s)\s*$", re.IGNORECASE)
SPEEDUP = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*x|\+?(\d+(?:\.\d+)?)\s*%)\s*$", re.IGNORECASE)


def is_template(data: object) -> bool:
    return isinstance(data, dict) and "target_op" in data


def metric_of(text: str) -> str | None:
    """"Combined Step TFLOPS" -> step, "Forward GB/s" -> forward; None if the words are not a metric."""
    found = METRIC.match(str(text))
    if found is None:
        return None
    which = found.group(1).lower()
    return "step" if which.endswith("step") else which


def speedup_of(value: object) -> float | None:
    """1.2, "1.2x" or "+20%" -> 1.2; None for anything else."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    found = SPEEDUP.match(str(value))
    if found is None:
        return None
    return float(found.group(1)) if found.group(1) else 1.0 + float(found.group(2)) / 100.0


def shape_of(entry: dict[str, Any]) -> dict[str, Any]:
    """A template shape entry as turbo-opt's: integer fields are dims; names (model, op...) label it."""
    dims = {k: v for k, v in entry.items() if isinstance(v, int) and not isinstance(v, bool)}
    names = [str(v) for k, v in entry.items() if k != "label" and isinstance(v, str)]
    label = entry.get("label") or "/".join([*names, "x".join(str(v) for v in dims.values())])
    shape: dict[str, Any] = {"label": str(label), **dims}
    if "group_lens" in entry:
        shape["group_lens"] = entry["group_lens"]
    return shape


def _checkout_of(where: Path) -> Path | None:
    try:
        return Path(git.Repo(where, search_parent_directories=True).working_tree_dir)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return None


def from_template(data: dict[str, Any], manifest_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """turbo-opt's manifest data for a template manifest, and notes on what was kept aside or assumed."""
    out: dict[str, Any] = {ours: data[theirs] for theirs, ours in RENAMED.items() if theirs in data}
    out |= {key: data[key] for key in SAME if key in data}
    notes: list[str] = []
    metadata: dict[str, Any] = {key: data[key] for key in KEPT if key in data}
    if "target_backend" in data:
        out["backend"] = str(data["target_backend"]).lower()
    if isinstance(out.get("kernel_source"), str):
        out["kernel_source"] = [out["kernel_source"]]
    if "primary_metric" in data:
        metric = metric_of(data["primary_metric"])
        if metric is None:
            notes.append(f"primary_metric '{data['primary_metric']}' is not a metric turbo-opt knows "
                         "(Forward/Backward/Combined Step TFLOPS or GB/s): the combined step is used")
            metadata["primary_metric"] = data["primary_metric"]
        else:
            out["primary_metric"] = metric
    if "performance_target" in data:
        speedup = speedup_of(data["performance_target"])
        if speedup is not None and speedup > 1.0:
            out["target_speedup"] = speedup
        else:
            notes.append(f"performance_target '{data['performance_target']}' is not a speedup (1.2x, +20%): "
                         "kept as metadata, no stop condition set from it")
            metadata["performance_target"] = data["performance_target"]
    if "target_shapes" in data:
        out["shapes"] = [shape_of(entry) for entry in data["target_shapes"]]
        if any(set(entry) - {"label", "group_lens"} - {k for k, v in entry.items() if isinstance(v, int)}
               for entry in data["target_shapes"]):
            metadata["target_shapes"] = data["target_shapes"]
    if "git_branch" in data:
        branch = data["git_branch"]
        out["branch"] = "none" if branch in (None, False) or str(branch).lower() == "none" else str(branch)
    unknown = sorted(set(data) - set(SAME) - set(RENAMED) - set(KEPT) - set(TRANSLATED))
    for key in unknown:
        metadata[key] = data[key]
    if unknown:
        notes.append(f"fields turbo-opt does not act on, kept as metadata: {', '.join(unknown)}")
    if "repo" not in out and out.get("op") not in op_names():
        checkout = _checkout_of(manifest_dir)
        if checkout is not None:
            out["repo"] = str(checkout)
            notes.append(f"'{out.get('op')}' is not a turbo-opt op: the kernel is taken to live in {checkout}, "
                         "the git checkout holding the manifest")
    if out.get("op") in op_names() and "repo" not in out and out.get("kernel_source"):
        out["mutable_files"] = out.pop("kernel_source")
    out["metadata"] = metadata
    return out, notes
