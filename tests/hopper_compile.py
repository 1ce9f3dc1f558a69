"""Compile the attention kernels for Hopper (sm_90a) on a machine without a GPU, with Triton's own ptxas:
`python -m tests.hopper_compile` prints, for the FP8 forward at each head dim, and for the bf16 forward
and both backward passes at d128 (dK/dV also adding dQ atomically), with their tile streams loaded by
pointers and through tensor descriptors (TMA, the tuned table's knob), what the PTX holds (wgmma
instructions, and of those the E4M3 ones; mma.sync, Ampere's fallback; TMA loads and reductions; atomics) and what
ptxas reports (registers, bytes spilled), and the E4M3 conversions in the kernels that quantize q, k
and v (dense, and packed into the sequence-major layout); the amax kernels' atomics (theirs and
quantize_both's: relaxed, fenced); for the warp-specialized blockwise FP8 GEMM (Gluon), M-grouped and as
the wgrad's token reduction, whether ptxas serializes its wgmmas; and the warp-specialized attention kernels
(the forward, the dQ pass, the fused backward). The last line is a JSON object, with the Triton version
under "triton". Run with TRITON_INTERPRET=0 (kernels/__init__ switches the interpreter on where no GPU is);
with another Triton first on PYTHONPATH (the GPU's), it compiles with that one."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

from kernels.attention.hopper_ws import (
    BWD_STAGES,
    FP8_RESCALE_ABOVE,
    HEAD_DIMS,
    RESCALE_ABOVE,
    _attention_bwd_dq_ws_kernel,
    _attention_bwd_ws_kernel,
    _attention_fwd_ws_kernel,
    bwd_dq_chunk,
    bwd_key_block,
)
from kernels.attention.kernel import (
    QUANTIZE_ROWS,
    _bwd_dkdv_kernel,
    _bwd_dq_kernel,
    _fwd_kernel,
    _head_amax_kernel,
    _head_cast_kernel,
)
from kernels.attention.tuning import config_for
from kernels.common.blockwise_ws import _blockwise_ws_kernel
from kernels.common.fp8 import FORMAT_ARGS, _amax_both_kernel
from kernels.grouped_gemm.kernel import _grouped_mm_kernel, _grouped_mm_vark_kernel

HOPPER = GPUTarget("cuda", 90, 32)
# The FP8 warp-specialized forward as the tuned table launches it at each head dim: (head dim, keys a stage,
# stages, lazy rescale).
FP8_WS_LAUNCHES = tuple((d, cfg.WS_BLOCK_N, cfg.WS_STAGES, bool(cfg.LAZY))
                        for d, cfg in ((d, config_for("fwd_fp8", d, d)) for d in HEAD_DIMS))


def _ptx(kernel, types: dict[str, str], constants: dict[str, object], num_warps: int = 4,
         num_stages: int = 3, divisible: tuple[str, ...] = ()) -> str:
    """The PTX of `_compile`."""
    return _compile(kernel, types, constants, num_warps, num_stages, divisible).asm["ptx"]


def _compile(kernel, types: dict[str, str], constants: dict[str, object], num_warps: int = 4,
             num_stages: int = 3, divisible: tuple[str, ...] = ()):
    """`kernel` (Triton or Gluon) compiled for sm_90a with these argument types and constexprs, every other argument
    an i32, as a launch on the benchmarks' shapes specializes it: pointers 16-byte aligned and the strides
    that are no constexpr divisible by 16 (without that, Triton cannot vectorize the loads and pipelines no
    stages), and the `divisible` integer arguments too."""
    fn = kernel.kernel
    signature = dict.fromkeys(fn.arg_names, "i32") | types | dict.fromkeys(constants, "constexpr")
    index = fn.arg_names.index
    aligned = [n for n, t in signature.items()
               if t.startswith("*") or (t == "i32" and (n.startswith("stride_") or n in divisible))]
    source_type = GluonASTSource if fn.is_gluon() else ASTSource
    source = source_type(fn, signature, constexprs={(index(k),): v for k, v in constants.items()},
                         attrs={(index(n),): [["tt.divisibility", 16]] for n in aligned})
    return triton.compile(source, target=HOPPER, options={"num_warps": num_warps, "num_stages": num_stages})


def _ptxas_report(ptx: str) -> dict[str, int]:
    """Registers per thread and bytes spilled, as Triton's ptxas (the newest it ships) reports them for sm_90a."""
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    ptxas = next(p for p in (bin_dir / "ptxas-blackwell", bin_dir / "ptxas") if p.exists())
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "k.ptx").write_text(ptx)
        done = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", "k.ptx", "-o", "k.cubin"], cwd=tmp,
                              capture_output=True, text=True, check=True)
    log = done.stdout + done.stderr
    return {"registers": int(re.search(r"Used (\d+) registers", log).group(1)),
            "spill_bytes": int(re.search(r"(\d+) bytes spill stores", log).group(1)),
            # C7514: an instruction touches a wgmma's accumulator while it may be in flight, so ptxas waits
            # for each wgmma before the next (a warp-specialized kernel then runs at 0.6-0.7x)
            "wgmma_serialized": int("C7514" in log)}


