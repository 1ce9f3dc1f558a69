"""Where the fused attention backward's time goes: the warp-specialized backward (kernels/attention/hopper_ws.py)
next to SDPA cuDNN at one token count (B x S = 16k) split into sequences of 8k down to 1k, causal and not, and
beside it, on the 8k sequences, two diagnostic builds of the kernel and the causal heads' L2 budgets:

- `no dq reductions`: the dQ TMA reductions left out (dQ is wrong): what the L2 traffic of dQ's fp32 sums costs;
- `same q block`: every step loads its head's first q and dO block (dK, dV and dQ are wrong): what missing the
  L2 on q and dO costs;
- `budget N MB`: FUSED_BWD_SHARED_BYTES, the L2 bytes the causal heads side by side may share.

The diagnostic builds are the module's source with one call edited, imported from a temporary directory; an
edit that no longer finds its text stops the probe. Each shape's calls are timed in shuffled rounds
(passes_report.interleaved_rounds) and reported in TFLOPS (FlashAttention's count: 2.5 x 4 B H S^2 D, halved
when causal) and as a ratio to SDPA cuDNN. `--ncu` instead runs each 8k call once after a warm-up, between
cudaProfilerStart and Stop, for `ncu --profile-from-start off` (scripts/gpu_attention_bwd_probe.sh).

    python benchmarks/attention_bwd_probe.py --rounds 9
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from passes_report import interleaved_rounds
from torch.nn.attention import SDPBackend, sdpa_kernel

import kernels  # noqa: F401  (interpreter switch before triton loads)
from harness.timing import Timer
from kernels.attention import hopper_ws
from kernels.attention.kernel import LOG2E

TOKENS = 16384
BUDGETS_MB = (8, 16, 64)


def edited_module(name: str, old: str, new: str, within: str | None, directory: Path) -> ModuleType:
    """hopper_ws with `old` replaced by `new` (only inside the function that starts with `within`, if given),
    imported from `directory`."""
    text = Path(hopper_ws.__file__).read_text()
    start, end = 0, len(text)
    if within:
        start = text.index(within)
        end = text.index("\n@gluon.jit", start + 1)
    if old not in text[start:end]:
        raise SystemExit(f"attention_bwd_probe: the {name} edit no longer finds {old!r} in hopper_ws.py")
    text = text[:start] + text[start:end].replace(old, new) + text[end:]
    path = directory / f"_hws_{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def diagnostic_builds(directory: Path) -> dict[str, ModuleType]:
    reduction = ("                _tma_reduce_add(dq_desc, [b * seqlen_q + m0, h * HEAD_DIM + half * (HEAD_DIM // 2)"
                 " + c * DQ_CHUNK],\n                                tiles.index(half))")
    return {"no dq reductions": edited_module("noreduce", reduction, "                pass", None, directory),
            "same q block": edited_module("sameq", "[b * seqlen_q + m0, h * HEAD_DIM]", "[b * seqlen_q, h * HEAD_DIM]",
                                          "def _bwd_load_tile", directory)}


def calls_for(B: int, S: int, H: int, D: int, causal: bool, builds: dict[str, ModuleType],
              budgets: tuple[int, ...]) -> dict[str, Callable[[], object]]:
    """Our backward (its default launch, and a CTA a tile), the diagnostic builds, the budgets, SDPA cuDNN's
    backward: each on the same random inputs (the LSE and delta drawn, not computed: the timing is the same)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, g = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    lse = torch.randn(B, H, S, device="cuda", generator=gen).abs() + 10.0
    delta = torch.randn(B, H, S, device="cuda", generator=gen)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    scales = (LOG2E / math.sqrt(D), 1 / math.sqrt(D))

    def backward(module: ModuleType = hopper_ws, persistent: bool = True) -> Callable[[], object]:
        return lambda: module.backward_ws(q, k, v, g, lse, delta, dq, dk, dv, causal, *scales, persistent)

    found = {"ours": backward(), "ours, a CTA a tile": backward(persistent=False)}
    found |= {name: backward(module) for name, module in builds.items()}
    for budget in budgets:
        def with_budget(budget: int = budget) -> None:
            saved = hopper_ws.FUSED_BWD_SHARED_BYTES
            hopper_ws.FUSED_BWD_SHARED_BYTES = budget << 20
            try:
                backward()()
            finally:
                hopper_ws.FUSED_BWD_SHARED_BYTES = saved
        found[f"budget {budget} MB"] = with_budget
    leaves = [t.transpose(1, 2).detach().requires_grad_(True) for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        graph = F.scaled_dot_product_attention(*leaves, is_causal=causal)
    found["sdpa cudnn"] = lambda: torch.autograd.grad(graph, leaves, g.transpose(1, 2), retain_graph=True)
    return found


def time_shapes(head_dim: int, rounds: int, builds: dict[str, ModuleType]) -> None:
    timer = Timer(torch.device("cuda"), repeats=3, warmup=2)
    heads = 2048 // head_dim
    for causal in (False, True):
        for S in (8192, 4096, 2048, 1024):
            B = TOKENS // S
            long = S == 8192
            calls = calls_for(B, S, heads, head_dim, causal, builds if long else {},
                              BUDGETS_MB if long and causal else ())
            times = interleaved_rounds(calls, timer, rounds)
            flops = 2.5 * 4 * B * heads * S * S * head_dim / (2 if causal else 1)
            anchor = times["sdpa cudnn"]
            cells = [f"{name} {flops / statistics.median(ms) / 1e9:.0f} "
                     f"({statistics.median([a / m for a, m in zip(anchor, ms, strict=True)]):.3f}x)"
                     for name, ms in times.items()]
            print(f"d{head_dim} {B}x{S} h{heads}{' causal' if causal else ''}: " + "  ".join(cells), flush=True)


def profile_once(head_dims: list[int], builds: dict[str, ModuleType]) -> None:
    runs = []
    for head_dim in head_dims:
        for causal in (False, True):
            calls = calls_for(TOKENS // 8192, 8192, 2048 // head_dim, head_dim, causal, builds, ())
            runs += [(f"d{head_dim}{' causal' if causal else ''} {name}", fn) for name, fn in calls.items()]
    for _, fn in runs:  # compiled and warm before the profiler starts
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for label, fn in runs:
        torch.cuda.nvtx.range_push(label)
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    torch.cuda.cudart().cudaProfilerStop()
    print("\n".join(label for label, _ in runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", type=int, nargs="+", default=[256, 128])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--ncu", action="store_true", help="each 8k call once, inside cudaProfilerStart/Stop")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        builds = diagnostic_builds(Path(directory))
        if args.ncu:
            profile_once(args.head_dims, builds)
        else:
            for head_dim in args.head_dims:
                time_shapes(head_dim, args.rounds, builds)


if __name__ == "__main__":
    main()
