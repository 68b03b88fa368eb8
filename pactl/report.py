"""Pictures: training curves and retrieval grids."""

from __future__ import annotations

import csv
from pathlib import Path

from pactl.fsutil import atomic_path


def plot_curves(metrics_csv: Path, out: Path) -> None:
    """curves.png: training loss, and Recall@1 per epoch from epoch 0 (before training) on, of
    the test classes and of the validation classes when there are any."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(metrics_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    trained = [(int(r["epoch"]), float(r["loss"])) for r in rows if r.get("loss")]
    if trained:
        left.plot(*zip(*trained, strict=True), marker="o")
    left.set(title="training loss", xlabel="epoch")
    for key, label, colour in (
        ("recall@1", "test classes", "tab:green"),
        ("val_recall@1", "validation classes", "tab:blue"),
    ):
        evaluated = [(int(r["epoch"]), float(r[key])) for r in rows if r.get(key)]
        if evaluated:
            right.plot(*zip(*evaluated, strict=True), marker="o", color=colour, label=label)
    right.set(title="Recall@1 (epoch 0: before training)", xlabel="epoch", ylim=(0, 1))
    right.legend(loc="lower right")
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


GREEN, RED, GREY = (40, 170, 60), (210, 40, 40), (150, 150, 150)


def retrieval_grid(
    rows: list[tuple[str, str | None, list[tuple[str, str, float]]]],
    out: Path,
    thumb: int = 112,
    border: int = 5,
) -> None:
    """A picture like the paper's Figure 4: each query, then its hits left to right.

    `rows` holds (query path, query label or None, [(hit path, hit label, score), ...]); a hit
    is framed green when its label equals the query's, red when not, grey when unknown.
    """
    from PIL import Image, ImageDraw

    from pactl.images import ImageError, load_image

    cell = thumb + 2 * border
    columns = 1 + max((len(hits) for _, _, hits in rows), default=0)
    sheet = Image.new("RGB", (columns * cell, max(len(rows), 1) * (cell + 14)), "white")
    draw = ImageDraw.Draw(sheet)

    def paste(path: str, x: int, y: int, frame: tuple[int, int, int], caption: str) -> None:
        draw.rectangle([x, y, x + cell - 1, y + cell - 1], fill=frame)
        try:
            image = load_image(Path(path), target_size=thumb)
            image.thumbnail((thumb, thumb))
            sheet.paste(image, (x + border, y + border))
        except ImageError:
            draw.line([x, y, x + cell, y + cell], fill="black")
        draw.text((x + 2, y + cell), caption, fill="black")

    for r, (query, label, hits) in enumerate(rows):
        y = r * (cell + 14)
        paste(query, 0, y, (30, 30, 30), f"query {label or ''}".strip())
        for c, (path, hit_label, score) in enumerate(hits, start=1):
            frame = GREY if label is None else GREEN if hit_label == label else RED
            paste(path, c * cell, y, frame, f"{hit_label} {score:.2f}")
    with atomic_path(out) as tmp:
        sheet.save(tmp, format="PNG")
