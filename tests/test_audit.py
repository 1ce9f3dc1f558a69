"""The static audit: each rule on small snippets, in its direct and indirect spellings, and the real
kernel files clean."""

from pathlib import Path

import pytest

from agent.audit import RULES, audit_source, new_findings
from harness.files import REPO_ROOT
from harness.registry import all_specs


def rules_of(source: str) -> set[str]:
    return {f.rule for f in audit_source("kernels/gemm/kernel.py", source)}


@pytest.mark.parametrize(("source", "rule"), [
    # concurrency: threads, executors, processes, os and signals, however imported or reached
    ("import threading\nthreading.Thread(target=f).start()", "concurrency"),
    ("from concurrent.futures import ThreadPoolExecutor", "concurrency"),
    ("import _thread", "concurrency"),
    ("import torch.multiprocessing as mp", "concurrency"),
    ("from os import environ", "concurrency"),
    ("import asyncio", "concurrency"),
    ("import triton\nenv = triton.runtime.jit.os.environ", "concurrency"),
    ("import torch\nq = torch.os.getpid()", "concurrency"),
    # introspection: the call stack, frames, tracebacks, sys, gc
    ("import inspect\ninspect.stack()", "introspection"),
    ("import sys\nsys._getframe(1)", "introspection"),
    ("from traceback import extract_stack", "introspection"),
    ("import gc\ngc.get_referrers(x)", "introspection"),
    ("import torch\nframes = torch.jit._script.inspect.stack()", "introspection"),
    ("def f(e):\n    return e.tb_frame.f_back.f_locals", "introspection"),
    ("def f(frame):\n    return frame.f_globals", "introspection"),
    ("breakpoint()", "introspection"),
    # indirection: importlib, builtins, eval/exec, getattr/setattr by name, dunders
    ("import importlib\nt = importlib.import_module('harness.timing')", "indirection"),
    ("import builtins", "indirection"),
    ("import ctypes", "indirection"),
    ("m = __import__('time')", "indirection"),
    ("eval('1 + 1')", "indirection"),
    ("exec(code_text)", "indirection"),
    ("g = globals()", "indirection"),
    ("v = vars(torch)", "indirection"),
    ("setattr(obj, 'x', 1)", "indirection"),
    ("delattr(obj, 'x')", "indirection"),
    ("import functools\nset_it = functools.partial(setattr, obj)", "indirection"),
    ("name = 'sync'\ngetattr(obj, name)", "indirection"),
    ("g = getattr", "indirection"),
    ("import torch\ngetattr(torch, '__dict__')", "indirection"),
    ("import operator\nf = operator.attrgetter(name)", "indirection"),
    ("d = torch.__dict__", "indirection"),
    ("b = __builtins__['eval']", "indirection"),
    ("subs = object.__subclasses__()", "indirection"),
    ("code = f.__code__", "indirection"),
    ("object.__setattr__(x, 'y', 1)", "indirection"),
    # timer-tampering: timers, the harness, and assigning to anything imported or an alias of it
    ("import time", "timer-tampering"),
    ("from timeit import default_timer", "timer-tampering"),
    ("import triton.testing", "timer-tampering"),
    ("from triton import testing", "timer-tampering"),
    ("from harness.timing import Timer", "timer-tampering"),
    ("import agent.measure", "timer-tampering"),
    ("import torch\ntorch.cuda.Event.elapsed_time = lambda s, e: 0.001", "timer-tampering"),
    ("import torch\nev = torch.cuda.Event\nev.elapsed_time = f", "timer-tampering"),
    ("from torch.cuda import Event\nEvent.x = 1", "timer-tampering"),
    ("import torch.cuda as c\nc.synchronize = lambda *a: None", "timer-tampering"),
    ("import torch\nc = getattr(torch, 'cuda')\nc.synchronize = f", "timer-tampering"),
    ("import triton\ntriton.knobs.runtime.interpret += 1", "timer-tampering"),
    ("import torch\ndel torch.cuda.synchronize", "timer-tampering"),
    ("from kernels.common import device\ndevice.interpreter_mode = lambda: True", "timer-tampering"),
    ("import torch\nstart = torch.cuda.Event(enable_timing=True)", "timer-tampering"),
    ("import torch\nif torch.cuda.is_current_stream_capturing():\n    pass", "timer-tampering"),
    # identity-cache: tensor identity, storage, weak references
    ("k = id(a)", "identity-cache"),
    ("k = hash(a)", "identity-cache"),
    ("key = ident(a)\nident = id", "identity-cache"),
    ("k = a.data_ptr()", "identity-cache"),
    ("if a.data_ptr() == _LAST:\n    pass", "identity-cache"),
    ("k = a._version", "identity-cache"),
    ("k = a.untyped_storage()", "identity-cache"),
    ("k = a.storage()", "identity-cache"),
    ("k = a._cdata", "identity-cache"),
    ("import weakref", "identity-cache"),
    ("k = getattr(a, 'data_ptr')()", "identity-cache"),
    # memoization, however spelled
    ("import functools\n@functools.lru_cache(maxsize=None)\ndef f(x):\n    return x", "memoization"),
    ("from functools import cache as remember\n@remember\ndef f(x):\n    return x", "memoization"),
    ("import functools\nf = functools.cache(g)", "memoization"),
    # host syncs and other streams, as before, now through aliases too
    ("n = lens.tolist()", "host-sync"),
    ("import torch\ntorch.cuda.current_stream().synchronize()", "host-sync"),
    ("from torch.cuda import synchronize as wait\nwait()", "host-sync"),
    ("import torch\ns = torch.cuda.Stream()", "non-current-stream"),
    ("from torch.cuda import stream\nwith stream(s):\n    pass", "non-current-stream"),
    ("assert (group_lens % 128 == 0).all()", "group-shape-assumption"),
    # anything else outside the allowlist
    ("import pickle", "forbidden-import"),
    ("from pathlib import Path", "forbidden-import"),
    ("import random", "forbidden-import"),
    ("import numpy as np", "forbidden-import"),
    ("with open('cache.bin', 'wb') as f:\n    pass", "forbidden-import"),
])
def test_each_rule_is_found_whatever_the_spelling(source, rule):
    assert rule in RULES
    assert rule in rules_of(source), audit_source("k.py", source)


