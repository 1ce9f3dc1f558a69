"""The attention forward or backward alone, ours next to SDPA's cuDNN and FlashAttention-2 backends,
interleaved.

Each round times every variant once, back to back in an order of its own (passes_report.interleaved_rounds),
on the same inputs (L2 flushed before each call), so all see the same GPU state; the rounds' median is
reported, in TFLOPS (forward 4 B H Sq Sk D, halved when causal, flash-attn's count; backward 2.5x that) and as
a ratio to SDPA cuDNN. Forward variants: the Triton forward under the tuned table's bucket with WS off
(`triton`), and the warp-specialized Gluon one (kernels/attention/hopper_ws.py) at each key block:stages of
`--ws`, with its lazy rescale off and on as `--lazy` lists (` lazy`: on; the tuned table's LAZY knob) and,
non-causal, on its persistent grid or a CTA a tile as `--persistent` lists (` grid`: a CTA a tile). Backward
(`--pass bwd`): our whole backward (delta, dK/dV, dQ) with the dQ pass on the Triton kernel and, where they
serve the shape, on the warp-specialized one (`ws dq`) and as the fused warp-specialized backward
(`ws fused`); SDPA's from its own forward's graph. FP8 forward (`--pass fp8`): on E4M3 q, k and v quantized
once outside the timing, the Triton FP8 forward (`fp8 triton`) and the warp-specialized one at each `--ws` and
`--lazy` (`fp8 ws ...`), beside our bf16 forward as the tuned table runs it (`bf16`) and the FP8 forward with
its quantization of q, k and v in the call (`fp8 with quant`, the table's config: what `attention(...,
fp8_forward=True)` runs). For GQA, SDPA gets k and v repeated to the q heads outside its timing.

    python benchmarks/attention_ab.py --rounds 5 --csv attention_ab.csv
    python benchmarks/attention_ab.py --pass bwd --rounds 5 --csv attention_ab_bwd.csv
    python benchmarks/attention_ab.py --pass fp8 --ws 128:2 64:3 --lazy 1 --rounds 5
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from passes_report import interleaved_rounds, report
from torch.nn.attention import SDPBackend, sdpa_kernel

import kernels  # noqa: F401  (interpreter switch before triton loads)
from harness.timing import Timer
from kernels.attention import dense_shape, hopper_ws
from kernels.attention.kernel import LOG2E, backward_into, forward_into, quantize_qkv
from kernels.attention.tuning import config_for

# label: (B, S, Hq, Hkv, D, causal)
SHAPES = {"d128 2x8k h16": (2, 8192, 16, 16, 128, False), "d128 2x8k h16 causal": (2, 8192, 16, 16, 128, True),
          "d64 2x8k h16": (2, 8192, 16, 16, 64, False), "d64 2x8k h16 causal": (2, 8192, 16, 16, 64, True),
          "d256 2x8k h8": (2, 8192, 8, 8, 256, False), "d256 2x8k h8 causal": (2, 8192, 8, 8, 256, True),
          "llama3-8b 4x4k gqa causal": (4, 4096, 32, 8, 128, True)}


def fp8_variants(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 causal: bool, ws: list[tuple[int, int]], lazies: list[int]) -> dict[str, Callable[[], object]]:
    """The FP8 forward's variants (the module's docstring), on q, k and v quantized once here."""
    shape, scale, D = dense_shape(q, k, v), q.shape[-1] ** -0.5, q.shape[-1]
    (q8, k8, v8), scales = quantize_qkv(q, k, v, shape)
    fp8_shape = dense_shape(q8, k8, v8)
    triton_cfg = dataclasses.replace(config_for("fwd_fp8", D, D), WS=0)

    def with_quant() -> None:
        operands, call_scales = quantize_qkv(q, k, v, shape)
        forward_into(*operands, out, lse, fp8_shape, causal, scale, None, call_scales)

    found: dict[str, Callable[[], object]] = {
        "bf16": lambda: forward_into(q, k, v, out, lse, shape, causal, scale, None),
        "fp8 triton": lambda: forward_into(q8, k8, v8, out, lse, fp8_shape, causal, scale, None, scales, triton_cfg),
        "fp8 with quant": with_quant,
    }
    head_scales = (scales.q, scales.k, scales.v)
    for (block_n, stages), lazy in itertools.product(ws, lazies):
        if hopper_ws.supported(q8, k8, v8, causal, None, False, block_n, stages):
            found[f"fp8 ws n{block_n} s{stages}{' lazy' if lazy else ''}"] = lambda n=block_n, st=stages, z=lazy: (
                hopper_ws.forward_ws(q8, k8, v8, out, lse, causal, scale * LOG2E, n, st, bool(z), scales=head_scales))
    return found


def variants(B: int, S: int, Hq: int, Hkv: int, D: int, causal: bool, ws: list[tuple[int, int]], lazies: list[int],
             persistents: list[int], pass_: str) -> dict[str, Callable[[], object]]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, S, Hq, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    grad = torch.randn_like(q)
    out, lse = torch.empty_like(q), torch.empty(B, Hq, S, device="cuda")
    shape, scale = dense_shape(q, k, v), D ** -0.5
    backward = pass_ == "bwd"
    found: dict[str, Callable[[], object]] = {}
    if pass_ == "fp8":
        found = fp8_variants(q, k, v, out, lse, causal, ws, lazies)
    elif backward:
        forward_into(q, k, v, out, lse, shape, causal, scale, None)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        serves = {"ws dq": hopper_ws.supports_dq(q, k, v, grad, causal, None, False),
                  "ws fused": hopper_ws.supports_backward(q, k, v, grad, causal, None, False)}
        for name, kv_ws, dq_ws in (("triton dq", 0, 0), ("ws dq", 0, 1), ("ws fused", 1, 0)):
            if not serves.get(name, True):
                continue
            kv_cfg = dataclasses.replace(config_for("bwd_kv", D, D), WS=kv_ws)
            dq_cfg = dataclasses.replace(config_for("bwd_q", D, D), WS=dq_ws)
            found[name] = lambda kc=kv_cfg, qc=dq_cfg: backward_into(
                grad, q, k, v, out, lse, dq, dk, dv, shape, causal, scale, None, kv_config=kc, dq_config=qc)
    else:
        triton_cfg = dataclasses.replace(config_for("fwd", D, D), WS=0)
        found["triton"] = lambda: forward_into(q, k, v, out, lse, shape, causal, scale, None, config=triton_cfg)
        for (block_n, stages), lazy, persistent in itertools.product(ws, lazies, persistents):
            if hopper_ws.supported(q, k, v, causal, None, False, block_n, stages) and (persistent or not causal):
                name = f"ws n{block_n} s{stages}{' lazy' if lazy else ''}{'' if persistent else ' grid'}"
                found[name] = lambda n=block_n, st=stages, z=lazy, p=persistent: hopper_ws.forward_ws(
                    q, k, v, out, lse, causal, scale * LOG2E, n, st, bool(z), bool(p))
    group = Hq // Hkv
    leaves = [t.transpose(1, 2).detach().requires_grad_(backward)
              for t in (q, k.repeat_interleave(group, 2), v.repeat_interleave(group, 2))]
    grad_t = grad.transpose(1, 2)
    for name, backend in (("sdpa cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa flash", SDPBackend.FLASH_ATTENTION)):
        with sdpa_kernel(backend), torch.set_grad_enabled(backward):
            graph = F.scaled_dot_product_attention(*leaves, is_causal=causal)

        def sdpa(backend: SDPBackend = backend, graph: torch.Tensor = graph) -> None:
            if backward:
                torch.autograd.grad(graph, leaves, grad_t, retain_graph=True)
            else:
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(*leaves, is_causal=causal)
        found[name] = sdpa
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--ws", nargs="+", default=["128:2", "128:3", "64:2"],
                        help="the warp-specialized forward's key block:stages to time (those that fit)")
    parser.add_argument("--lazy", nargs="+", type=int, choices=(0, 1), default=[0, 1],
                        help="the warp-specialized forward's lazy rescale (the tuned table's LAZY knob): each value")
    parser.add_argument("--persistent", nargs="+", type=int, choices=(0, 1), default=[0, 1],
                        help="the warp-specialized forward's persistent grid (non-causal; 0: a CTA a tile): each value")
    parser.add_argument("--pass", dest="pass_", choices=("fwd", "bwd", "fp8"), default="fwd")
    parser.add_argument("--only", default="", help="keep shapes whose label contains this")
    parser.add_argument("--csv", default=None)
    args = parser.parse_args()
    ws = [tuple(int(x) for x in item.split(":")) for item in args.ws]
    timer = Timer(torch.device("cuda"), repeats=args.repeats, warmup=3)
    rows = []
    for label, (B, S, Hq, Hkv, D, causal) in SHAPES.items():
        if args.only not in label:
            continue
        backward = args.pass_ == "bwd"
        calls = variants(B, S, Hq, Hkv, D, causal, ws, args.lazy, args.persistent, args.pass_)
        flops = 4.0 * B * Hq * S * S * D / (2 if causal else 1) * (2.5 if backward else 1.0)
        times = interleaved_rounds(calls, timer, args.rounds)
        anchor = statistics.median(times["sdpa cudnn"])
        for name, samples in times.items():
            ms = statistics.median(samples)
            rows.append({"label": label, "impl": name, "ms": ms, "tflops": flops / ms / 1e9,
                         "ratio": anchor / ms, "spread": (max(samples) - min(samples)) / ms})
    report(rows, f"attention {args.pass_} A/B (ratio: over SDPA cuDNN)", ["label", "impl", "ms", "tflops", "ratio",
                                                                    "spread"], args.csv, group="impl")


if __name__ == "__main__":
    main()
