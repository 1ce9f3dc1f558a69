"""Short dtype names used in shapes, CLI options, CSV sidecars and SNR rules."""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype '{name}' (known: {', '.join(DTYPES)})") from None


def dtype_name(dtype: torch.dtype) -> str:
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"dtype {dtype} has no short name (known: {', '.join(DTYPES)})")
