"""The static audit of a candidate: where it may write, and what its code may not do.

`write_scope` lists changed paths outside the manifest's mutable files. `audit_source` walks the
AST of a mutable file and names each pattern that makes a benchmark lie (file, line, rule):

- identity-cache: id(), ._version, or .data_ptr() anywhere but an alignment (`% 16`) or aliasing
  (`==`) check: the makings of a cache that returns stale results when a training step refills
  the same buffers;
- memoization: functools.lru_cache / functools.cache on a function taking tensors;
- host-sync: .item(), .tolist(), .cpu() or torch.cuda.synchronize() (a sync in the hot path, and
  a way to specialize on group sizes);
- group-shape-assumption: an assert about group sizes or divisibility (right only on even splits);
- non-current-stream: creating or entering another CUDA stream (work the timer does not see);
- timer-tampering: assigning to torch/time/triton attributes, or importing the harness.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass

RULES: dict[str, str] = {
    "identity-cache": "caches keyed on id(), data_ptr() or _version of tensors",
    "memoization": "functools.lru_cache / cache memoizing calls over tensors",
    "host-sync": ".item(), .tolist(), .cpu() or torch.cuda.synchronize() in kernel code",
    "group-shape-assumption": "asserts that groups are equal-sized or block-aligned",
    "non-current-stream": "launching work on a stream other than the current one",
    "timer-tampering": "touching timers, torch.cuda.synchronize or the harness",
}
GROUP_NAMES = ("group_lens", "group_offs", "offs", "lens", "groups")


@dataclass(frozen=True, order=True)
class Finding:
    file: str
    line: int
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.rule} ({self.detail})"


def write_scope(changed: Iterable[str], allowed: Iterable[str]) -> list[str]:
    """Changed paths a candidate may not touch."""
    allowed = set(allowed)
    return sorted(p for p in changed if p not in allowed)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _alignment_or_alias_check(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """data_ptr() in `p % 16`, `p & 15` (alignment) or `a.data_ptr() == b.data_ptr()` (aliasing)."""
    parent = parents.get(node)
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Mod | ast.BitAnd):
        return True
    return isinstance(parent, ast.Compare) and all(isinstance(op, ast.Eq | ast.NotEq) for op in parent.ops)


def audit_source(file: str, source: str) -> list[Finding]:
    tree = ast.parse(source, filename=file)
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    findings: list[Finding] = []

    def add(node: ast.AST, rule: str, detail: str) -> None:
        findings.append(Finding(file, getattr(node, "lineno", 0), rule, detail))

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            attr = node.func.attr if isinstance(node.func, ast.Attribute) else name
            if name == "id":
                add(node, "identity-cache", "id()")
            elif attr == "data_ptr" and not _alignment_or_alias_check(node, parents):
                add(node, "identity-cache", "data_ptr() outside an alignment or aliasing check")
            elif attr in ("item", "tolist", "cpu") and not node.args:
                add(node, "host-sync", f".{attr}()")
            elif name.endswith("cuda.synchronize"):
                add(node, "host-sync", "torch.cuda.synchronize()")
            elif name.endswith(("cuda.Stream", "cuda.stream", "cuda.ExternalStream", "cuda.set_stream")):
                add(node, "non-current-stream", name)
        elif isinstance(node, ast.Attribute) and node.attr == "_version":
            add(node, "identity-cache", "._version")
        elif isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                if _dotted(target).split(".")[-1] in ("lru_cache", "cache"):
                    add(deco, "memoization", f"@{_dotted(target)} on {node.name}()")
        elif isinstance(node, ast.Assert):
            text = ast.unparse(node.test)
            if any(g in text for g in GROUP_NAMES) or "%" in text:
                add(node, "group-shape-assumption", f"assert {text[:60]}")
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                name = _dotted(target)
                if isinstance(target, ast.Attribute) and name.split(".")[0] in ("torch", "time", "triton"):
                    add(node, "timer-tampering", f"assigns {name}")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            for module in modules:
                if module.split(".")[0] == "harness" or module.startswith("triton.testing"):
                    add(node, "timer-tampering", f"imports {module}")
    return sorted(findings)
