"""What every backbone shares: the Backbone record, and reading a weights file into a network.

`--weights` means the same for every backbone: `none` (random initialisation), `imagenet` (the
published ImageNet weights, fetched once into a cache) or a PATH to a state_dict file, loaded
into the whole network before its classifier is cut off, with every backbone key matched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pactl.errors import PactlError

# First key components of classifiers an embedding never uses: a file may carry them.
CLASSIFIER_KEYS = ("fc", "classifier", "last_linear", "head", "aux1", "aux2", "AuxLogits")


@dataclass(frozen=True)
class Backbone:
    module: nn.Module  # images (B, 3, H, W) -> features (B, feat_dim, h, w)
    feat_dim: int
    mean: tuple[float, ...]  # the normalisation its weights expect, in [0, 1] units
    std: tuple[float, ...]
    interpolation: str = "bilinear"  # resize filter its weights were evaluated with
    crop_pct: float = 0.875  # test-time crop / resize (224 / 256)


# constructor(weights) -> Backbone, weights: none | imagenet | path to a state_dict file
Constructor = Callable[[str], Backbone]


@contextmanager
def fetching(what: str, url: str) -> Iterator[None]:
    """Turns a failed download inside the block into one line: what, where to put it by hand."""
    try:
        yield
    except OSError as error:  # URLError and HTTPError are OSErrors
        cache = Path(torch.hub.get_dir()) / "checkpoints"
        reason = str(getattr(error, "reason", None) or error).splitlines()[0][:120]
        raise PactlError(
            f"cannot download the {what} ({reason}): fetch {url} by hand into {cache}/, "
            "or use --weights none|PATH"
        ) from None


def read_state_file(path: Path) -> dict[str, torch.Tensor]:
    """A state_dict from a torch or safetensors file; `state_dict`/`model` wrappers and DDP's
    `module.` prefix are taken off."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state: Any = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for bad files; all mean the same here
        first = (str(e).splitlines() or [type(e).__name__])[0][:160]
        raise PactlError(f"{path} is not a loadable state_dict: {first}") from None
    for wrapper in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise PactlError(f"{path} is not a state_dict (a dict of tensors)")
    if state and all(k.startswith("module.") for k in state):
        state = {k.removeprefix("module."): v for k, v in state.items()}
    return state


def load_weights_file(
    module: nn.Module,
    weights: str,
    adapt: Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor]], None] | None = None,
) -> None:
    """Load the state_dict file `weights` into `module` (nothing for none/imagenet).

    Every key of the module must be in the file with its shape; the file may carry a classifier
    (CLASSIFIER_KEYS) the module lacks. Anything else is one PactlError naming the first few
    keys. `adapt(file_state, module_state)` may fix the file's layout in place first.
    """
    if weights in ("none", "imagenet"):
        return
    path = Path(weights)
    state = read_state_file(path)
    own = module.state_dict()
    if adapt is not None:
        adapt(state, own)
    missing = [k for k in own if k not in state and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in state if k not in own and k.split(".")[0] not in CLASSIFIER_KEYS]
    wrong = [
        f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}"
        for k, v in own.items()
        if k in state and state[k].shape != v.shape
    ]
    for problem, keys in (
        ("lacks backbone weights", missing),
        ("has weights this backbone does not have", unexpected),
        ("has weights of another shape", wrong),
    ):
        if keys:
            more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
            raise PactlError(
                f"{path} does not fit this backbone: it {problem}: {', '.join(keys[:3])}{more}"
            )
    module.load_state_dict({k: state[k] for k in own if k in state}, strict=False)
