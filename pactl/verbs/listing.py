"""`pactl list`: the names each registry knows (backbones, presets, losses, datasets) as rows."""

from __future__ import annotations

from pactl.recipe import Preset


def registry_rows(what: str) -> tuple[list[str], list[list[str]]]:
    """`pactl list WHAT`: a header and one row per name the registry knows, in its order."""
    return _LISTINGS[what]()


def _backbone_rows() -> tuple[list[str], list[list[str]]]:
    from pactl.backbones import BACKBONES

    return ["name"], [[name] for name in BACKBONES] + [["timm:<model>"]]


def _preset_rows() -> tuple[list[str], list[list[str]]]:
    from pactl.recipe import PRESETS

    header = ["name", "backbone", "weights", "image_size", "epochs", "batch_size", "lr", "loss"]
    return [*header, "source"], [_preset_row(name, p) for name, p in PRESETS.items()]


def _preset_row(name: str, preset: Preset) -> list[str]:
    model, train = preset.model, preset.train
    sizes = [str(model.image_size), str(train.epochs), str(train.batch_size), f"{train.lr:g}"]
    return [name, model.backbone, model.weights, *sizes, train.loss, preset.source]


def _loss_rows() -> tuple[list[str], list[list[str]]]:
    from pactl.losses import LOSSES

    return ["name"], [[name] for name in LOSSES]


def _dataset_rows() -> tuple[list[str], list[list[str]]]:
    from pactl.datasets.catalog import CATALOG, status_rows

    def how(name: str, manual: bool) -> str:
        return "bundled" if CATALOG[name].offline else "--from (manual)" if manual else "download"

    header = ["name", "size", "classes", "images", "present", "how", "licence"]
    return header, [
        [row.name, row.size, str(row.classes), str(row.images), "yes" if row.present else "no"]
        + [how(row.name, row.manual), row.licence]
        for row in status_rows()
    ]


_LISTINGS = {
    "backbones": _backbone_rows,
    "presets": _preset_rows,
    "losses": _loss_rows,
    "datasets": _dataset_rows,
}
