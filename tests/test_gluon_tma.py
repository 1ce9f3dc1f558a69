import pytest
import torch
from triton.experimental.gluon import language as gl

from kernels.common.device import is_hopper
from kernels.common.gluon_tma import GL_DTYPES, descriptor


def _not_called(*args, **kwargs):
    raise AssertionError("the layout was computed at launch")


@pytest.mark.parametrize("dtype", list(GL_DTYPES), ids=str)
@pytest.mark.parametrize("box", [(64, 128), (128, 64), (256, 128), (64, 32)])
def test_a_launchers_box_takes_its_layout_from_the_table(monkeypatch, dtype, box):
    """What the Gluon launchers build on every call: the box's shared-memory layout comes from the table
    computed at import (Gluon's get_default_for costs ~6 us of host a call), and equals Gluon's own."""
    want = gl.NVMMASharedLayout.get_default_for(list(box), GL_DTYPES[dtype])
    t = torch.empty(512, 256, dtype=dtype)
    monkeypatch.setattr(gl.NVMMASharedLayout, "get_default_for", _not_called)
    got = descriptor(t, box)
    assert got.layout == want
    assert (got.shape, got.strides, got.block_shape) == ([512, 256], [256, 1], list(box))


def test_a_box_outside_the_table_gets_its_layout_computed():
    t = torch.empty(64, 64, dtype=torch.float16)
    assert descriptor(t, (16, 64)).layout == gl.NVMMASharedLayout.get_default_for([16, 64], gl.float16)


def test_only_an_sm90_gpu_is_hopper():
    assert not is_hopper(torch.device("cpu"))
    if torch.cuda.is_available():
        assert is_hopper(torch.device("cuda")) == (torch.cuda.get_device_capability() == (9, 0))
