"""Compile the attention forward for Hopper (sm_90) on a machine without a GPU, with Triton's own ptxas:
`python -m tests.hopper_compile` prints, for the bf16 forward and the FP8 forward at each head dim, what
the PTX holds (wgmma instructions, and of those the E4M3 ones; mma.sync, Ampere's fallback), and the
E4M3 conversions in the kernels that quantize q, k and v (dense, and packed into the sequence-major
layout). Run with TRITON_INTERPRET=0 (kernels/__init__ switches the interpreter on where no GPU is)."""

from __future__ import annotations

import json

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.attention.kernel import QUANTIZE_ROWS, _fwd_kernel, _head_amax_kernel, _head_cast_kernel
from kernels.attention.tuning import config_for
from kernels.common.fp8 import FORMAT_ARGS

HOPPER = GPUTarget("cuda", 90, 32)


def _ptx(kernel, types: dict[str, str], constants: dict[str, object], num_warps: int = 4,
         num_stages: int = 3) -> str:
    """The PTX of `kernel` with these argument types (its pointers 16-byte aligned) and constexprs, every
    other argument an i32."""
    fn = kernel.kernel
    signature = dict.fromkeys(fn.arg_names, "i32") | types | dict.fromkeys(constants, "constexpr")
    index = fn.arg_names.index
    source = ASTSource(fn, signature, constexprs={(index(k),): v for k, v in constants.items()},
                       attrs={(index(n),): [["tt.divisibility", 16]] for n, t in types.items() if t.startswith("*")})
    return triton.compile(source, target=HOPPER, options={"num_warps": num_warps, "num_stages": num_stages}).asm["ptx"]


def compile_forward(fp8: bool, head_dim: int) -> dict[str, int]:
    """The causal dense forward as `forward_into` launches it: 16-byte aligned tensors, unit innermost
    strides (v's sequence stride for FP8: quantize_heads lays it out sequence-major)."""
    cfg = config_for("fwd_fp8" if fp8 else "fwd", head_dim, head_dim)
    types = dict.fromkeys(("Q", "K", "V"), "*fp8e4nv" if fp8 else "*bf16") | {
        "O": "*bf16", "LSE": "*fp32", "cu_seqlens_q": "*i32", "cu_seqlens_k": "*i32", "Q_SCALE": "*fp32",
        "K_SCALE": "*fp32", "V_SCALE": "*fp32", "qk_scale": "fp32"}
    constants = {"HEAD_DIM_QK": head_dim, "HEAD_DIM_V": head_dim, "BLOCK_DQK": head_dim, "BLOCK_DV": head_dim,
                 "BLOCK_M": cfg.BLOCK_M, "BLOCK_N": cfg.BLOCK_N, "VARLEN": False, "CAUSAL": True, "WINDOW": False,
                 "FP8": fp8, **FORMAT_ARGS[torch.float8_e4m3fn], "EMULATE": False,
                 "stride_qd": 1, "stride_kd": 1, "stride_od": 1, ("stride_vs" if fp8 else "stride_vd"): 1}
    ptx = _ptx(_fwd_kernel, types, constants, cfg.num_warps, cfg.num_stages)
    return {"wgmma": ptx.count("wgmma.mma_async"), "wgmma_e4m3": ptx.count("e4m3.e4m3"),
            "mma_sync": ptx.count("mma.sync")}


def compile_quantization(packed: bool) -> dict[str, int]:
    """The amax and cast kernels of quantize_heads at d128: bf16 in, E4M3 out (sequence-major when packed)."""
    tile = {"HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_S": QUANTIZE_ROWS, "VARLEN": packed, "stride_xd": 1}
    amax = _ptx(_head_amax_kernel, {"X": "*bf16", "AMAX": "*fp32", "SEQ": "*i32"}, tile)
    cast = _ptx(_head_cast_kernel, {"X": "*bf16", "Q": "*fp8e4nv", "AMAX": "*fp32", "SEQ": "*i32"},
                tile | {("stride_qs" if packed else "stride_qd"): 1, **FORMAT_ARGS[torch.float8_e4m3fn],
                        "EMULATE": False, "EPS": 1e-12})
    return {"atomics": amax.count("atom.global") + amax.count("red.global"), "cvt_e4m3": cast.count("e4m3x2")}


if __name__ == "__main__":
    found = {f"{'fp8' if fp8 else 'bf16'}-d{d}": compile_forward(fp8, d)
             for fp8, d in ((False, 128), (True, 64), (True, 128), (True, 256))}
    found |= {f"quantize-{'packed' if packed else 'dense'}": compile_quantization(packed) for packed in (False, True)}
    print(json.dumps(found))