def _instructions(ptx: str) -> dict[str, int]:
    """Counts of PTX instructions; `shuffles`: indexed warp shuffles, what a layout conversion between threads
    emits (the FP8 forward's P into the E4M3 operand, where v's key order should make it need none);
    `byte_permutes`: prmt, what unpacking E4M3 bytes into registers of their own and packing them again emits (the
    warp-specialized FP8 forward's P, carried to the next block's PV product as bytes, took 192)."""
    return {"wgmma": ptx.count("wgmma.mma_async"), "wgmma_e4m3": ptx.count("e4m3.e4m3"),
            "mma_sync": ptx.count("mma.sync"), "tma_loads": ptx.count("cp.async.bulk.tensor"),
            "tma_reduces": ptx.count("cp.reduce.async.bulk.tensor"), "shuffles": ptx.count("shfl.sync.idx"),
            "byte_permutes": ptx.count("prmt.b32")}


def compile_forward(fp8: bool, head_dim: int, tma: bool = False) -> dict[str, int]:
    """The causal dense forward as `forward_into` launches it: 16-byte aligned tensors, unit innermost
    strides (v's sequence stride for FP8: quantize_heads lays it out sequence-major); with `tma`, q, k
    and v read through tensor descriptors of the table's tiles (FP8's v: [head dim, keys] boxes)."""
    cfg = config_for("fwd_fp8" if fp8 else "fwd", head_dim, head_dim)
    element = "fp8e4nv" if fp8 else "bf16"
    types = dict.fromkeys(("Q", "K", "V"), f"*{element}") | {
        "O": "*bf16", "LSE": "*fp32", "cu_seqlens_q": "*i32", "cu_seqlens_k": "*i32", "Q_SCALE": "*fp32",
        "K_SCALE": "*fp32", "V_SCALE": "*fp32", "qk_scale": "fp32"}
    if tma:
        v_box = [head_dim, cfg.BLOCK_N] if fp8 else [cfg.BLOCK_N, head_dim]
        types |= {"Q_DESC": f"tensordesc<{element}[{cfg.BLOCK_M}, {head_dim}]>",
                  "K_DESC": f"tensordesc<{element}[{cfg.BLOCK_N}, {head_dim}]>",
                  "V_DESC": f"tensordesc<{element}[{v_box[0]}, {v_box[1]}]>"}
    constants = {"HEAD_DIM_QK": head_dim, "HEAD_DIM_V": head_dim, "BLOCK_DQK": head_dim, "BLOCK_DV": head_dim,
                 "BLOCK_M": cfg.BLOCK_M, "BLOCK_N": cfg.BLOCK_N, "VARLEN": False, "CAUSAL": True, "WINDOW": False,
                 "FP8": fp8, **FORMAT_ARGS[torch.float8_e4m3fn], "EMULATE": False, "TMA": tma,
                 "stride_qd": 1, "stride_kd": 1, "stride_od": 1, ("stride_vs" if fp8 else "stride_vd"): 1}
    ptx = _ptx(_fwd_kernel, types, constants, cfg.num_warps, cfg.num_stages)
    return _instructions(ptx) | _ptxas_report(ptx)