@pytest.mark.parametrize("source", [
    "from __future__ import annotations\nimport math\nimport torch\nimport triton\nimport triton.language as tl",
    "from collections.abc import Mapping\nfrom dataclasses import dataclass, field\nfrom enum import Enum",
    "import functools\nimport itertools\nimport operator\nimport numbers\nfrom typing import Any",
    "from kernels.common.tma import tma_layout\nfrom . import tuning",
    "if t.data_ptr() % 16:\n    pass",
    "same = a.data_ptr() == b.data_ptr()",
    "import torch\ns = torch.cuda.current_stream()\nx = torch.empty(4, device='cuda')",
    "import torch\nc = getattr(torch, 'cuda')",
    "import operator\nkey = operator.attrgetter('BLOCK_M')",
    "__all__ = ['gemm']",
    "def f(ctx, a):\n    ctx.trans = True\n    ctx.save_for_backward(a)\n    return type(a).__name__",
    "import torch\nout = torch.empty(3)\nout.zero_()\nt = torch.trace(out.view(1, 3)[:, :1])",
])
def test_ordinary_kernel_code_is_clean(source):
    assert audit_source("kernels/gemm/kernel.py", source) == []


def test_findings_name_file_line_and_rule():
    (finding,) = audit_source("kernels/gemm/kernel.py", "import torch\n\nx = 1\nimport threading\n")
    assert (finding.file, finding.line, finding.rule) == ("kernels/gemm/kernel.py", 4, "concurrency")
    assert str(finding).startswith("kernels/gemm/kernel.py:4: concurrency (imports threading")


# Files the audit would flag that no campaign can change (no spec lists them as mutable), each for what
# it does on purpose: the package's bootstrap sets TRITON_INTERPRET before any kernel module loads; the
# referee's references and loop baselines read sizes on the host (group sizes; the MoE router's reference
# its config; the MoE layer's float64 experts their token counts); the MoE layer module calls nn.Module's
# __init__ (super().__init__(), a dunder).
REFEREE_SIDE = {
    "kernels/__init__.py": {"concurrency"},
    "kernels/grouped_gemm/spec.py": {"host-sync"},
    "kernels/grouped_gemm_fp8/spec.py": {"host-sync"},
    "kernels/moe/specs.py": {"host-sync"},
    "kernels/moe/reference.py": {"host-sync"},
    "kernels/moe/mlp.py": {"indirection"},
    # the launches' descriptor memo (keyed on the address a descriptor encodes) and Triton's native launcher,
    # reached through the closure Triton wraps it in
    "kernels/common/launch.py": {"identity-cache", "indirection"},
}


def test_real_kernel_files_are_clean():
    mutable = {path for spec in all_specs() for path in spec.mutable_files}
    files = {p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "kernels").rglob("*.py")} | mutable
    assert not mutable & set(REFEREE_SIDE)
    for path in sorted(files):
        rules = {f.rule for f in audit_source(path, Path(REPO_ROOT / path).read_text())}
        assert rules == REFEREE_SIDE.get(path, set()), (path, rules)


def test_a_candidate_answers_for_the_findings_it_adds_not_for_the_code_base():
    """An external code base may already sync the host or import its own helpers: only what the candidate
    adds is charged, compared by rule and detail (an edit above them moves their lines)."""
    before = "import torch\nfrom liger_kernel.ops.utils import calculate_settings\n\ndef f(x):\n    return x.item()\n"
    moved = "import torch\nfrom liger_kernel.ops.utils import calculate_settings\n\nBLOCK = 2\n\ndef f(x):\n" \
            "    return x.item()\n"
    assert new_findings("k.py", before, moved, frozenset({"liger_kernel"})) == []
    assert [f.rule for f in new_findings("k.py", before, moved)] == []  # the import was there before
    added = moved + "\ndef g(x):\n    return x.item()\n"
    assert [f.rule for f in new_findings("k.py", before, added, frozenset({"liger_kernel"}))] == ["host-sync"]
    own_import = moved + "from liger_kernel.ops.utils import compare_version\n"
    assert new_findings("k.py", before, own_import, frozenset({"liger_kernel"})) == []
    assert [f.rule for f in new_findings("k.py", before, own_import)] == ["forbidden-import"]
