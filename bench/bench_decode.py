"""What JPEG draft decoding changes: pixels and embeddings, draft against full decoding.

Evaluation (training's per-epoch evaluation and `pactl eval`) decodes every image in full, as
the official code does; `pactl embed`/`query` let libjpeg decode large JPEGs at 1/2, 1/4 or 1/8
scale (each side still >= the resize size), which is several times cheaper. This measures the
price: per image, the mean and largest absolute difference of the network's input tensor (in
[0, 1] pixel units) and the cosine between the two embeddings.

    python -m bench decode --weights /tmp/pactl-real/lite0.pth     # the CPU default net
    python -m bench decode --image-size 224 --weights ...

Images: scikit-image's sample photos (`pip install scikit-image`) and, when installed, the
wallpapers of Debian's gnome-backgrounds (`apt-get install gnome-backgrounds`), each saved as a
JPEG (quality 90) at its own size. Table to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from pactl.checkpoint import open_network
from pactl.config import ModelConfig
from pactl.console import QUIET
from pactl.embed import embed_files
from pactl.loaders import loader_for

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "motorcycle_left")
WALLPAPERS = Path("/usr/share/backgrounds/gnome")


def jpegs(folder: Path) -> list[Path]:
    """The sample photos and wallpapers as JPEG files in `folder`."""
    from PIL import Image

    sources: list[tuple[str, Image.Image]] = []
    try:
        import skimage.data

        for name in PHOTOS:
            if hasattr(skimage.data, name):
                sources.append((name, Image.fromarray(getattr(skimage.data, name)())))
    except ImportError:
        print("scikit-image not installed: no sample photos", file=sys.stderr)
    for path in sorted(WALLPAPERS.glob("*.webp")):
        sources.append((path.stem, Image.open(path)))
    files = []
    for name, image in sources:
        out = folder / f"{name}.jpg"
        image.convert("RGB").save(out, quality=90)
        files.append(out)
    return files


def inputs(files: list[Path], config: ModelConfig, draft: bool) -> torch.Tensor:
    loader = loader_for(files, None, config, len(files), 0, torch.device("cpu"), draft=draft)
    return next(iter(loader)).images


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backbone", default="timm:efficientnet_lite0")
    parser.add_argument("--weights", default="none")
    parser.add_argument("--image-size", type=int, default=128)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        files = jpegs(Path(tmp))
        if not files:
            sys.exit("no images to measure")
        config = ModelConfig(
            backbone=args.backbone,
            weights=args.weights,
            embedding_dim=0,
            image_size=args.image_size,
        )
        model, network = open_network(config)
        full, draft = (inputs(files, network.config, d) for d in (False, True))
        pixels = (full - draft).abs() * torch.tensor(network.config.std).view(1, 3, 1, 1)
        vectors = [
            embed_files(model, files, network.config, torch.device("cpu"), QUIET, draft=d).vectors
            for d in (False, True)
        ]
        from PIL import Image

        print("| image | size | mean abs pixel diff | max abs pixel diff | cosine |")
        print("| --- | --- | ---: | ---: | ---: |")
        cosines = np.sum(vectors[0] * vectors[1], axis=1)
        for i, f in enumerate(files):
            with Image.open(f) as im:
                size = f"{im.width}x{im.height}"
            mean, peak = float(pixels[i].mean()), float(pixels[i].max())
            print(f"| {f.stem} | {size} | {mean:.4f} | {peak:.4f} | {cosines[i]:.5f} |")
        print(
            f"\n{len(files)} JPEGs, {args.backbone} ({args.weights}) at {args.image_size} px "
            f"(resize {network.config.resize_size}, {network.config.interpolation}): cosine "
            f"min {cosines.min():.5f}, mean {cosines.mean():.5f}"
        )


if __name__ == "__main__":
    main()
