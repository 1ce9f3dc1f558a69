"""Facts about where kernels run."""

from __future__ import annotations

import torch

import kernels


def interpreter_mode() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1 when `kernels` was imported)."""
    return kernels.INTERPRETER


def default_device() -> torch.device:
    """The device kernels run on: the current CUDA device, or the CPU under the interpreter."""
    if torch.cuda.is_available() and not interpreter_mode():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for host-side grid and buffer sizes. triton.cdiv is a constexpr function now, whose
    argument unwrapping costs microseconds a call: a training step makes dozens of these."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), for host-side block sizes: triton.next_power_of_2 is a
    constexpr function too (see cdiv), 2.5 us a call on a fast host, 10 on the lent H100's."""
    return 1 << max(n - 1, 0).bit_length()


# SMs per CUDA device index, read once: torch.cuda.get_device_properties costs microseconds a call,
# and every persistent launch asks.
_SM_COUNTS: dict[int, int] = {}


def persistent_programs(device: torch.device, tiles: int) -> int:
    """Programs of a persistent grid: one per SM, no more than the tiles; a few under the interpreter,
    so that each program walks several tiles there too."""
    if interpreter_mode() or device.type != "cuda":
        return max(1, min(tiles, 4))
    index = device.index if device.index is not None else torch.cuda.current_device()
    sms = _SM_COUNTS.get(index)
    if sms is None:
        sms = _SM_COUNTS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return max(1, min(tiles, sms))


# Compute capability per CUDA device index, read once (as the SM counts above).
_CAPABILITIES: dict[int, tuple[int, int]] = {}


def is_hopper(device: torch.device) -> bool:
    """Whether `device` is an sm_90 GPU (H100, H200), where the warp-specialized Gluon kernels run."""
    if device.type != "cuda":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    capability = _CAPABILITIES.get(index)
    if capability is None:
        capability = _CAPABILITIES[index] = torch.cuda.get_device_capability(index)
    return capability == (9, 0)


# Shared memory a Hopper (sm_90) block can have: 227 KiB.
SHARED_MEMORY_BYTES = 232448


def check_same_device(**tensors: torch.Tensor) -> torch.device:
    """Raise a ValueError naming the tensors if they are not all on one device."""
    values = iter(tensors.values())
    device = next(values).device
    if any(t.device != device for t in values):
        listed = ", ".join(f"{name} on {t.device}" for name, t in tensors.items())
        raise ValueError(f"tensors must be on one device: {listed}")
    if device.type != "cuda" and not interpreter_mode():
        raise ValueError(f"tensors are on {device}: Triton kernels need a CUDA device (or TRITON_INTERPRET=1)")
    return device