def compile_backward(pass_: str, head_dim: int, tma: bool, dq_atomic: bool = False) -> dict[str, int]:
    """The causal dense bf16 backward pass (`bwd_kv` or `bwd_q`) as `backward_into` launches it with the
    table's config; `dq_atomic`: the dK/dV pass adding dQ into fp32 (its atomic adds counted, or with
    `tma` its TMA reductions), with query blocks of 64 rows and 2 stages (`fits` wants 64 or more)."""
    cfg = config_for(pass_, head_dim, head_dim)
    if dq_atomic:
        cfg = dataclasses.replace(cfg, BLOCK_M=64, num_stages=2, DQ_ATOMIC=1)
    kernel, tiles = ((_bwd_dkdv_kernel, {"Q_DESC": cfg.BLOCK_M, "DO_DESC": cfg.BLOCK_M}) if pass_ == "bwd_kv"
                     else (_bwd_dq_kernel, {"K_DESC": cfg.BLOCK_N, "V_DESC": cfg.BLOCK_N}))
    types = dict.fromkeys(("Q", "K", "V", "DO", "DK", "DV", "DQ"), "*bf16") | {
        "LSE": "*fp32", "DELTA": "*fp32", "DQ_ACC": "*fp32", "cu_seqlens_q": "*i32", "cu_seqlens_k": "*i32",
        "qk_scale": "fp32", "sm_scale": "fp32"}
    if tma:
        types |= {name: f"tensordesc<bf16[{rows}, {head_dim}]>" for name, rows in tiles.items()}
        types |= {"DQ_DESC": f"tensordesc<fp32[{cfg.BLOCK_M}, {head_dim}]>"} if dq_atomic else {}
    names = kernel.kernel.arg_names
    constants = {"HEAD_DIM_QK": head_dim, "HEAD_DIM_V": head_dim, "BLOCK_DQK": head_dim, "BLOCK_DV": head_dim,
                 "BLOCK_M": cfg.BLOCK_M, "BLOCK_N": cfg.BLOCK_N, "VARLEN": False, "CAUSAL": True, "WINDOW": False,
                 "TMA": tma} | {name: 1 for name in names if name.startswith("stride_") and name.endswith("d")}
    if pass_ == "bwd_kv":
        constants |= {"DQ_ATOMIC": dq_atomic, "DQ_REDUCE": tma and dq_atomic}
    ptx = _ptx(kernel, {k: v for k, v in types.items() if k in names}, constants, cfg.num_warps, cfg.num_stages)
    atomic_adds = len(re.findall(r"(?:red|atom)\.global\S*\.add(?:\.v\d)?\.f32", ptx))
    return _instructions(ptx) | {"atomic_adds": atomic_adds} | _ptxas_report(ptx)


def compile_quantization(packed: bool) -> dict[str, int]:
    """The amax and cast kernels of quantize_heads at d128: bf16 in, E4M3 out (sequence-major when packed)."""
    tile = {"HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_S": QUANTIZE_ROWS, "VARLEN": packed, "stride_xd": 1}
    amax = _ptx(_head_amax_kernel, {"X": "*bf16", "AMAX": "*fp32", "SEQ": "*i32"}, tile)
    cast = _ptx(_head_cast_kernel, {"X": "*bf16", "Q": "*fp8e4nv", "AMAX": "*fp32", "SCALE": "*fp32", "SEQ": "*i32"},
                tile | {("stride_qs" if packed else "stride_qd"): 1, **FORMAT_ARGS[torch.float8_e4m3fn],
                        "EMULATE": False, "EPS": 1e-12})
    return _atomics(amax) | {"cvt_e4m3": cast.count("e4m3x2")}


