"""The TMA launchers on a thread with no current CUDA context, as autograd's backward thread can be: the
first CUDA call there is the host descriptor's encoding, which needs one (kernels/common/tma.py,
bind_context). Without it, a training step failed on the H100 with "Failed to create tensor map
descriptor: invalid device context"."""

import threading
from collections.abc import Callable

import pytest
import torch

from harness.snr import snr_db
from kernels.common import blockwise_ws
from kernels.common.fp8 import Granularity, quantize_blocks_2d, quantize_rows
from kernels.common.scales import Scales
from kernels.common.tiles import TileConfig
from kernels.gemm.kernel import matmul
from kernels.grouped_gemm.kernel import grouped_mm

E4M3 = torch.float8_e4m3fn
CFG = TileConfig(128, 128, 64, 8, 8, 3)


def on_a_fresh_thread(launch: Callable[[], object], out: torch.Tensor) -> None:
    """Run `launch` once here, then, `out` poisoned, on a new thread (no CUDA context current there), and
    re-raise what it raised. The first run compiles and loads the kernel, which would bind a context as a
    side effect: on the fresh thread, as on autograd's, the host descriptor is then the first CUDA call."""
    launch()
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    raised: list[BaseException] = []

    def body() -> None:
        try:
            launch()
        except BaseException as exc:  # re-raised on the caller's thread
            raised.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    torch.cuda.synchronize()
    if raised:
        raise raised[0]


def tensors(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


@pytest.mark.gpu
def test_the_dense_tma_kernel():
    a, b = tensors(512, 256), tensors(256, 384)
    out = torch.empty((512, 384), device="cuda", dtype=torch.bfloat16)
    on_a_fresh_thread(lambda: matmul(a, b, out=out, config=CFG), out)
    assert snr_db(out, a.double() @ b.double()) >= 40.0


@pytest.mark.gpu
def test_the_grouped_tma_kernel():
    a, b = tensors(600, 256), tensors(3, 384, 256)
    offs = torch.tensor([0, 100, 100, 600], device="cuda", dtype=torch.int64)
    out = torch.empty((600, 384), device="cuda", dtype=torch.bfloat16)
    on_a_fresh_thread(lambda: grouped_mm(a, b, offs, out, CFG), out)
    ref = torch.cat([a[:100].double() @ b[0].double().t(), a[100:].double() @ b[2].double().t()])
    assert snr_db(out, ref) >= 40.0


@pytest.mark.gpu
def test_the_warp_specialized_blockwise_kernel():
    aq, sa = quantize_rows(tensors(512, 512), E4M3, Granularity.BLOCKWISE)
    bq, _, sb = quantize_blocks_2d(tensors(1, 256, 512), E4M3)
    scales = Scales(sa, sa.stride(), sb, sb.stride(), 128, per_k_block=True)
    cfg = TileConfig(128, 128, 128, 8, 8, 3)
    out = torch.empty((512, 256), device="cuda", dtype=torch.bfloat16)
    assert blockwise_ws.supported(aq, bq, out, scales, cfg)
    on_a_fresh_thread(lambda: blockwise_ws.blockwise_mm(aq, bq, out, scales, cfg), out)
    assert not out.isnan().any()
