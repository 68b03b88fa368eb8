"""A checkpoint's network as an ONNX file, and such a file run by onnxruntime.

The file takes `images`, (batch, 3, S, S) float32: RGB in [0, 1], resized and centre-cropped,
then normalised with the mean and std its metadata names; it gives `embeddings`, (batch, D)
float32 unit rows, the vectors `pactl embed` writes. The batch axis is dynamic. Its
metadata_props say what it is and how to feed it: `pactl.format` and `pactl.version`,
`pactl.fingerprint` (of the checkpoint's weights, as bundles record it), `pactl.model_config`
and `pactl.preprocessing` (JSON), so a reader can check a file against a bundle before use.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pactl.config import (
    ModelConfig,
    OnnxConfig,
    check_options,
    read_config,
    to_dict,
)
from pactl.console import QUIET, Reporter
from pactl.errors import PactlError
from pactl.interop import require
from pactl.version import __version__

ONNX_FORMAT = "pactl.onnx"
ONNX_VERSION = 1
INPUT, OUTPUT = "images", "embeddings"
EXTRA = ("onnx", "onnx", "onnxruntime")  # extra, modules


@dataclass(frozen=True)
class Exported:
    path: Path
    opset: int
    dimension: int  # D of the embeddings
    image_size: int  # S of the images
    fingerprint: str
    worst_cosine: float  # the least cosine, onnxruntime against torch, on the check images
    exporter: str  # torch.onnx's "torchscript" or "dynamo" exporter


def export_onnx(
    checkpoint: Path, out: Path, config: OnnxConfig = OnnxConfig(), reporter: Reporter = QUIET
) -> Exported:
    """Write the network of `checkpoint` (best.pt) to `out` as ONNX, with its preprocessing in
    the metadata, once onnxruntime has given torch's vectors on random images (within
    `config.tolerance` cosine); a file that does not is never written."""
    import torch

    from pactl.checkpoint import fingerprint, load_model
    from pactl.store.generations import atomic_path

    require("pactl export --format onnx", *EXTRA)
    check_options(config)
    model, model_cfg, payload = load_model(checkpoint)
    side = model_cfg.image_size
    generator = torch.Generator().manual_seed(0)
    example = torch.rand(2, 3, side, side, generator=generator)
    weights_print = fingerprint(payload["model"])
    with atomic_path(out) as tmp:
        reporter.log(f"exporting {checkpoint} ({model_cfg.backbone}, {side} px) to ONNX")
        exporter = _export(model, example, tmp, config.opset)
        _write_metadata(tmp, model_cfg, weights_print)
        checks = torch.rand(config.check_images, 3, side, side, generator=generator)
        worst = agreement(model, open_onnx(tmp), checks.numpy())
        if worst < 1 - config.tolerance:
            raise PactlError(
                f"onnxruntime's vectors differ from torch's (least cosine {worst:.6f}): the "
                f"{model_cfg.backbone} network does not export faithfully at opset {config.opset}"
            )
    dim = model_cfg.dimension or model_cfg.embedding_dim
    return Exported(out, config.opset, dim, side, weights_print, worst, exporter)


def _export(model: Any, example: Any, path: Path, opset: int) -> str:
    """torch.onnx's TorchScript exporter (seconds; the torch.export one takes a minute for
    EfficientNet-Lite0 on 2 cores and gives the same graph), or, where torch has dropped it,
    the torch.export one (onnxscript, in the extra). Returns which one wrote `path`."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation note
        try:
            torch.onnx.export(
                model, (example,), str(path), dynamo=False, opset_version=opset,
                input_names=[INPUT], output_names=[OUTPUT],
                dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}},
            )  # fmt: skip
            return "torchscript"
        except (TypeError, RuntimeError, AttributeError, NotImplementedError):
            pass  # gone from this torch, or the network is beyond it: the other exporter
    require("exporting with torch.export", "onnx", "onnxscript")
    batch = torch.export.Dim("batch", min=1)
    program = torch.onnx.export(
        model, (example,), dynamo=True, opset_version=opset, input_names=[INPUT],
        output_names=[OUTPUT], dynamic_shapes={"images": {0: batch}}, external_data=False,
    )  # fmt: skip
    assert program is not None
    program.save(str(path))
    return "dynamo"


def preprocessing(config: ModelConfig) -> dict[str, Any]:
    """What a caller must do to an image before the network, in words a non-pactl reader
    follows (pactl.images' test transform)."""
    return {
        "input": f"{INPUT}: float32 (batch, 3, {config.image_size}, {config.image_size}), RGB",
        "resize": config.resize_size or config.image_size,  # shorter side, then centre crop
        "crop": config.image_size,
        "interpolation": config.interpolation or "bilinear",
        "scale": "pixel / 255",
        "mean": list(config.mean or ()),
        "std": list(config.std or ()),
        "output": f"{OUTPUT}: float32 (batch, {config.dimension}), L2-normalised rows",
    }