def _atomics(ptx: str) -> dict[str, int]:
    """Global atomics, those of them relaxed, and fences: an amax kernel's atomics are read by the next launch
    only, and Triton's default (acq_rel) fences each one (relaxed: quantize_both's amax pass with row maxima
    1.11-1.21x faster, H100)."""
    ops = re.findall(r"(?:atom|red)\.global\S*", ptx)
    return {"atomics": len(ops), "relaxed_atomics": sum(".relaxed." in op for op in ops),
            "fences": len(re.findall(r"\b(?:fence|membar)\.", ptx))}


def compile_rowwise_amax(rows: bool) -> dict[str, int]:
    """quantize_both's rowwise amax pass over groups of tokens (kernels/common/fp8.py), per (group, column)
    and, with `rows`, per row: its atomics."""
    types = {"x_ptr": "*bf16", "row_amax_ptr": "*fp32", "group_amax_ptr": "*fp32", "offs_ptr": "*i64",
             "padded_offs_ptr": "*i64", "block_groups_ptr": "*i32", "src_ptr": "*i32", "weight_ptr": "*fp32"}
    constants = {"ROWWISE": True, "ROWS": rows, "TENSOR_PER_GROUP": 0, "EQUAL_GROUPS": False, "BLOCK_T": 128,
                 "BLOCK_C": 128, "GLU": False, "GATHER": False, "WEIGHTED": False}
    return _atomics(_ptx(_amax_both_kernel, types, constants))


def compile_blockwise_ws(token_reduction: bool, accumulate: bool, block_n: int = 128,
                         stages: int = 4, c_type: str | None = None, per_k_block: bool = True) -> dict[str, int]:
    """The warp-specialized blockwise FP8 GEMM (128 x block_n tiles) as the ops launch it: M-grouped
    (the forward and the dgrad: A's scales [rows, K blocks], the weight's [G, N blocks, K blocks]) or the
    token reduction (the wgrad: both operands' scales [token blocks, rows]) into bf16, or adding into a
    main_grad (`c_type`, default an fp32 one); with the shared memory it takes (the H100 gives a CTA 227 KB).
    The M-grouped walk as the forward launches it, its consumers in turns (PING_PONG); without `per_k_block`,
    scaled in the epilogue (rowwise: A's scales [rows], the weight's [G, N])."""
    def descriptor(rows: int) -> str:
        return f"tensordesc<fp8e4nv[{rows}, 128],{gl.NVMMASharedLayout.get_default_for([rows, 128], gl.float8e4nv)!r}>"
    types = {"a_desc": descriptor(64), "b_desc": descriptor(block_n),
             "c_ptr": c_type or ("*fp32" if accumulate else "*bf16"), "sa_ptr": "*fp32", "sb_ptr": "*fp32",
             "offs_ptr": "*i64"}
    unit_strides = ({"stride_sam": 1, "stride_sbn": 1} if token_reduction or not per_k_block
                    else {"stride_sak": 1, "stride_sbk": 1})
    constants = {"BLOCK_N": block_n, "GROUP_M": 8, "STAGES": stages, "GROUPED": True,
                 "TOKEN_REDUCTION": token_reduction, "ACCUMULATE": accumulate, "NUM_PROGRAMS": 132,
                 "PING_PONG": not token_reduction, "PER_K_BLOCK": per_k_block} | unit_strides
    compiled = _compile(_blockwise_ws_kernel, types, constants)
    ptx = compiled.asm["ptx"]
    return _instructions(ptx) | _ptxas_report(ptx) | {"shared_bytes": compiled.metadata.shared}


