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
from typing import IO, Any, cast

import torch
from torch import nn

from pactl.config import ModelConfig, TrainConfig, read_config, to_dict
from pactl.errors import PactlError
from pactl.rules import MAX_EPOCHS, integer
from pactl.store.generations import atomic_path
from pactl.version import __version__

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
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        sink = _Sink(f)
        try:
            torch.save(payload, cast(IO[bytes], sink))
        except RuntimeError:
            if sink.error is not None:  # the real cause: a full disk, or Ctrl-C mid-write
                raise sink.error from None
            raise


class _Sink:
    """A file for torch.save that keeps what stopped a write: torch reports a failed or
    interrupted write as a RuntimeError that no longer says why ("unexpected pos 704 vs 598"),
    so a full disk would not read as one, and Ctrl-C would end in a traceback, not exit 130."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file
        self.error: BaseException | None = None

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except BaseException as e:  # OSError, KeyboardInterrupt
            self.error = e
            raise

    def flush(self) -> None:
        self.file.flush()


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
    check_payload(payload, path)
    return payload


def check_payload(payload: dict[str, Any], path: Path) -> None:
    """Every entry a loader uses, checked before any is used (a tampered image_size of 20000
    would ask for gigabytes first): one line naming the file and the entry. The recorded
    fingerprint is not trusted; open_network recomputes it from the weights."""
    version = payload.get("version")
    _expect(path, "version", version, "a positive integer", integer(1, 2**31).ok(version))
    if version > VERSION:  # type: ignore[operator]
        raise PactlError(f"{path} was written by a newer pactl (format version {version}); upgrade")
    kind = payload.get("kind")
    _expect(path, "kind", kind, "export or full", kind in ("export", "full"))
    _check_tensors(path, "model", payload.get("model"))
    from pactl.model import check_model_config

    config = read_config(ModelConfig, payload.get("model_config"), f"{path}: model_config")
    check_model_config(config, trained=False, name=lambda field: f"{path}: model_config.{field}")
    classes = payload.get("classes")
    _expect(path, "classes", classes, "a list of names", _is_list_of(classes, str))
    epoch, rule = payload.get("epoch"), integer(0, MAX_EPOCHS)
    _expect(path, "epoch", epoch, rule.wants, rule.ok(epoch))
    _expect(
        path,
        "metrics",
        payload.get("metrics"),
        "a mapping of names to numbers",
        _is_scores(payload.get("metrics")),
    )
    if "calibration" in payload:  # absent from checkpoints older than calibration
        from pactl.calibrate import read_calibration

        read_calibration(payload["calibration"], str(path))
    if kind == "full":
        check_training_state(payload, path)


def check_training_state(payload: dict[str, Any], path: Path) -> None:
    """The entries only checkpoint.pt has (--resume); whether they fit the run's network and
    optimiser is checked as they are loaded (pactl.training.loop.restore_state)."""
    _check_tensors(path, "proxies", payload.get("proxies"), empty=True)
    read_config(TrainConfig, payload.get("train_config"), f"{path}: train_config")
    for key in ("optimizer", "scheduler", "scaler"):
        _expect(path, key, payload.get(key), "a mapping", isinstance(payload.get(key), dict))
    rng = payload.get("rng")
    state = rng.get("torch") if isinstance(rng, dict) else None
    wanted = isinstance(state, torch.Tensor) and state.dtype == torch.uint8 and state.dim() == 1
    _expect(path, "rng", rng, "a mapping with the torch generator's state", wanted)
    best = payload.get("best")
    wanted = (
        isinstance(best, dict)
        and _is_int(best.get("epoch"))
        and best["epoch"] >= -1
        and _is_scores(best.get("metrics"))
        and _is_number(best.get("score", 0.0))
        and _is_number(best.get("then", 0.0))
    )
    _expect(path, "best", best, "a mapping of epoch, metrics and score", wanted)
    start = payload.get("start", {})
    _expect(path, "start", start, "a mapping of names to numbers", _is_scores(start))


def _expect(path: Path, key: str, value: Any, wants: str, ok: bool) -> None:
    if not ok:
        shown = (
            repr(value)
            if not isinstance(value, (dict, list, torch.Tensor))
            else type(value).__name__
        )
        raise PactlError(f"{path}: {key} must be {wants} (got {shown[:40]})")


def _check_tensors(path: Path, key: str, value: Any, empty: bool = False) -> None:
    """A mapping of names to tensors, floating ones finite (NaN weights embed to NaN)."""
    wanted = isinstance(value, dict) and (empty or len(value) > 0)
    _expect(path, key, value, "a mapping of names to tensors", wanted)
    for name, tensor in value.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise PactlError(f"{path}: {key} must map names to tensors (got {name!r:.40})")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise PactlError(f"{path}: {key} {name!r:.60} holds NaN or infinite values")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or isinstance(value, float)  # NaN is a metric of too few images


def _is_list_of(value: Any, kind: type) -> bool:
    return isinstance(value, list) and all(isinstance(v, kind) for v in value)


def _is_scores(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and _is_number(v) for k, v in value.items()
    )


def store_calibration(path: Path, calibration: dict[str, Any]) -> None:
    """Rewrite the checkpoint at `path` with its same-item calibration (atomically)."""
    payload = load(path)
    payload["calibration"] = calibration
    save(path, payload)


def load_model(path: Path) -> tuple[nn.Module, ModelConfig, dict[str, Any]]:
    """The model of a checkpoint (best.pt or checkpoint.pt) in eval mode, on the CPU."""
    import dataclasses

    from pactl.model import build_model

    payload = load(path)
    config = read_config(ModelConfig, payload["model_config"], f"{path}: model_config")
    # The checkpoint has all the weights: never fetch pretrained ones to overwrite them.
    model, built = build_model(dataclasses.replace(config, weights="none"))
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as e:
        reason = " ".join(str(e).split())[:160]
        raise PactlError(f"{path}: the weights do not fit its model_config ({reason})") from None
    if config.dimension not in (None, built.dimension):
        raise PactlError(
            f"{path}: model_config.dimension is {config.dimension} but the network makes "
            f"{built.dimension}-d vectors"
        )
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


def network_of(
    meta: dict[str, Any], checkpoint: ModelSource | None = None
) -> tuple[nn.Module, Network]:
    """The network that made the vectors or bundle of `meta` (or `checkpoint`, a file or a
    backbone's config, instead of the recorded one); a network with other weights than those
    recorded is refused."""
    recorded = meta.get("checkpoint")
    if checkpoint is None and recorded:
        checkpoint = Path(recorded)
    source: ModelSource = checkpoint or read_config(
        ModelConfig, meta.get("model_config"), "meta.json: model_config"
    )
    model, network = open_network(source)
    if network.fingerprint != meta.get("fingerprint"):
        named = source if isinstance(source, Path) else "the backbone"
        raise PactlError(
            f"{named} is not the network that made these vectors "
            f"(weights fingerprint {network.fingerprint[:12]} vs "
            f"{str(meta.get('fingerprint'))[:12]}); use the same checkpoint or weights, or "
            "embed again"
        )
    return model, network