def _write_metadata(path: Path, config: ModelConfig, fingerprint: str) -> None:
    import onnx

    model = onnx.load(str(path))
    props = {
        "pactl.format": ONNX_FORMAT,
        "pactl.version": str(ONNX_VERSION),
        "pactl.pactl_version": __version__,
        "pactl.fingerprint": fingerprint,
        "pactl.model_config": json.dumps(to_dict(config)),
        "pactl.preprocessing": json.dumps(preprocessing(config)),
    }
    del model.metadata_props[:]
    for key, value in props.items():
        model.metadata_props.add(key=key, value=value)
    model.doc_string = f"pactl {config.backbone} embedding network; see pactl.preprocessing"
    onnx.save(model, str(path))


@dataclass
class OnnxNetwork:
    """An ONNX file pactl exported, open in onnxruntime."""

    path: Path
    session: Any  # onnxruntime.InferenceSession
    config: ModelConfig  # from the metadata, preprocessing filled in
    fingerprint: str

    @property
    def dimension(self) -> int:
        return int(self.config.dimension or self.config.embedding_dim)

    def __call__(self, images: np.ndarray) -> np.ndarray:
        """(B, 3, S, S) float32 images -> (B, D) float32 unit vectors."""
        x = np.ascontiguousarray(images, dtype=np.float32)
        return np.asarray(self.session.run([OUTPUT], {INPUT: x})[0], dtype=np.float32)


def open_onnx(path: Path, threads: int = 0) -> OnnxNetwork:
    """An ONNX file of `pactl export` in onnxruntime (`threads` 0: its default); one of any
    other origin, or whose graph does not take the images its metadata names, is refused."""
    require("an ONNX network", *EXTRA)
    import onnxruntime as ort

    meta = _pactl_metadata(path)
    config = read_config(ModelConfig, meta["model_config"], f"{path}: pactl.model_config")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3  # errors only: its warnings are not the user's
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own exception types for bad graphs
        reason = (str(e).splitlines() or [type(e).__name__])[0][:120]
        raise PactlError(f"{path}: onnxruntime cannot load it ({reason})") from None
    inputs = {i.name: i.shape for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    side = config.image_size
    shape = inputs.get(INPUT)
    if (
        shape is None
        or len(shape) != 4
        or list(shape[1:]) != [3, side, side]
        or OUTPUT not in outputs
    ):
        raise PactlError(
            f"{path}: its graph takes {inputs} and gives {outputs}, not {INPUT} "
            f"(batch, 3, {side}, {side}) -> {OUTPUT} as its metadata says: export it again"
        )
    return OnnxNetwork(path, session, config, meta["fingerprint"])


def _pactl_metadata(path: Path) -> dict[str, Any]:
    """pactl's metadata_props of an ONNX file (read without its weights), checked."""
    import onnx

    if not path.is_file():
        raise PactlError(f"ONNX file {path} not found")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf's DecodeError and others
        raise PactlError(f"{path} is not an ONNX file ({str(e).splitlines()[0][:100]})") from None
    props = {p.key: p.value for p in model.metadata_props}
    if props.get("pactl.format") != ONNX_FORMAT or "pactl.fingerprint" not in props:
        raise PactlError(
            f"{path} is not a network pactl exported (no {ONNX_FORMAT} metadata): export one "
            "with `pactl export CHECKPOINT --format onnx`"
        )
    if props.get("pactl.version") != str(ONNX_VERSION):
        raise PactlError(
            f"{path} has pactl.version {props.get('pactl.version')!r}: export it again"
        )
    try:
        config = json.loads(props["pactl.model_config"])
    except (KeyError, ValueError):
        raise PactlError(f"{path}: pactl.model_config is missing or not JSON") from None
    return {"fingerprint": props["pactl.fingerprint"], "model_config": config}


def check_same_network(network: OnnxNetwork, meta: dict[str, Any], what: str) -> None:
    """Refuse an ONNX network other than the one that made `what` (its meta.json): one line
    naming what differs (dimension, crop, normalisation, weights)."""
    theirs = read_config(ModelConfig, meta.get("model_config"), f"{what}: model_config")
    mine = network.config
    differs = [
        f"{name} {a} vs {b}"
        for name, a, b in (
            ("dimension", network.dimension, meta.get("dimension")),
            ("backbone", mine.backbone, theirs.backbone),
            ("crop", mine.image_size, theirs.image_size),
            ("mean", mine.mean, theirs.mean),
            ("std", mine.std, theirs.std),
        )
        if a != b and b is not None
    ]
    if network.fingerprint != meta.get("fingerprint"):
        differs.append(
            f"weights fingerprint {network.fingerprint[:12]} vs {str(meta.get('fingerprint'))[:12]}"
        )
    if differs:
        raise PactlError(
            f"{network.path} is another network than the one that made {what} "
            f"({'; '.join(differs)}): export that checkpoint with `pactl export`"
        )


def agreement(model: Any, network: OnnxNetwork, images: np.ndarray) -> float:
    """The least cosine between torch's and onnxruntime's vectors of the same images."""
    import torch

    with torch.no_grad():
        expected = model(torch.from_numpy(np.ascontiguousarray(images))).numpy()
    got = network(images)
    return float(np.min(np.sum(expected.astype(np.float64) * got, axis=1)))
