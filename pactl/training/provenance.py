"""provenance.json: what a run was made with, so that its numbers can be trusted and redone.

Package versions, CUDA and driver, the machine's devices, the command line, the full configs,
the seed, and fingerprints of the starting weights and of the data. Written by fit()
beside config.json in every run folder (one file per run, rewritten on resume).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pactl.version import __version__

if TYPE_CHECKING:
    import numpy as np
    import torch


class Manifest(Protocol):
    """What provenance reads of a pactl.datasets.Manifest (a leaf imports no dataset code)."""

    @property
    def root(self) -> Path: ...
    @property
    def paths(self) -> tuple[str, ...]: ...
    @property
    def labels(self) -> np.ndarray: ...
    @property
    def splits(self) -> tuple[str, ...]: ...
    @property
    def source(self) -> str: ...
    def __len__(self) -> int: ...


FORMAT = "pactl.training.provenance"
VERSION = 1
PACKAGES = ("torch", "torchvision", "timm", "faiss-cpu", "faiss-gpu-cu12", "numpy", "pillow")
DRIVER_FILE = Path("/proc/driver/nvidia/version")


def package_versions() -> dict[str, str | None]:
    """The installed version of each package that changes a run's numbers (None: absent)."""
    found: dict[str, str | None] = {"pactl": __version__}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def cuda_versions() -> dict[str, Any]:
    """The CUDA runtime torch was built with, cuDNN, and the NVIDIA driver (None: no GPU)."""
    import torch

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"cuda": torch.version.cuda, "cudnn": cudnn, "driver": driver_version()}


def driver_version() -> str | None:
    """The NVIDIA driver's version, from the kernel module or nvidia-smi; None without one."""
    try:
        words = DRIVER_FILE.read_text(encoding="utf-8", errors="replace").split()
    except OSError:
        words = []
    for before, word in zip(words, words[1:], strict=False):
        if before in ("Module", "Kernel") and word[:1].isdigit():
            return word
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.splitlines()[0].strip() if done.stdout.strip() else None


def device_names(device: torch.device) -> dict[str, Any]:
    """The device the run trains on, every CUDA device's name, and the CPU's model."""
    import torch

    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else []
    )
    return {
        "training": str(device),
        "cuda": gpus,
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def data_fingerprint(manifest: Manifest) -> str:
    """sha256 of each image's path, label, split and size in bytes, in manifest order: the same
    data gives the same fingerprint on any machine it is copied to (a file missing or of
    another size changes it; content is not read, so a 100 GB set costs one stat per image)."""
    digest = hashlib.sha256()
    rows = zip(manifest.paths, manifest.labels.tolist(), manifest.splits, strict=True)
    for path, label, split in rows:
        try:
            size = (manifest.root / path).stat().st_size
        except OSError:
            size = -1
        digest.update(f"{path}\0{label}\0{split}\0{size}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def weights_source(weights: str) -> dict[str, Any]:
    """What --weights named; for a file, its sha256 as well."""
    if weights in ("none", "imagenet"):
        return {"weights": weights}
    digest = hashlib.sha256()
    try:
        with open(weights, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return {"weights": weights, "file_sha256": None}
    return {"weights": weights, "file_sha256": digest.hexdigest()}


def collect(
    *,
    configs: dict[str, Any],
    seed: int,
    device: torch.device,
    start_weights: str,
    weights: str,
    manifest: Manifest,
    world_size: int = 1,
) -> dict[str, Any]:
    """provenance.json's content. `start_weights` is the fingerprint (pactl.checkpoint) of the
    network before its first step: pretrained weights and the seeded head, together."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "command": list(sys.argv),
        "cwd": os.getcwd(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
        **cuda_versions(),
        "devices": device_names(device),
        "world_size": world_size,
        "seed": seed,
        "weights": {**weights_source(weights), "start_fingerprint": start_weights},
        "data": {
            "source": manifest.source,
            "images": len(manifest),
            "fingerprint": data_fingerprint(manifest),
        },
        "config": configs,
    }
