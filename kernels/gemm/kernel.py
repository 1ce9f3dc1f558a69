"""gemm: a persistent TMA matmul kernel for Hopper, a strided pointer kernel for the rest, and their launcher.

`C = A @ B` with A [M, K] and B [K, N] given by their strides: the forward of a Linear layer (NT:
B is the weight [N, K], K-major), dgrad (NN) and wgrad (TN: A is a transposed view) need no copies.

The TMA kernel reads both operands through tensor descriptors (the copy engine loads whole tiles,
zero-filling past the edges, so no masks and no address math in the mainloop) and is persistent:
one program per SM walks the output tiles in grouped-M order. It also runs FP8 operands (both
K-major, as wgmma needs) with their scales applied in the epilogue or per 128-wide K block. TMA
wants a 16-byte aligned base and 16-byte multiple strides; where an operand breaks that (K = 61,
an odd slice), the pointer kernel takes over. fp32 accumulation everywhere.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.common.device import cdiv, check_same_device, persistent_programs
from kernels.common.launch import fast_launch
from kernels.common.scales import SCALE_NONE, Scales
from kernels.common.tiles import TileConfig, grouped_tile
from kernels.common.tma import bind_context, descriptor, tma_layout
from kernels.gemm.tuning import config_for

SUPPORTED_INPUT_DTYPES = (torch.bfloat16, torch.float16)
SUPPORTED_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@fast_launch
@triton.jit
def _matmul_tma_kernel(
    a_desc, b_desc, c_desc, sa_ptr, sb_ptr,
    M, N, K,
    stride_sam, stride_sak, stride_sbn, stride_sbk,
    A_K_MAJOR: tl.constexpr,
    B_K_MAJOR: tl.constexpr,
    SCALE: tl.constexpr,
    SB_OUT_DIV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
):
    """A K-major is stored [M, K] (else [K, M]); B K-major is stored [N, K] (else [K, N])."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_PROGRAMS, flatten=FLATTEN):
        pid_m, pid_n = grouped_tile(tile, num_m, num_n, GROUP_M)
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        if SCALE != 0:
            rows = row0 + tl.arange(0, BLOCK_M)
            cols = col0 + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(k_tiles):
            k0 = kb * BLOCK_K
            a = a_desc.load([row0, k0]) if A_K_MAJOR else a_desc.load([k0, row0]).T
            b = b_desc.load([col0, k0]).T if B_K_MAJOR else b_desc.load([k0, col0])
            if SCALE == 2:  # blockwise: promote each K block's product with its own scales
                sa = tl.load(sa_ptr + rows * stride_sam + kb * stride_sak, mask=rows < M, other=0.0)
                if SB_OUT_DIV % BLOCK_N == 0:  # the tile lies in one 128-wide weight block: one scale, one multiply
                    sb = tl.load(sb_ptr + (col0 // SB_OUT_DIV) * stride_sbn + kb * stride_sbk)
                    acc += tl.dot(a, b) * (sa * sb)[:, None]
                else:
                    sb = tl.load(sb_ptr + (cols // SB_OUT_DIV) * stride_sbn + kb * stride_sbk, mask=cols < N,
                                 other=0.0)
                    acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
            else:
                acc = tl.dot(a, b, acc)
        if SCALE == 1:
            sa = tl.load(sa_ptr + rows * stride_sam, mask=rows < M, other=0.0)
            sb = tl.load(sb_ptr + (cols // SB_OUT_DIV) * stride_sbn, mask=cols < N, other=0.0)
            acc = acc * sa[:, None] * sb[None, :]
        c_desc.store([row0, col0], acc.to(c_desc.dtype))


@fast_launch
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
    """The fallback for operands TMA cannot describe: masked pointer loads, one program per tile."""
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


def _descriptor(t: torch.Tensor, k_major: bool, rows_block: int, k_block: int) -> TensorDescriptor:
    """A descriptor over the operand's storage: [rows, K] when K-major, else [K, rows]."""
    if k_major:
        return descriptor(t, [rows_block, k_block])
    return descriptor(t.t(), [k_block, rows_block])


def launch_tma(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, cfg: TileConfig, scales: Scales | None = None,
    flatten: bool | None = None,
) -> torch.Tensor:
    """`out = a @ b` (times the scales) on the TMA kernel; every tensor must pass `tma_layout`, out row-major.

    `flatten` merges the tile loop into the K loop, so that the next tile's loads overlap this tile's
    epilogue. By default on, except under per-K-block promotion, where it measured 5-15% slower
    (H100/H200, docs/performance.md).
    """
    a_k_major, b_k_major = tma_layout(a), not tma_layout(b)
    return _launch_tma(_descriptor(a, a_k_major, cfg.BLOCK_M, cfg.BLOCK_K),
                       _descriptor(b.t(), b_k_major, cfg.BLOCK_N, cfg.BLOCK_K), a_k_major, b_k_major,
                       a.shape[0], b.shape[1], a.shape[1], out, cfg, scales, flatten)


def launch_tma_k_major(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, cfg: TileConfig, scales: Scales | None = None
) -> torch.Tensor:
    """`out = a @ b^T` on the TMA kernel, a [M, K] and b [N, K] both with rows TMA reads (`tma_layout` True),
    out row-major: launch_tma(a, b.t(), ...) without the views and layout tests it would make again (the FP8
    Linear's forward and dgrad ask every step, their callers having tested the layouts)."""
    return _launch_tma(descriptor(a, [cfg.BLOCK_M, cfg.BLOCK_K]), descriptor(b, [cfg.BLOCK_N, cfg.BLOCK_K]), True,
                       True, a.shape[0], b.shape[0], a.shape[1], out, cfg, scales)


def _launch_tma(
    a_desc: TensorDescriptor, b_desc: TensorDescriptor, a_k_major: bool, b_k_major: bool, M: int, N: int, K: int,
    out: torch.Tensor, cfg: TileConfig, scales: Scales | None, flatten: bool | None = None,
) -> torch.Tensor:
    """launch_tma's launch, given its operands' descriptors (see _descriptor) and layouts."""
    per_k_block = scales is not None and scales.per_k_block
    if per_k_block and cfg.BLOCK_K != 128:
        raise ValueError(f"blockwise scaling needs BLOCK_K=128, got {cfg.BLOCK_K}")
    tiles = cdiv(M, cfg.BLOCK_M) * cdiv(N, cfg.BLOCK_N)
    programs = persistent_programs(out.device, tiles)
    s = scales or Scales(a_desc.base, (0, 0), a_desc.base, (0, 0, 0))  # pointers an unscaled launch never reads
    bind_context(out.device)
    _matmul_tma_kernel[(programs,)](
        a_desc, b_desc, descriptor(out, [cfg.BLOCK_M, cfg.BLOCK_N]),
        s.a, s.b,
        M, N, K,
        *s.a_strides, *s.b_strides[1:],
        A_K_MAJOR=a_k_major, B_K_MAJOR=b_k_major,
        SCALE=SCALE_NONE if scales is None else scales.mode, SB_OUT_DIV=s.b_out_div,
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M,
        FLATTEN=not per_k_block if flatten is None else flatten, NUM_PROGRAMS=programs,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def launch_pointer(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, cfg: TileConfig) -> torch.Tensor:
    """`out = a @ b` on the pointer kernel: any strides."""
    (M, K), N = a.shape, b.shape[1]
    grid = (cdiv(M, cfg.BLOCK_M) * cdiv(N, cfg.BLOCK_N),)
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
    if K == 0:
        return out.zero_()
    if out.stride(0) == 1 and out.stride(1) != 1:
        # A column-major out (wgrad into a transposed view): compute out^T = b^T @ a^T so stores stay row-major.
        matmul(b.t(), a.t(), out=out.t(), config=config)
        return out

    cfg = config or config_for(M, N, K)
    if None not in (tma_layout(a), tma_layout(b)) and tma_layout(out) is True:
        return launch_tma(a, b, out, cfg)
    return launch_pointer(a, b, out, cfg)
