"""The OpSpec of moe_mlp: defined with the other MoE specs in kernels/moe/specs.py."""

from kernels.moe.specs import MLP as SPEC

__all__ = ["SPEC"]
