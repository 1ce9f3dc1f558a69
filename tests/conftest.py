"""Tests run on the CPU under the Triton interpreter unless marked `gpu` (run those with `pytest -m gpu`)."""

import pytest
import torch

import kernels  # noqa: F401  (turns the interpreter on before anything imports triton)
from kernels.common.device import default_device, interpreter_mode


@pytest.fixture
def device() -> torch.device:
    return default_device()


@pytest.fixture
def half_dtype() -> torch.dtype:
    """bf16 on a GPU; fp16 under the interpreter, whose bf16 arithmetic is wrong."""
    return torch.float16 if interpreter_mode() else torch.bfloat16


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available() and not interpreter_mode():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
