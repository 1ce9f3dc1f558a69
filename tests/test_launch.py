"""kernels/common/launch.py: a cached launch runs the binary `kernel[grid]` would, for every
specialization (alignment, divisibility, constexprs, launch options), and defers to Triton where it
has nothing to cache (the interpreter)."""

import pytest
import torch
import triton
import triton.language as tl

from harness.snr import snr_db
from kernels.common.device import interpreter_mode
from kernels.common.launch import FastLaunch, fast_launch


@fast_launch
@triton.jit
def _scaled_copy_kernel(x_ptr, out_ptr, n, stride, scale, BLOCK: tl.constexpr, SQUARE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs * stride, mask=mask)
    y = x * x if SQUARE else x
    tl.store(out_ptr + offs, y * scale, mask=mask)


def scaled_copy(x: torch.Tensor, stride: int, scale: float, square: bool, block: int = 64, warps: int = 4):
    n = -(-x.numel() // stride)
    out = torch.full((n,), float("nan"), device=x.device, dtype=x.dtype)  # poisoned
    _scaled_copy_kernel[(-(-n // block),)](x, out, n, stride, scale, BLOCK=block, SQUARE=square, num_warps=warps)
    return out


def reference(x: torch.Tensor, stride: int, scale: float, square: bool) -> torch.Tensor:
    y = x[::stride].double()
    return ((y * y if square else y) * scale).to(x.dtype)


def test_the_interpreter_goes_through_triton():
    if not interpreter_mode():
        pytest.skip("CPU interpreter only")
    assert not _scaled_copy_kernel.direct
    x = torch.randn(100)
    assert torch.equal(scaled_copy(x, 1, 2.0, False), reference(x, 1, 2.0, False))
    assert _scaled_copy_kernel.compiled == {}


def test_a_plain_function_is_not_launched_directly():
    assert not FastLaunch(lambda: None).direct


@pytest.mark.gpu
def test_each_specialization_launches_its_own_binary():
    kernel = _scaled_copy_kernel
    kernel.compiled.clear()
    base = torch.randn(4096 + 1, device="cuda")
    cases = [
        (base[:4096], 1, 0.5, False, 64, 4),   # aligned pointer, n % 16 == 0, stride == 1
        (base[1:], 1, 0.5, False, 64, 4),      # pointer off the 16-byte alignment
        (base[:4096], 3, 0.5, False, 64, 4),   # a stride that is neither 1 nor a multiple of 16
        (base[:4096], 16, 0.5, False, 64, 4),  # ... and one that is
        (base[:4096], 1, -1.0, True, 64, 4),   # another constexpr
        (base[:4096], 1, 0.5, False, 128, 8),  # other block and warps
        (base[:1000], 1, 0.5, False, 64, 4),   # n not a multiple of 16
    ]
    for x, stride, scale, square, block, warps in cases:
        for _ in range(3):  # the first call compiles through Triton, the rest launch the cached binary
            got = scaled_copy(x, stride, scale, square, block, warps)
            torch.testing.assert_close(got, reference(x, stride, scale, square), rtol=0, atol=0)
    assert len(kernel.compiled) == len(cases)


@pytest.mark.gpu
def test_a_cached_launch_is_captured_by_a_cuda_graph():
    x = torch.randn(4096, device="cuda")
    scaled_copy(x, 1, 2.0, False)  # compiled and cached before the capture
    out = torch.empty(4096, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _scaled_copy_kernel[(64,)](x, out, 4096, 1, 2.0, BLOCK=64, SQUARE=False, num_warps=4)
    out.fill_(float("nan"))
    x.copy_(torch.randn(4096, device="cuda"))
    graph.replay()
    torch.testing.assert_close(out, x * 2.0, rtol=0, atol=0)


@pytest.mark.gpu
def test_the_caches_stop_growing_once_a_training_step_has_run():
    """A specialization key that differed per call (an object compared by identity, a pointer) would
    make every launch a cache miss and the cache a leak: after one warm-up step, no launcher of the
    FP8 Linear and grouped ops learns anything new."""
    import kernels.common.blockwise_ws as ws_module
    import kernels.common.fp8 as fp8_module
    import kernels.gemm.kernel as gemm_module
    import kernels.grouped_gemm.kernel as grouped_module
    from kernels.common.fp8 import Float8Config, Granularity
    from kernels.gemm_fp8 import gemm_fp8
    from kernels.grouped_gemm import group_offsets
    from kernels.grouped_gemm_fp8 import grouped_gemm_fp8

    launchers = [obj for module in (fp8_module, gemm_module, grouped_module, ws_module)
                 for obj in vars(module).values() if isinstance(obj, FastLaunch)]
    w = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    experts = torch.randn(4, 512, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    lens = torch.tensor([384, 0, 512, 128], device="cuda")

    def steps():
        for granularity in (Granularity.ROWWISE, Granularity.BLOCKWISE):
            config = Float8Config(granularity=granularity)
            x = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            gemm_fp8(x, w, config=config).sum().backward()
            grouped_gemm_fp8(x, experts, lens, group_offsets(lens), config=config).sum().backward()

    steps()
    learned = [len(launcher.compiled) for launcher in launchers]
    for _ in range(3):
        steps()
    assert [len(launcher.compiled) for launcher in launchers] == learned
    assert sum(learned) >= 5  # the steps did launch through the caches


def test_the_host_side_block_sizes_agree_with_tritons():
    """cdiv and next_power_of_2 stand in for Triton's constexpr functions on the host (microseconds a call
    cheaper): the same values wherever launchers use them."""
    from kernels.common.device import cdiv, next_power_of_2

    for n in range(1, 5000):
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
        assert cdiv(n, 128) == triton.cdiv(n, 128), n


@pytest.mark.gpu
def test_a_descriptor_encoded_once_serves_whatever_lies_at_its_address():
    """The memo of encoded tensor descriptors is keyed on the address, shape, strides and padding a
    descriptor encodes: new data at an address reads as itself, another shape at the same address gets
    its own encoding, and a step repeated on the same buffers encodes nothing after its first."""
    import kernels.gemm.kernel as gemm_module
    from kernels.gemm import gemm

    def a_encodings() -> int:
        """Encodings the TMA GEMM's first operand (argument 0) holds, over its compiled launches."""
        launches = gemm_module._matmul_tma_kernel.compiled.values()
        assert launches and all(launch.native is not None for launch in launches)  # the native path ran
        return sum(len(memo) for launch in launches for position, _, memo in launch.descriptors if position == 0)

    torch.manual_seed(0)
    w = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    storage = torch.empty(384 * 512, device="cuda", dtype=torch.bfloat16)  # one address for every x
    counts = []
    for rows in (384, 384, 384, 320, 320, 384):
        x = storage[: rows * 512].view(rows, 512)
        x.copy_(torch.randn(rows, 512, device="cuda", dtype=torch.bfloat16))  # new data each step
        out = gemm(x, w, trans_b=True)
        assert snr_db(out, x.double() @ w.double().t()) > 40, rows
        counts.append(a_encodings())
    assert counts[1] == counts[2] >= 1    # the same buffer again: from the memo
    assert counts[4] == counts[2] + 1     # another shape at that address: its own encoding, once
    assert counts[5] == counts[4]         # and the first shape's still serves
