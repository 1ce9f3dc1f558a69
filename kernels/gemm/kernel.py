"""gemm: one strided Triton matmul kernel and its launcher.

`C = A @ B` for 2-D operands of any strides: a transposed operand is a view with swapped strides,
so the forward (NT for a Linear weight), dgrad (NN) and wgrad (TN) all run through this kernel with
no copies. fp32 accumulation; edges masked, so M, N and K need not divide the block sizes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.device import check_same_device
from kernels.common.tiles import TileConfig, grouped_tile
from kernels.gemm.tuning import config_for

SUPPORTED_INPUT_DTYPES = (torch.bfloat16, torch.float16)
SUPPORTED_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    # Tile bases in int64: row * stride can pass 2**31 elements on large operands.
    row0 = (pid_m * BLOCK_M).to(tl.int64)
    col0 = (pid_n * BLOCK_N).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = (pid_m * BLOCK_M + offs_m) < M
    mask_n = (pid_n * BLOCK_N + offs_n) < N

    a_ptrs = a_ptr + row0 * stride_am + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + col0 * stride_bn + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c_ptrs = c_ptr + row0 * stride_cm + col0 * stride_cn + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    config: TileConfig | None = None,
) -> torch.Tensor:
    """`out = a @ b` for a [M, K] and b [K, N] of any strides; writes into `out` (any strides) if given."""
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"gemm: operands must be 2-D, got a {tuple(a.shape)} and b {tuple(b.shape)}")
    if a.dtype not in SUPPORTED_INPUT_DTYPES or b.dtype != a.dtype:
        raise ValueError(f"gemm: operands must both be bf16 or fp16, got a {a.dtype} and b {b.dtype}")
    (M, K), (Kb, N) = a.shape, b.shape
    if Kb != K:
        raise ValueError(f"gemm: inner dims differ: a is {tuple(a.shape)}, b is {tuple(b.shape)} (K {K} != {Kb})")
    if out is None:
        out_dtype = out_dtype or a.dtype
        if out_dtype not in SUPPORTED_OUT_DTYPES:
            raise ValueError(f"gemm: out_dtype must be bf16, fp16 or fp32, got {out_dtype}")
        out = torch.empty((M, N), device=a.device, dtype=out_dtype)
    elif out.shape != (M, N) or out.dtype not in SUPPORTED_OUT_DTYPES:
        raise ValueError(f"gemm: out must be [{M}, {N}] of bf16/fp16/fp32, got {tuple(out.shape)} {out.dtype}")
    check_same_device(a=a, b=b, out=out)
    if M == 0 or N == 0:
        return out
    if out.stride(0) == 1 and out.stride(1) != 1:
        # A column-major out (wgrad into a transposed view): compute out^T = b^T @ a^T so stores stay row-major.
        matmul(b.t(), a.t(), out=out.t(), config=config)
        return out

    cfg = config or config_for(M, N, K)
    grid = (triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N),)
    _matmul_kernel[grid](
        a, b, out,
        M, N, K,
        a.stride(0), a.stride(1),
        b.stride(0), b.stride(1),
        out.stride(0), out.stride(1),
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out
