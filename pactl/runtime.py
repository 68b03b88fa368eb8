"""Where and how the network runs: the device a name means, and autocast for --amp.

A leaf: train, embed and serve all use it, and it imports nothing of pactl but errors."""

from __future__ import annotations

import os
from contextlib import nullcontext
from typing import Any

import torch

from pactl.errors import PactlError


def mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def resolve_device(name: str) -> torch.device:
    """`auto`: CUDA (under torchrun, this process's GPU), else Apple's MPS, else the CPU. A device
    asked for by name that this machine lacks is one line."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("mps") if mps_available() else torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise PactlError(f"device {name!r} asked for, but no CUDA device is available")
    if name == "mps" and not mps_available():
        raise PactlError("device 'mps' asked for, but this machine has no Apple MPS device")
    return torch.device(name)


# --amp NAME: the dtype the forward pass autocasts to (None: float32 throughout).
AMP: dict[str, torch.dtype | None] = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, amp: str) -> Any:
    """bf16/fp16 autocast on the model's forward pass, or nothing for amp='none'."""
    dtype = AMP[amp]
    if dtype is None:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
