"""The static audit of a candidate: where it may write, and what its code may not do.

`write_scope` lists changed paths outside the manifest's mutable files. `audit_source` walks the
AST of a mutable file and names each pattern that makes a benchmark lie (file, line, rule). It
follows indirection: imports are resolved to what they name, aliases (`ev = torch.cuda.Event`,
`import torch.cuda as c`, `x = getattr(torch, "cuda")`) to what they stand for, and a forbidden
module is found wherever an attribute chain passes through it (`torch.jit._script.inspect`,
`triton.runtime.jit.os`). The rules:

- forbidden-import: kernel files import only `__future__`, torch, triton (not triton.testing), math,
  dataclasses, enum, typing, collections, itertools, functools, operator, numbers and kernels;
  anything else not classed below (pickle, pathlib, io, json, random, ...), and open();
- concurrency: threading, _thread, concurrent, multiprocessing, subprocess, asyncio, os, signal,
  sched, queue: work started here finishes after the call returns, behind the timer's back;
- introspection: inspect, traceback, sys, gc, types, dis (and the debuggers and profilers), frame
  and traceback attributes (`f_back`, `f_locals`, `tb_frame`, `_getframe`, ...), breakpoint():
  code that looks at who is calling it (the harness's timer on the stack) can behave differently;
- indirection: importlib, builtins, ctypes, pkgutil, runpy, code (and marshal, imp, ...); eval,
  exec, compile, __import__, globals, vars, locals, setattr, delattr; getattr (and
  operator.attrgetter / methodcaller) with a computed name or a constant naming a dunder, a frame
  attribute or a forbidden module; any dunder name or attribute but `__name__`, `__doc__` and the
  module's own `__all__`: spellings that reach what the other rules refuse without naming it;
- timer-tampering: time, timeit, triton.testing, torch.utils.benchmark, the harness or the agent;
  assigning to (or deleting) an attribute of anything imported or an alias of it (monkeypatching
  torch, triton, the clock or another kernel module); CUDA events; CUDA-graph capture state
  (code that behaves differently while captured);
- identity-cache: id(), hash(), ._version, .untyped_storage(), .storage(), ._cdata, weakref, or
  .data_ptr() anywhere but an alignment check (`p % 16`, `p & 15`) or an aliasing check
  (`a.data_ptr() == b.data_ptr()`): the makings of a cache that returns stale results when a
  training step refills the same buffers;
- memoization: functools.lru_cache / cache / cached_property, however imported or applied;
- host-sync: .item(), .tolist(), .cpu(), any .synchronize() (torch.cuda's, a stream's, an
  event's): a sync in the hot path, and a way to specialize on group sizes;
- group-shape-assumption: an assert about group sizes or divisibility (right only on even splits);
- non-current-stream: creating or entering another CUDA stream (work the timer does not see).
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

RULES: dict[str, str] = {
    "forbidden-import": "importing a module outside the kernel allowlist (torch, triton, math, kernels, ...)",
    "concurrency": "threads, executors, processes, os or signals: work that outlives the call",
    "introspection": "inspecting the call stack, frames, tracebacks, sys or gc",
    "indirection": "importlib, builtins, eval/exec, getattr/setattr by name, dunders: reaching code unnamed",
    "timer-tampering": "touching timers, CUDA events, graph capture state, the harness, or imported modules",
    "identity-cache": "caches keyed on id(), hash(), data_ptr(), storage or _version of tensors, or weakrefs",
    "memoization": "functools.lru_cache / cache / cached_property memoizing calls over tensors",
    "host-sync": ".item(), .tolist(), .cpu() or .synchronize() in kernel code",
    "group-shape-assumption": "asserts that groups are equal-sized or block-aligned",
    "non-current-stream": "launching work on a stream other than the current one",
}
GROUP_NAMES = ("group_lens", "group_offs", "offs", "lens", "groups")

ALLOWED_MODULES = frozenset({
    "__future__", "torch", "triton", "math", "dataclasses", "enum", "typing", "collections", "itertools",
    "functools", "operator", "numbers", "kernels",
})
# What a module of this name reaches, wherever it appears: imported, or an attribute on a chain.
MODULE_RULES: dict[str, str] = {
    **dict.fromkeys(("threading", "_thread", "concurrent", "multiprocessing", "subprocess", "asyncio", "os", "posix",
                     "nt", "signal", "sched", "queue"), "concurrency"),
    **dict.fromkeys(("inspect", "traceback", "sys", "gc", "types", "dis", "pdb", "bdb", "cProfile", "tracemalloc",
                     "faulthandler"), "introspection"),
    **dict.fromkeys(("importlib", "builtins", "ctypes", "pkgutil", "runpy", "code", "codeop", "imp", "_imp",
                     "marshal", "zipimport"), "indirection"),
    **dict.fromkeys(("time", "timeit", "harness", "agent"), "timer-tampering"),
    **dict.fromkeys(("weakref", "_weakref"), "identity-cache"),
    **dict.fromkeys(("pickle", "shelve", "socket", "io", "pathlib", "json", "tempfile", "shutil"), "forbidden-import"),
}
# Submodules of allowed packages that are refused all the same.
PREFIX_RULES: dict[str, str] = {
    "triton.testing": "timer-tampering",
    "torch.utils.benchmark": "timer-tampering",
    "torch.utils.weak": "identity-cache",
}
BUILTIN_RULES: dict[str, str] = {
    **dict.fromkeys(("eval", "exec", "compile", "__import__", "globals", "vars", "locals", "setattr", "delattr"),
                    "indirection"),
    "breakpoint": "introspection",
    "open": "forbidden-import",
    "id": "identity-cache",
    "hash": "identity-cache",
}
FRAME_ATTRS = frozenset({
    "f_back", "f_locals", "f_globals", "f_builtins", "f_code", "f_trace", "tb_frame", "tb_next", "gi_frame",
    "cr_frame", "ag_frame", "_getframe", "_current_frames",
})
IDENTITY_ATTRS = frozenset({"data_ptr", "_version", "untyped_storage", "storage", "_cdata"})
ALLOWED_DUNDERS = frozenset({"__name__", "__doc__"})
STREAM_NAMES = frozenset({"Stream", "stream", "set_stream", "ExternalStream", "StreamContext"})
CAPTURE_NAMES = frozenset({"is_current_stream_capturing", "CUDAGraph", "graph", "make_graphed_callables"})
MEMOIZERS = frozenset({"functools.lru_cache", "functools.cache", "functools.cached_property"})
NAME_GETTERS = frozenset({"operator.attrgetter", "operator.methodcaller"})
# Passes over the file's assignments to follow aliases of aliases.
ALIAS_PASSES = 8


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


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__") and len(name) > 4


def _attr_rule(name: str) -> tuple[str, str] | None:
    """The rule an attribute of this name breaks, on whatever object (None: none)."""
    if _dunder(name) and name not in ALLOWED_DUNDERS:
        return "indirection", f"dunder attribute {name}"
    if name in FRAME_ATTRS:
        return "introspection", f"frame attribute {name}"
    if name in IDENTITY_ATTRS:
        return "identity-cache", f".{name}"
    if name in MODULE_RULES:
        return MODULE_RULES[name], f"reaches module {name}"
    if name == "synchronize":
        return "host-sync", ".synchronize()"
    return None


def _path_rule(path: str) -> tuple[str, str] | None:
    """The rule a resolved dotted path (`torch.cuda.Event`, `functools.cache`) breaks."""
    for prefix, rule in PREFIX_RULES.items():
        if path == prefix or path.startswith(prefix + "."):
            return rule, f"reaches {prefix}"
    parts = path.split(".")
    for part in parts:
        if part in MODULE_RULES:
            return MODULE_RULES[part], f"{path} reaches module {part}"
    if path in MEMOIZERS:
        return "memoization", path
    if parts[0] != "torch":
        return None
    if parts[-1] in STREAM_NAMES:
        return "non-current-stream", path
    if parts[-1] == "Event":
        return "timer-tampering", f"{path} (a timer)"
    if parts[-1] in CAPTURE_NAMES:
        return "timer-tampering", f"{path} (CUDA-graph capture state)"
    if parts[-1] == "synchronize":
        return "host-sync", path
    return None


def _import_paths(node: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, str]]:
    """(local name, the dotted path it binds) of an import; relative imports keep their leading dots."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield (alias.asname, alias.name) if alias.asname else (alias.name.split(".")[0], alias.name)
        return
    base = "." * node.level + (node.module or "")
    for alias in node.names:
        joined = alias.name if not base else base + alias.name if base.endswith(".") else f"{base}.{alias.name}"
        yield alias.asname or alias.name, joined