def compile_grouped_epilogue(var_k: bool, block_n: int, num_warps: int, c_type: str, slices: int) -> dict[str, int]:
    """The grouped GEMM kernels (kernels/grouped_gemm/kernel.py) adding an FP8 rowwise product into C (`c_type`,
    a main_grad) as the wgrads launch them, 128 x block_n tiles through TMA, 3 stages, the epilogue in `slices`
    column slices: the variable-K kernel (the grouped wgrad) or the M-grouped one (the dense wgrad: one group,
    so its tile loop group by group)."""
    fp8 = "*fp8e4nv"
    common = {"SCALE": 1, "TMA": True, "ACCUMULATE": True, "EPILOGUE_SLICES": slices, "BLOCK_K": 128}
    if var_k:
        types = {"x_ptr": fp8, "y_ptr": fp8, "x_desc": "tensordesc<fp8e4nv[128, 128]>",
                 "y_desc": f"tensordesc<fp8e4nv[{block_n}, 128]>", "c_ptr": c_type, "offs_ptr": "*i64",
                 "sx_ptr": "*fp32", "sy_ptr": "*fp32"}
        constants = common | {"PADDED": True, "BLOCK_P": 128, "BLOCK_Q": block_n, "GROUP_P": 8, "stride_xt": 1,
                              "stride_yt": 1, "stride_sxp": 1, "stride_syq": 1}
        kernel = _grouped_mm_vark_kernel
    else:
        types = {"a_ptr": fp8, "b_ptr": fp8, "a_desc": "tensordesc<fp8e4nv[128, 128]>",
                 "b_desc": f"tensordesc<fp8e4nv[1, {block_n}, 128]>", "c_ptr": c_type, "offs_ptr": "*i64",
                 "padded_offs_ptr": "*i64", "block_groups_ptr": "*i32", "sa_ptr": "*fp32", "sb_ptr": "*fp32"}
        constants = common | {"B_K_MAJOR": True, "SB_OUT_DIV": 1, "BLOCK_M": 128, "BLOCK_N": block_n, "GROUP_M": 8,
                              "NUM_PROGRAMS": 132, "FLAT": False, "A_GATHER": False, "stride_bk": 1,
                              "stride_sam": 1, "stride_sbn": 1}
        kernel = _grouped_mm_kernel
    return _ptxas_report(_ptx(kernel, types, constants, num_warps, 3))


def compile_grouped_forward(a_gather: bool, output: str = "*bf16", stages: int = 3,
                            flat: bool = True) -> dict[str, int]:
    """The M-grouped kernel's FP8 rowwise forward as an MoE layer launches it (the tuned 128x256 tiles on 8 warps,
    `stages` stages, every group's tiles in one flattened loop or, not `flat`, group by group, B by TMA, the
    output's type `output`), with A by TMA or, `a_gather`, its rows read through an index (grouped_mm's a_rows):
    registers, spills and shared memory."""
    fp8 = "*fp8e4nv"
    types = {"a_ptr": fp8, "b_ptr": fp8, "b_desc": "tensordesc<fp8e4nv[1, 256, 128]>", "c_ptr": output,
             "offs_ptr": "*i64", "padded_offs_ptr": "*i64", "block_groups_ptr": "*i32", "sa_ptr": "*fp32",
             "sb_ptr": "*fp32", "a_rows_ptr": "*i32"}
    constants = {"SCALE": 1, "TMA": True, "ACCUMULATE": False, "EPILOGUE_SLICES": 1, "BLOCK_K": 128, "B_K_MAJOR": True,
                 "SB_OUT_DIV": 1, "BLOCK_M": 128, "BLOCK_N": 256, "GROUP_M": 8, "NUM_PROGRAMS": 132, "FLAT": flat,
                 "A_GATHER": a_gather, "stride_bk": 1, "stride_sam": 1, "stride_sbn": 1}
    if a_gather:
        constants["a_desc"] = None
    else:
        types["a_desc"] = "tensordesc<fp8e4nv[128, 128]>"
    kernel = _compile(_grouped_mm_kernel, types, constants, 8, stages, divisible=("N", "K"))
    return _ptxas_report(kernel.asm["ptx"]) | {"shared_bytes": kernel.metadata.shared}


