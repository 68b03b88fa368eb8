"""Device choice: auto takes CUDA, then Apple's MPS, then the CPU; a missing device is one line."""

from __future__ import annotations

import pytest
import torch

from pactl.errors import PactlError
from pactl.runtime import resolve_device


@pytest.mark.parametrize(
    ("cuda", "mps", "want"),
    [(True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")],
)
def test_auto_prefers_cuda_then_mps_then_cpu(
    cuda: bool, mps: bool, want: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    assert resolve_device("auto").type == want


def test_a_device_the_machine_lacks_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    for name in ("mps", "cuda", "cuda:1"):
        with pytest.raises(PactlError, match=f"device '{name}' asked for"):
            resolve_device(name)
    assert resolve_device("cpu").type == "cpu"
