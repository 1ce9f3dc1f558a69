"""An op's tuning.py as data: its TUNABLE_SPACE and TUNED_TABLE literals read without importing the
module (the campaign's tree, not a stale import), and the TUNED_TABLE literal rewritten in place, one
bucket a line, so that a diff shows exactly the buckets a round changed."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.manifest import Manifest


def tuning_file(manifest: Manifest) -> str:
    """The campaign's tuned table, relative to its checkout: an op's kernels/<op>/tuning.py, or the file an
    external target names as `tuned_table`."""
    return manifest.tuned_table or f"kernels/{manifest.op}/tuning.py"


def tuning_module(root: Path, manifest: Manifest) -> ModuleType:
    """The tuned table's module, for its `buckets_for(dims, variant)`, `shape_class(dims)` and `fits(config)`,
    loaded from the checkout's file as it is now: the search rewrites it round by round, and `buckets_for`
    names the split entries its table holds (an import of turbo-opt's own `kernels.<op>.tuning` would keep the
    table as the process first read it, and a layer split off in round 2 would still map to its bucket)."""
    path = root / tuning_file(manifest)
    spec = importlib.util.spec_from_file_location(f"turbo_opt_tuned_table_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _assignment(tree: ast.Module, name: str) -> ast.Assign | ast.AnnAssign:
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node
    raise ValueError(f"no top-level assignment to {name}")


def read_tuning(path: Path) -> tuple[dict[str, tuple[int, ...]], dict[str, dict[str, int]]]:
    """TUNABLE_SPACE and TUNED_TABLE as the file on disk holds them (literals, read without importing)."""
    tree = ast.parse(path.read_text())
    space = ast.literal_eval(_assignment(tree, "TUNABLE_SPACE").value)
    table = ast.literal_eval(_assignment(tree, "TUNED_TABLE").value)
    return space, table


def rewrite_table(path: Path, table: dict[str, dict[str, int]]) -> None:
    """Replace the TUNED_TABLE literal in `path`, one bucket a line, leaving the rest untouched."""
    source = path.read_text()
    node = _assignment(ast.parse(source), "TUNED_TABLE")
    lines = source.splitlines(keepends=True)
    head = lines[node.lineno - 1].split("=", 1)[0].rstrip()
    body = "".join(f"    {json.dumps(bucket)}: {json.dumps(cfg)},\n" for bucket, cfg in table.items())
    new = f"{head} = {{\n{body}}}\n"
    path.write_text("".join(lines[: node.lineno - 1]) + new + "".join(lines[node.end_lineno :]))
