"""onnxruntime against pactl's CPU fast path, on the same images, one run.

    python -m bench onnx                          # 256 JPEGs, EfficientNet-Lite0 at 128
    python -m bench onnx --weights /tmp/pactl-real/lite0.pth --images 512

The network is the CPU default (timm:efficientnet_lite0 at 128 px, 512-d head), written as a
pactl checkpoint (random weights unless --weights names a state_dict, e.g. the one
bench/lite0_weights.py converts), then exported with pactl.interop.onnx_model.export_onnx. The
images are bench/bench_embed.py's synthetic photo-like 1024x768 JPEGs, decoded and transformed
once by pactl's loader, so both sides get the very same tensors and only the network differs:
pactl's side is pactl.embed.inference_model on the CPU (the prepared copy `pactl embed` runs:
TorchScript-frozen, or BatchNorm folded by torch.fx), NHWC as embed feeds it; onnxruntime's is
the exported file in an InferenceSession. Both get --threads intra-op threads; each runs one
untimed batch first, then every batch once. Agreement is the least cosine between the two sides'
vectors, on these images and, when scikit-image is installed, on its sample photos (the cat,
the coffee, the rocket, the astronaut).

Results (a markdown table) go to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_embed import ensure_images, log, subset_folder


def make_checkpoint(work: Path, args: argparse.Namespace) -> Path:
    from pactl import checkpoint as ckpt
    from pactl.config import ModelConfig
    from pactl.model import build_model

    config = ModelConfig(
        backbone=args.backbone,
        weights=args.weights,
        image_size=args.image_size,
        resize_size=args.resize_size,
    )
    net, resolved = build_model(config, seed=0)
    path = work / "best.pt"
    ckpt.save(path, ckpt.export_payload(ckpt.clean_state_dict(net), resolved, [], 0, {}))
    return path


def decoded_batches(folder: Path, config: Any, batch: int) -> list[Any]:
    """The images as pactl's loader gives them to the network: (B, 3, S, S) float tensors."""
    import torch

    from pactl.loaders import loader_for

    files = sorted(folder.rglob("*.jpg"))
    loader = loader_for(files, None, config, batch, 2, torch.device("cpu"))
    return [b.images for b in loader]


def timed(forward: Any, batches: list[Any]) -> tuple[float, float, np.ndarray]:
    """Wall and CPU seconds (this process, every thread) for every batch after an untimed
    first one, and the vectors."""
    forward(batches[0])
    start, cpu = time.perf_counter(), time.process_time()
    out = [forward(b) for b in batches]
    return time.perf_counter() - start, time.process_time() - cpu, np.concatenate(out)


def sample_photos(config: Any) -> Any:
    """scikit-image's sample photos through pactl's test transform, or None without it."""
    import importlib.util

    if importlib.util.find_spec("skimage") is None:
        return None
    import skimage.data
    import torch
    from PIL import Image

    from pactl.transforms import build_transform

    transform = build_transform(
        config.image_size, config.resize_size, config.mean, config.std, train=False,
        interpolation=config.interpolation,
    )  # fmt: skip
    names = ("chelsea", "coffee", "rocket", "astronaut")
    return torch.stack([transform(Image.fromarray(getattr(skimage.data, n)())) for n in names])


def least_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.min(np.sum(a.astype(np.float64) * b, axis=1)))


def run(args: argparse.Namespace, work: Path) -> list[str]:
    import torch

    from pactl.checkpoint import load_model
    from pactl.embed import inference_model
    from pactl.interop.onnx_model import export_onnx, open_onnx

    torch.set_num_threads(args.threads)
    checkpoint = make_checkpoint(work, args)
    model, config, _ = load_model(checkpoint)
    start = time.perf_counter()
    done = export_onnx(checkpoint, work / "model.onnx")
    export_s = time.perf_counter() - start
    log(f"exported in {export_s:.1f} s ({done.exporter} exporter, opset {done.opset})")
    cache = ensure_images(Path(args.work), args.images, seed=0)
    batches = decoded_batches(
        subset_folder(Path(args.work), cache, args.images), config, args.batch
    )
    fast = inference_model(model, config, torch.device("cpu"))
    network = open_onnx(work / "model.onnx", threads=args.threads)

    def pactl_side(images: Any) -> np.ndarray:
        with torch.inference_mode():
            return fast(images.contiguous(memory_format=torch.channels_last)).numpy()

    def onnx_side(images: Any) -> np.ndarray:
        return network(images.numpy())

    log(f"timing pactl's fast path ({type(fast).__name__}) and onnxruntime ...")
    pactl_s, pactl_cpu, pactl_vectors = timed(pactl_side, batches)
    onnx_s, onnx_cpu, onnx_vectors = timed(onnx_side, batches)
    n = len(pactl_vectors)
    photos = sample_photos(config)
    photo_cos = least_cosine(pactl_side(photos), onnx_side(photos)) if photos is not None else None
    weights = "random weights" if args.weights == "none" else Path(args.weights).name
    return [
        f"`python -m bench onnx {' '.join(sys.argv[1:])}`".replace(" `", "`"),
        "",
        f"{args.backbone} at {args.image_size} px ({weights}), {n} JPEGs 1024x768 decoded once, "
        f"batches of {args.batch}, {args.threads} threads; export {export_s:.1f} s "
        f"({done.exporter} exporter, opset {done.opset})",
        "",
        "| side | wall s | images/s | CPU s | speed vs pactl (wall, CPU) |",
        "| --- | --- | --- | --- | --- |",
        f"| pactl fast path ({type(fast).__name__}) | {pactl_s:.2f} | {n / pactl_s:.1f} | "
        f"{pactl_cpu:.2f} | 1.00x, 1.00x |",
        f"| onnxruntime {_version('onnxruntime')} | {onnx_s:.2f} | {n / onnx_s:.1f} | "
        f"{onnx_cpu:.2f} | {pactl_s / onnx_s:.2f}x, {pactl_cpu / onnx_cpu:.2f}x |",
        "",
        "largest 1 - cosine, onnxruntime vs pactl: "
        f"{1 - least_cosine(pactl_vectors, onnx_vectors):.1e} on these images"
        + (f", {1 - photo_cos:.1e} on scikit-image's 4 sample photos" if photo_cos else ""),
    ]


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backbone", default="timm:efficientnet_lite0")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--resize-size", type=int, default=146)
    parser.add_argument("--weights", default="none", help="none, or a state_dict file")
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "pactl-bench"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        print("\n".join(run(args, Path(scratch))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