def _root_path(local: str, path: str, node: ast.Import | ast.ImportFrom) -> str:
    """What a plain `import a.b.c` binds to its local name `a` is `a`, not `a.b.c`."""
    return local if isinstance(node, ast.Import) and local == path.split(".")[0] else path


class _Resolver:
    """Names and attribute chains resolved to the dotted path they stand for, through imports and aliases."""

    def __init__(self, tree: ast.AST) -> None:
        self.aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for local, path in _import_paths(node):
                    if local != "*":
                        self.aliases[local] = _root_path(local, path, node)
        for _ in range(ALIAS_PASSES):
            if not self._follow_assignments(tree):
                break

    def _follow_assignments(self, tree: ast.AST) -> bool:
        changed = False
        for node in ast.walk(tree):
            for name, value in _bindings(node):
                path = self.resolve(value)
                if path and self.aliases.get(name) != path:
                    self.aliases[name], changed = path, True
        return changed

    def resolve(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        if _is_builtin_call(node, "getattr") and len(node.args) >= 2 and _constant_str(node.args[1]):
            base = self.resolve(node.args[0])
            return f"{base}.{node.args[1].value}" if base else None
        return None

    def root_imported(self, node: ast.AST) -> str | None:
        """The imported (or aliased) name at the root of an attribute/subscript/call chain."""
        while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
            node = node.func if isinstance(node, ast.Call) else node.value
        return node.id if isinstance(node, ast.Name) and node.id in self.aliases else None


def _bindings(node: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """(name, value) pairs a statement binds: `x = v`, `x: T = v`, `(x := v)`, `a, b = u, v`."""
    if isinstance(node, ast.Assign):
        pairs = [(t, node.value) for t in node.targets]
    elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value is not None:
        pairs = [(node.target, node.value)]
    else:
        return
    while pairs:
        target, value = pairs.pop()
        if isinstance(target, ast.Name):
            yield target.id, value
        elif isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List) \
                and len(target.elts) == len(value.elts):
            pairs += zip(target.elts, value.elts, strict=True)


def _constant_str(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _is_builtin_call(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name


def _data_ptr_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "data_ptr"


def _alignment_or_alias_check(call: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """data_ptr() in `p % 16`, `p & 15` (alignment) or `a.data_ptr() == b.data_ptr()` (aliasing): not a
    comparison with a remembered pointer, which is a cache key."""
    parent = parents.get(call)
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Mod | ast.BitAnd):
        return isinstance(parent.right, ast.Constant)
    return (isinstance(parent, ast.Compare) and all(isinstance(op, ast.Eq | ast.NotEq) for op in parent.ops)
            and all(_data_ptr_call(side) for side in [parent.left, *parent.comparators]))


def _module_level(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            return False
    return True


def _import_rule(path: str, relative: bool, packages: frozenset[str]) -> tuple[str, str] | None:
    rule = _path_rule(path)
    if rule:
        return rule[0], f"imports {path}"
    if not relative and path.split(".")[0] not in ALLOWED_MODULES | packages:
        return "forbidden-import", f"imports {path}"
    return None


def _name_getter_rule(call: ast.Call) -> tuple[str, str] | None:
    """getattr(obj, name) and operator.attrgetter / methodcaller: a computed name reaches anything, a
    constant one is judged as the attribute it names."""
    names = call.args[1:2] if _is_builtin_call(call, "getattr") else call.args
    if not names or not all(_constant_str(n) for n in names):
        return "indirection", "attribute looked up by a computed name"
    for name in names:
        for part in name.value.split("."):
            rule = _attr_rule(part)
            if rule:
                return rule[0], f"looks up {name.value!r}: {rule[1]}"
    return None


def new_findings(file: str, before: str, after: str, packages: frozenset[str] = frozenset()) -> list[Finding]:
    """The findings of `after` that `before` (the file at the best commit) did not have: a candidate answers
    for what it adds, not for what an external code base already does (compared by rule and detail, since
    an edit moves the lines)."""
    known = Counter((f.rule, f.detail) for f in audit_source(file, before, packages)) if before else Counter()
    added = []
    for finding in audit_source(file, after, packages):
        if known[(finding.rule, finding.detail)] > 0:
            known[(finding.rule, finding.detail)] -= 1
        else:
            added.append(finding)
    return added


def audit_source(file: str, source: str, packages: frozenset[str] = frozenset()) -> list[Finding]:
    """Every finding in `source`; `packages` are the target's own top-level packages, which its kernel
    files may import besides the allowlist."""
    tree = ast.parse(source, filename=file)
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    resolver = _Resolver(tree)
    found: dict[tuple[int, str], Finding] = {}

    def add(node: ast.AST, rule_detail: tuple[str, str] | None) -> None:
        if rule_detail:
            line = getattr(node, "lineno", 0)
            found.setdefault((line, rule_detail[0]), Finding(file, line, *rule_detail))

    def called(node: ast.AST) -> ast.Call | None:
        parent = parents.get(node)
        return parent if isinstance(parent, ast.Call) and parent.func is node else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            relative = isinstance(node, ast.ImportFrom) and node.level > 0
            for _, path in _import_paths(node):
                add(node, _import_rule(path.removesuffix(".*"), relative, packages))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            path = resolver.resolve(node)
            if path:
                add(node, _path_rule(path))
                if path in NAME_GETTERS:
                    call = called(node)
                    add(node, _name_getter_rule(call) if call else ("indirection", f"{path} passed around"))
            elif node.id == "getattr":
                call = called(node)
                add(node, _name_getter_rule(call) if call else ("indirection", "getattr passed around"))
            elif node.id in BUILTIN_RULES:
                add(node, (BUILTIN_RULES[node.id], f"{node.id}()"))
            elif _dunder(node.id) and node.id not in ALLOWED_DUNDERS \
                    and not (node.id == "__all__" and _module_level(node, parents)):
                add(node, ("indirection", f"dunder name {node.id}"))
        elif isinstance(node, ast.Name) and _dunder(node.id) and node.id != "__all__":
            add(node, ("indirection", f"binds dunder name {node.id}"))
        elif isinstance(node, ast.Attribute):
            call = called(node)
            if not (node.attr == "data_ptr" and call and _alignment_or_alias_check(call, parents)):
                add(node, _attr_rule(node.attr))
            path = resolver.resolve(node)
            if path:
                add(node, _path_rule(path))
                if path in NAME_GETTERS:
                    add(node, _name_getter_rule(call) if call else ("indirection", f"{path} passed around"))
            if isinstance(node.ctx, ast.Store | ast.Del):
                root = resolver.root_imported(node.value)
                if root:
                    add(node, ("timer-tampering", f"assigns {ast.unparse(node)}: {root} is {resolver.aliases[root]}"))
            if call and node.attr in ("item", "tolist", "cpu") and not call.args:
                add(node, ("host-sync", f".{node.attr}()"))
        elif isinstance(node, ast.Assert):
            text = ast.unparse(node.test)
            if any(g in text for g in GROUP_NAMES) or "%" in text:
                add(node, ("group-shape-assumption", f"assert {text[:60]}"))
    return sorted(found.values())
