"""The op registry: every `kernels/<op>/spec.py` that defines `SPEC`, discovered by name."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

import kernels
from harness.errors import UserError
from kernels.common.opspec import OpSpec


def op_names() -> list[str]:
    """Names of the op packages under kernels/ that have a spec module."""
    return sorted(
        info.name
        for info in pkgutil.iter_modules(kernels.__path__)
        if info.ispkg and importlib.util.find_spec(f"kernels.{info.name}.spec") is not None
    )


def get_spec(name: str) -> OpSpec:
    if name not in op_names():
        raise UserError(f"unknown op '{name}' (registered: {', '.join(op_names()) or 'none'})")
    spec = getattr(importlib.import_module(f"kernels.{name}.spec"), "SPEC", None)
    if not isinstance(spec, OpSpec) or spec.name != name:
        raise UserError(f"kernels/{name}/spec.py must define SPEC, an OpSpec named '{name}'")
    return spec


def all_specs() -> list[OpSpec]:
    return [get_spec(name) for name in op_names()]