def _tile_type(rows: int, head_dim: int, element: str = "bf16") -> str:
    """The type of a host descriptor of [rows, head_dim] tiles (bf16, fp8e4nv: the FP8 forward's, or fp32: the
    fused backward's dQ), as hopper_ws builds them."""
    gl_dtype = {"bf16": gl.bfloat16, "fp8e4nv": gl.float8e4nv, "fp32": gl.float32}[element]
    layout = gl.NVMMASharedLayout.get_default_for([rows, head_dim], gl_dtype)
    return f"tensordesc<{element}[{rows}, {head_dim}],{layout!r}>"


def compile_attention_ws(head_dim: int, block_n: int, stages: int, causal: bool, lazy: bool = True,
                         fp8: bool = False) -> dict[str, int]:
    """The warp-specialized attention forward (kernels/attention/hopper_ws.py) in bf16 or FP8 (E4M3 q, k and v,
    v's boxes [head dim, keys]), as forward_ws launches it: wgmmas (QK^T from shared memory, PV with P from
    registers), registers, spills, shared memory."""
    element = "fp8e4nv" if fp8 else "bf16"
    v_box = (head_dim, block_n) if fp8 else (block_n, head_dim)
    types = {"q_desc": _tile_type(64, head_dim, element), "k_desc": _tile_type(block_n, head_dim, element),
             "v_desc": _tile_type(*v_box, element), "o_ptr": "*bf16", "lse_ptr": "*fp32", "q_scale_ptr": "*fp32",
             "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32", "qk_scale": "fp32"}
    threshold = (FP8_RESCALE_ABOVE if fp8 else RESCALE_ABOVE) if lazy else -1.0
    constants = {"HEAD_DIM": head_dim, "BLOCK_N": block_n, "STAGES": stages, "CAUSAL": causal,
                 "RESCALE_ABOVE": threshold, "PERSISTENT": not causal, "FP8": fp8}
    compiled = _compile(_attention_fwd_ws_kernel, types, constants)
    ptx = compiled.asm["ptx"]
    return _instructions(ptx) | _ptxas_report(ptx) | {"shared_bytes": compiled.metadata.shared}


def compile_attention_dq_ws(head_dim: int, block_n: int, stages: int, causal: bool) -> dict[str, int]:
    """The warp-specialized dQ pass (kernels/attention/hopper_ws.py) in bf16, as backward_dq_ws launches it."""
    types = {"q_desc": _tile_type(64, head_dim), "k_desc": _tile_type(block_n, head_dim),
             "v_desc": _tile_type(block_n, head_dim), "do_desc": _tile_type(64, head_dim), "lse_ptr": "*fp32",
             "delta_ptr": "*fp32", "dq_ptr": "*bf16", "qk_scale": "fp32", "sm_scale": "fp32"}
    constants = {"HEAD_DIM": head_dim, "BLOCK_N": block_n, "STAGES": stages, "CAUSAL": causal}
    compiled = _compile(_attention_bwd_dq_ws_kernel, types, constants)
    ptx = compiled.asm["ptx"]
    return _instructions(ptx) | _ptxas_report(ptx) | {"shared_bytes": compiled.metadata.shared}


