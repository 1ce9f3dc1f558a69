"""What an FP8 training step launches (issue 15: far fewer launches, nothing quantized twice in a step).

On a GPU every launch costs 20-35 us of host time, which small layers cannot hide, so the kernels and
the torch ops that launch device work are counted for one forward + backward through autograd of each
FP8 op, under the CPU interpreter (which takes the same host paths; on a Hopper GPU the blockwise GEMMs
run on the warp-specialized kernel instead, one launch each as here). The tables are exact: a change
that removes a launch updates them, one that adds a launch has to say why here.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernels.common.device import interpreter_mode
from kernels.common.fp8 import Float8Config, Granularity
from kernels.gemm_fp8 import gemm_fp8
from kernels.gemm_fp8 import prequantize_weight as prequantize_linear
from kernels.grouped_gemm import group_offsets
from kernels.grouped_gemm_fp8 import group_layout, grouped_gemm_fp8
from kernels.grouped_gemm_fp8 import prequantize_weight as prequantize_experts
from kernels.moe import moe_experts, swiglu_down_fp8

pytestmark = pytest.mark.skipif(not interpreter_mode(), reason="counts the interpreter's launches")

# Torch ops that launch nothing on a device: allocations and views.
NO_LAUNCH = {
    "empty.memory_format", "empty_like.default", "new_empty.default", "empty_strided.default", "view.default",
    "_unsafe_view.default", "slice.Tensor", "select.int", "t.default", "transpose.int", "unsqueeze.default",
    "as_strided.default", "permute.default", "detach.default", "alias.default", "expand.default", "split.Tensor",
    "split_with_sizes.default",
}
# The grouped ops check group sizes that live on the host (as every tensor does here): on a GPU they
# stay on the device and are not read. Left out of the grouped ops' counts only.
HOST_CHECKS = {"lt.Scalar", "any.default", "sum.default", "_local_scalar_dense.default"}

AMAX, CAST, BLOCKS = "_amax_both_kernel", "_quantize_both_kernel", "_quantize_blocks_2d_kernel"
LAYOUT, TMA = "_token_layout_kernel", "_matmul_tma_kernel"
GROUPED, VARK = "_grouped_mm_kernel", "_grouped_mm_vark_kernel"


class _DeviceOps(TorchDispatchMode):
    """Counts the torch ops that would launch device work, outside the interpreted kernels."""

    def __init__(self, ops: Counter, inside_kernel: list[int], uncounted: set[str]):
        super().__init__()
        self.ops, self.inside_kernel, self.uncounted = ops, inside_kernel, uncounted

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__
        if not self.inside_kernel[0] and name not in self.uncounted:
            self.ops[name.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counted(monkeypatch: pytest.MonkeyPatch, uncounted: set[str]) -> Iterator[tuple[Counter, Counter]]:
    """(Triton kernels by name, torch ops by name but those `uncounted`) launched inside the block."""
    from triton.runtime.interpreter import InterpretedFunction

    launches, ops, inside_kernel = Counter(), Counter(), [0]
    run = InterpretedFunction.run

    def counting_run(self, *args, **kwargs):
        if not kwargs.get("warmup"):
            launches[self.fn.__name__] += 1
        inside_kernel[0] += 1
        try:
            return run(self, *args, **kwargs)
        finally:
            inside_kernel[0] -= 1

    monkeypatch.setattr(InterpretedFunction, "run", counting_run)
    with _DeviceOps(ops, inside_kernel, uncounted):
        yield launches, ops


def one_step(monkeypatch: pytest.MonkeyPatch, step: Callable[[], None], host_checks: bool = False,
             ) -> tuple[dict, dict]:
    """What the second call of `step` launches (`host_checks`: the grouped ops' host-side checks left out)."""
    step()  # first call: nothing lazy is counted
    with counted(monkeypatch, NO_LAUNCH | HOST_CHECKS if host_checks else NO_LAUNCH) as (launches, ops):
        step()
    return dict(launches), dict(ops)


ROW, BLOCK = Granularity.ROWWISE, Granularity.BLOCKWISE

# (granularity, weight prequantized and wgrad into a main_grad): (Triton launches, torch ops)
DENSE = {
    # x, w and dy each quantized once, into both layouts (amax, then casts; a zeroed amax buffer each)
    (ROW, False): ({AMAX: 3, CAST: 3, TMA: 3}, {"zeros": 3}),
    # the accumulating wgrad runs on the grouped kernel (its epilogue reads C), as one group [0, M]
    (ROW, True): ({AMAX: 2, CAST: 2, TMA: 2, GROUPED: 1}, {"zeros": 2, "arange": 1}),
    (BLOCK, False): ({CAST: 2, BLOCKS: 1, TMA: 3}, {}),
    (BLOCK, True): ({CAST: 2, TMA: 2, GROUPED: 1}, {"arange": 1}),
}
GROUPED_OP = {  # one token layout, computed in the forward and kept for the backward
    (ROW, False): ({LAYOUT: 1, AMAX: 3, CAST: 3, GROUPED: 2, VARK: 1}, {"zeros": 3}),
    (ROW, True): ({LAYOUT: 1, AMAX: 2, CAST: 2, GROUPED: 2, VARK: 1}, {"zeros": 2}),
    (BLOCK, False): ({LAYOUT: 1, CAST: 2, BLOCKS: 1, GROUPED: 2, VARK: 1}, {}),
    (BLOCK, True): ({LAYOUT: 1, CAST: 2, GROUPED: 2, VARK: 1}, {}),
}
# GateUP, then the Down GEMM with the SwiGLU inside its quantization: the SwiGLU's input and the two
# upstream gradients quantized once each beside the tokens; the token layout mapped once, by the caller
# (group_layout), for both ops and their backward. Without it each op maps its own: one more.
EXPERTS = {
    ROW: ({LAYOUT: 1, AMAX: 4, CAST: 4, GROUPED: 4, VARK: 2, "_swiglu_bwd_kernel": 1}, {"zeros": 4}),
    BLOCK: ({LAYOUT: 1, CAST: 4, GROUPED: 4, VARK: 2, "_swiglu_bwd_kernel": 1}, {}),
}


@pytest.mark.parametrize(("granularity", "accumulate"), list(DENSE))
def test_a_linear_step_launches_each_quantization_once(monkeypatch, granularity, accumulate):
    config = Float8Config(granularity=granularity)
    x = torch.randn(256, 128, dtype=torch.float16, requires_grad=True)
    w = torch.randn(64, 128, dtype=torch.float16, requires_grad=True)
    dy = torch.randn(256, 64, dtype=torch.float16)
    extra = {"b_fp8": prequantize_linear(w.detach(), config=config),
             "main_grad": torch.zeros(64, 128)} if accumulate else {}

    def step():
        x.grad = w.grad = None
        gemm_fp8(x, w, config=config, **extra).backward(dy)

    assert one_step(monkeypatch, step) == DENSE[granularity, accumulate]


@pytest.mark.parametrize(("granularity", "accumulate"), list(GROUPED_OP))
def test_a_grouped_step_maps_the_tokens_once_and_quantizes_each_operand_once(monkeypatch, granularity, accumulate):
    config = Float8Config(granularity=granularity)
    x = torch.randn(256, 128, dtype=torch.float16, requires_grad=True)
    w = torch.randn(4, 64, 128, dtype=torch.float16, requires_grad=True)
    dy = torch.randn(256, 64, dtype=torch.float16)
    lens = torch.tensor([160, 0, 64, 32])
    offs = group_offsets(lens)
    extra = {"b_fp8": prequantize_experts(w.detach(), config=config),
             "main_grad": torch.zeros(4, 64, 128)} if accumulate else {}

    def step():
        x.grad = w.grad = None
        grouped_gemm_fp8(x, w, lens, offs, config=config, **extra).backward(dy)

    assert one_step(monkeypatch, step, host_checks=True) == GROUPED_OP[granularity, accumulate]


@pytest.mark.parametrize("shared", [True, False], ids=["shared-layout", "own-layouts"])
@pytest.mark.parametrize("granularity", list(EXPERTS))
def test_an_expert_microbatch_writes_no_swiglu_output_and_quantizes_once(monkeypatch, granularity, shared):
    config = Float8Config(granularity=granularity)
    x = torch.randn(256, 128, dtype=torch.float16, requires_grad=True)
    w_gate_up = torch.randn(4, 2 * 64, 128, dtype=torch.float16, requires_grad=True)
    w_down = torch.randn(4, 128, 64, dtype=torch.float16, requires_grad=True)
    dy = torch.randn(256, 128, dtype=torch.float16)
    lens = torch.tensor([160, 0, 64, 32])
    offs = group_offsets(lens)
    copies = [prequantize_experts(w.detach(), config=config) for w in (w_gate_up, w_down)]
    main_grads = [torch.zeros(w.shape) for w in (w_gate_up, w_down)]

    def step():
        x.grad = None
        layout = group_layout(offs, x.shape[0]) if shared else None
        h = grouped_gemm_fp8(x, w_gate_up, lens, offs, config=config, b_fp8=copies[0], main_grad=main_grads[0],
                             layout=layout)
        swiglu_down_fp8(h, w_down, offs, config, w_fp8=copies[1], main_grad=main_grads[1],
                        layout=layout).backward(dy)

    launches, ops = EXPERTS[granularity]
    assert one_step(monkeypatch, step, host_checks=True) == (launches if shared else launches | {LAYOUT: 2}, ops)


@pytest.mark.parametrize("granularity", list(EXPERTS))
def test_an_moe_layer_maps_its_tokens_once(monkeypatch, granularity):
    """moe_experts hands its GateUP and Down GEMMs (forward and backward) one token layout."""
    x = torch.randn(64, 32, dtype=torch.float16, requires_grad=True)
    probs = torch.rand(64, 2, requires_grad=True)
    expert_ids = torch.stack([torch.arange(64) % 4, (torch.arange(64) + 1) % 4], dim=1)
    w_gate_up = torch.randn(4, 2 * 16, 32, dtype=torch.float16, requires_grad=True)
    w_down = torch.randn(4, 32, 16, dtype=torch.float16, requires_grad=True)

    def step():
        moe_experts(x, expert_ids, probs, w_gate_up, w_down, Float8Config(granularity=granularity)).sum().backward()

    launches, _ = one_step(monkeypatch, step)
    assert launches[LAYOUT] == 1
