"""The OpSpec of moe_permute: defined with the other MoE specs in kernels/moe/specs.py."""

from kernels.moe.specs import PERMUTE as SPEC

__all__ = ["SPEC"]
