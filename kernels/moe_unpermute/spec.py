"""The OpSpec of moe_unpermute: defined with the other MoE specs in kernels/moe/specs.py."""

from kernels.moe.specs import UNPERMUTE as SPEC

__all__ = ["SPEC"]
