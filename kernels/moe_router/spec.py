"""The OpSpec of moe_router: defined with the other MoE specs in kernels/moe/specs.py."""

from kernels.moe.specs import ROUTER as SPEC

__all__ = ["SPEC"]