def compile_attention_bwd_ws(head_dim: int, causal: bool, persistent: bool = False) -> dict[str, int]:
    """The warp-specialized fused backward (kernels/attention/hopper_ws.py) in bf16, as backward_ws launches it
    (a CTA a tile, or `persistent`): wgmmas, TMA reductions of dQ, registers, spills, shared memory."""
    keys, dq_chunk = bwd_key_block(head_dim), bwd_dq_chunk(head_dim)
    types = {"q_desc": _tile_type(64, head_dim), "k_desc": _tile_type(keys, head_dim),
             "v_desc": _tile_type(keys, head_dim), "do_desc": _tile_type(64, head_dim),
             "dq_desc": _tile_type(64, dq_chunk, "fp32"), "lse_ptr": "*fp32", "delta_ptr": "*fp32",
             "dk_ptr": "*bf16", "dv_ptr": "*bf16", "tile_counter": "*i32", "qk_scale": "fp32", "sm_scale": "fp32"}
    constants = {"HEAD_DIM": head_dim, "KEYS": keys, "DQ_CHUNK": dq_chunk, "STAGES": BWD_STAGES, "CAUSAL": causal,
                 "PERSISTENT": persistent}
    compiled = _compile(_attention_bwd_ws_kernel, types, constants)
    ptx = compiled.asm["ptx"]
    return _instructions(ptx) | _ptxas_report(ptx) | {"shared_bytes": compiled.metadata.shared}


if __name__ == "__main__":
    found = {f"fp8-d{d}{'-tma' if tma else ''}": compile_forward(True, d, tma) for d in (64, 128, 256)
             for tma in (False, True)}
    found |= {f"bf16-d128-{'tma' if tma else 'pointers'}": compile_forward(False, 128, tma) for tma in (False, True)}
    found |= {f"{pass_}-d128-{'tma' if tma else 'pointers'}": compile_backward(pass_, 128, tma)
              for pass_ in ("bwd_kv", "bwd_q") for tma in (False, True)}
    found |= {f"bwd_kv-d128-{'tma' if tma else 'pointers'}-dq-atomic": compile_backward("bwd_kv", 128, tma, True)
              for tma in (False, True)}
    found |= {f"quantize-{'packed' if packed else 'dense'}": compile_quantization(packed) for packed in (False, True)}
    found |= {f"rowwise-amax{'-rows' if rows else ''}": compile_rowwise_amax(rows) for rows in (False, True)}
    found |= {f"blockwise-ws-{'wgrad' if token else 'm-grouped'}{'-accumulate' if acc else ''}":
              compile_blockwise_ws(token, acc) for token, acc in ((False, False), (True, False), (True, True))}
    found |= {f"blockwise-ws-m-grouped-256-s{stages}": compile_blockwise_ws(False, False, 256, stages)
              for stages in (3, 4)}
    found |= {f"ws-m-grouped-rowwise-{n}-s{stages}": compile_blockwise_ws(False, False, n, stages, None, False)
              for n, stages in ((128, 4), (256, 3), (256, 4))}
    found |= {f"blockwise-ws-wgrad-256{'-accumulate-bf16' if acc else ''}": compile_blockwise_ws(True, acc, 256, 3,
                                                                                                 "*bf16")
              for acc in (False, True)}
    found |= {f"attention-ws-d{d}-n{n}-s{stages}{'-causal' if causal else ''}":
              compile_attention_ws(d, n, stages, causal)
              for d, n, stages in ((128, 128, 2), (128, 64, 3), (64, 64, 4), (256, 64, 2)) for causal in (False, True)}
    found |= {f"attention-ws-fp8-d{d}{'-causal' if causal else ''}":
              compile_attention_ws(d, n, stages, causal, lazy, True)
              for d, n, stages, lazy in FP8_WS_LAUNCHES for causal in (False, True)}
    found |= {f"attention-dq-ws-d{d}{'-causal' if causal else ''}": compile_attention_dq_ws(d, 64, 3, causal)
              for d in (64, 128) for causal in (False, True)}
    found |= {f"attention-bwd-ws-d{d}{'-causal' if causal else ''}": compile_attention_bwd_ws(d, causal)
              for d in (64, 128, 256) for causal in (False, True)}
    found |= {f"attention-bwd-ws-d{d}-persistent{'-causal' if causal else ''}":
              compile_attention_bwd_ws(d, causal, True) for d in (64, 128, 256) for causal in (False, True)}
    print(json.dumps(found | {"triton": triton.__version__}))
