"""Self-describing checkpoints that load with `torch.load(..., weights_only=True)`.

checkpoint.pt holds the full training state (for --resume); best.pt is the slim export that
embed and query load. Both are dicts of tensors and plain Python values, written atomically.
"""

from __future__ import annotations

import hashlib
import pickle
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pactl import __version__
from pactl.config import ModelConfig, from_dict, to_dict
from pactl.errors import PactlError
from pactl.fsutil import atomic_path

FORMAT = "pactl.checkpoint"
VERSION = 1


def clean_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state_dict of the bare model: no `module.` (DDP) or `_orig_mod.` (compile) prefixes."""
    bare: Any = model
    while hasattr(bare, "module") or hasattr(bare, "_orig_mod"):
        bare = getattr(bare, "module", None) or bare._orig_mod
    return {k: v.detach().cpu() for k, v in bare.state_dict().items()}


def fingerprint(state_dict: dict[str, torch.Tensor]) -> str:
    """sha256 of the weights (names, dtypes, shapes and bytes), independent of file layout."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(
            tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        )
    return digest.hexdigest()


def export_payload(
    state: dict[str, torch.Tensor],
    model_config: ModelConfig,
    classes: list[str],
    epoch: int,
    metrics: dict[str, float],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The slim export (best.pt): enough to rebuild and run the model, nothing for training."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "kind": "export",
        "pactl_version": __version__,
        "torch_version": str(torch.__version__),  # a str subclass that weights_only refuses
        "model": state,
        "model_config": to_dict(model_config),
        "fingerprint": fingerprint(state),
        "classes": classes,
        "epoch": epoch,
        "metrics": metrics,
        **(extra or {}),
    }


def save(path: Path, payload: dict[str, Any]) -> None:
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def load(path: Path) -> dict[str, Any]:
    """Load and validate a pactl checkpoint; every failure is one clear PactlError."""
    if not path.is_file():
        raise PactlError(f"checkpoint {path} not found")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "Unsupported global" not in str(e) and "GLOBAL" not in str(e):
            raise PactlError(f"{path} is truncated or not a torch file ({str(e)[:80]})") from None
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = f" ({found.group(1)})" if found else ""
        raise PactlError(
            f"refusing to load {path}: it holds Python objects beyond tensors and plain "
            f"values{what}, which could run code"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        raise PactlError(f"{path} is truncated or not a torch file ({str(e)[:120]})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise PactlError(f"{path} is not a pactl checkpoint (no 'format: {FORMAT}' entry)")
    if payload.get("version", 0) > VERSION:
        raise PactlError(
            f"{path} was written by a newer pactl (format version {payload['version']}); upgrade"
        )
    return payload


def load_model(path: Path) -> tuple[nn.Module, ModelConfig, dict[str, Any]]:
    """The model of a checkpoint (best.pt or checkpoint.pt) in eval mode, on the CPU."""
    import dataclasses

    from pactl.model import build_model

    payload = load(path)
    config = from_dict(ModelConfig, payload["model_config"])
    # The checkpoint has all the weights: never fetch pretrained ones to overwrite them.
    model, _ = build_model(dataclasses.replace(config, weights="none"))
    model.load_state_dict(payload["model"])
    model.eval()
    return model, config, payload


@dataclass(frozen=True)
class Network:
    """Which network made a set of vectors: recorded in meta.json, checked at query time."""

    config: ModelConfig  # with the backbone's preprocessing filled in
    fingerprint: str  # sha256 of the weights
    checkpoint: str | None  # absolute path of the checkpoint; None: the backbone as published


# What to embed with: a checkpoint file, or a backbone's config (its published or given weights
# and no head: the pooled features, the baseline before any training).
ModelSource = Path | ModelConfig


def open_network(source: ModelSource) -> tuple[nn.Module, Network]:
    """The network of a checkpoint or of a backbone config, in eval mode, on the CPU."""
    if isinstance(source, Path):
        model, config, payload = load_model(source)
        # From the weights themselves: a recorded fingerprint could belong to other weights.
        return model, Network(config, fingerprint(payload["model"]), str(source.resolve()))
    from pactl.model import build_model

    model, config = build_model(source)
    model.eval()
    return model, Network(config, fingerprint(clean_state_dict(model)), None)


def network_of(meta: dict[str, Any], checkpoint: Path | None = None) -> tuple[nn.Module, Network]:
    """The network that made the vectors or bundle of `meta` (or `checkpoint` instead of the
    recorded one); a network with other weights than those recorded is refused."""
    recorded = meta.get("checkpoint")
    if checkpoint is None and recorded:
        checkpoint = Path(recorded)
    source: ModelSource = checkpoint or from_dict(ModelConfig, meta["model_config"])
    model, network = open_network(source)
    if network.fingerprint != meta.get("fingerprint"):
        raise PactlError(
            f"{checkpoint or 'the backbone'} is not the network that made these vectors "
            f"(weights fingerprint {network.fingerprint[:12]} vs "
            f"{str(meta.get('fingerprint'))[:12]}); use the same checkpoint or weights, or "
            "embed again"
        )
    return model, network
