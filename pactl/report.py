"""Pictures: training curves, the same-item precision-recall curve and retrieval grids."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pactl.errors import UsageError
from pactl.store.generations import atomic_path

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from PIL import Image, ImageDraw

    from pactl.calibrate import Calibration

from pactl.runs import SELECTION_KEYS, SELECTION_NAMES, best_epoch, read_metrics, run_selection

# The picture format is the one the file name says: a .jpg holding PNG bytes confuses viewers.
IMAGE_FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP"}
SAVE_OPTIONS: dict[str, dict[str, Any]] = {"JPEG": {"quality": 92}, "WEBP": {"quality": 90}}


def check_image_path(path: Path) -> str:
    """The Pillow format that `path`'s extension names. Any other extension is refused, naming
    the supported ones: cheap enough to call before the work whose result it will hold."""
    suffix = path.suffix.lower()
    if suffix not in IMAGE_FORMATS:
        given = f"'{path.suffix}'" if path.suffix else "no extension"
        raise UsageError(
            f"{path}: cannot tell the picture format from {given}; "
            f"name it {', '.join(IMAGE_FORMATS)}"
        )
    fmt = IMAGE_FORMATS[suffix]
    if fmt == "WEBP":
        from PIL import features

        if not features.check("webp"):
            raise UsageError(f"{path}: this Pillow cannot write WebP; use .png or .jpg")
    return fmt


# ---------------------------------------------------------------------------- training curves


def plot_curves(
    metrics_csv: Path, out: Path, selection: str | None = None, run_name: str | None = None
) -> None:
    """curves.png: training loss, Recall@1 and MAP@R per epoch from epoch 0 (before training)
    on, of the test classes and of the validation classes when there are any, with the epoch
    best.pt holds marked. `selection` (val | test | last) and `run_name` default to what the run
    folder holding `metrics_csv` says."""
    fmt = check_image_path(out)
    rows = read_metrics(metrics_csv)
    if not rows:
        return
    run_dir = metrics_csv.absolute().parent
    columns = set().union(*rows)
    chosen = selection or run_selection(run_dir, columns)
    fig = curves_figure(rows, run_name or run_dir.name, chosen)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format=fmt.lower(), dpi=100)


def save_figure(fig: Figure, out: Path, dpi: int = 100) -> None:
    """Write a matplotlib Figure atomically in the format `out`'s extension names."""
    fmt = check_image_path(out)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format=fmt.lower(), dpi=dpi)


def plot_calibration(calibration: Calibration, out: Path) -> None:
    """calibration.png: precision against recall of "cosine >= t" on the held-out pairs, with
    the calibrated threshold marked."""
    fmt = check_image_path(out)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.2, 4.0), layout="constrained")
    ax = fig.subplots()
    _, precision, recall = zip(*calibration.curve, strict=True)
    ax.plot(recall, precision, color="tab:blue", label="cosine >= t")
    ax.axhline(calibration.precision, color="tab:gray", linestyle=":", label="target precision")
    if calibration.threshold is not None:
        ax.plot(
            [calibration.recall],
            [calibration.measured],
            "o",
            color="tab:red",
            label=f"t = {calibration.threshold:.4f}",
        )
    ax.set_xlabel(f"recall (same-class pairs of the {calibration.split} classes)")
    ax.set_ylabel("precision")
    ax.set_xlim(0, 1)
    ax.legend(loc="lower left", fontsize="small")
    ax.set_title(f"same-item threshold at precision {calibration.precision:g}")
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format=fmt.lower(), dpi=100)


def zoom(values: Sequence[float]) -> tuple[float, float]:
    """y-limits that fit `values` with a margin, inside [0, 1]: Recall@1 going from 0.96 to
    0.98 shows as a climb, where a 0-1 axis draws it flat."""
    low, high = min(values), max(values)
    pad = max(0.15 * (high - low), 0.01)
    return max(0.0, low - pad), min(1.0, high + pad)


def curves_figure(rows: Sequence[dict[str, float]], run_name: str, selection: str) -> Figure:
    """The curves as a matplotlib Figure (no pyplot: no global figure state to close)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    with_map = any("map@r" in r or "val_map@r" in r for r in rows)
    panels = 3 if with_map else 2
    # Fixed margins rather than layout="constrained", which lays the text out several times and
    # took 0.3 of the 0.5 s a sweep point spent drawing this (docs/benchmarks.md).
    fig = Figure(figsize=(4.2 * panels, 3.6))
    fig.subplots_adjust(left=0.2 / panels, right=0.99, bottom=0.14, top=0.84, wspace=0.25)
    axes = list(fig.subplots(1, panels, sharex=True))  # epochs line up
    _series(axes[0], rows, [("loss", "training loss", "tab:orange")], zoomed=False)
    axes[0].set_title("training loss")
    pairs = [("test classes", "tab:green"), ("validation classes", "tab:blue")]
    for ax, name, keys in (
        (axes[1], "Recall@1 (epoch 0: before training)", ("recall@1", "val_recall@1")),
        *([(axes[2], "MAP@R", ("map@r", "val_map@r"))] if with_map else []),
    ):
        _series(ax, rows, [(k, *p) for k, p in zip(keys, pairs, strict=True)], zoomed=True)
        ax.set_title(name)
    best = best_epoch(rows, selection)
    title = run_name
    if best is not None:
        _mark_best(axes, rows, best, selection)
        title = f"{run_name}: best.pt is epoch {best} ({SELECTION_NAMES[selection]})"
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
        if ax.get_lines():
            ax.legend(loc="best", fontsize="small")
    fig.suptitle(title)
    return fig


def _series(
    ax: Axes, rows: Sequence[dict[str, float]], series: list[tuple[str, str, str]], zoomed: bool
) -> None:
    shown: list[float] = []
    for key, label, colour in series:
        points = [(int(r["epoch"]), r[key]) for r in rows if key in r]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", color=colour, label=label)
            shown += [v for _, v in points]
    if zoomed and shown:
        ax.set_ylim(*zoom(shown))


def _mark_best(
    axes: list[Axes], rows: Sequence[dict[str, float]], best: int, selection: str
) -> None:
    """A dashed line at the best epoch on every panel, and a star on the Recall@1 that chose it
    (the validation curve when there is one, for `last`)."""
    for ax in axes:
        ax.axvline(best, color="0.4", linestyle="--", linewidth=1, gid="best-epoch")
    row = next(r for r in rows if int(r["epoch"]) == best)
    keys = [SELECTION_KEYS[selection]] if selection in SELECTION_KEYS else []
    key = next((k for k in (*keys, "val_recall@1", "recall@1") if k in row), None)
    if key is not None:
        axes[1].plot(
            [best],
            [row[key]],
            marker="*",
            markersize=14,
            color="gold",
            markeredgecolor="black",
            linestyle="none",
            label=f"best.pt (epoch {best})",
            gid="best-point",
        )


# ---------------------------------------------------------------------------- retrieval grid

GREEN, RED, GREY = (40, 170, 60), (210, 40, 40), (150, 150, 150)
QUERY_FRAME = (30, 30, 30)
TILE_BACKGROUND = (235, 235, 235)  # shows where an image of another aspect ratio ends
CAPTION_HEIGHT = 14
CAPTION_FONT = 12  # the largest size whose descenders fit the caption row; 10 squeezes spaces
NEAREST_FROM = 2.0  # enlarged this much or more, pixels are drawn as crisp blocks


def retrieval_grid(
    rows: list[tuple[str, str | None, list[tuple[str, str, float]]]],
    out: Path,
    thumb: int = 112,
    border: int = 5,
) -> None:
    """A picture like the paper's Figure 4: each query, then its hits left to right, in the
    format `out`'s extension names (checked first, before any image is read).

    `rows` holds (query path, query label or None, [(hit path, hit label, score), ...]); a hit
    is framed green when its label equals the query's, red when not, grey when unknown.
    """
    fmt = check_image_path(out)
    from PIL import Image, ImageDraw

    cell = thumb + 2 * border
    columns = 1 + max((len(hits) for _, _, hits in rows), default=0)
    height = max(len(rows), 1) * (cell + CAPTION_HEIGHT)
    sheet = Image.new("RGB", (columns * cell, height), "white")
    draw = ImageDraw.Draw(sheet)
    draw.font = caption_font(CAPTION_FONT)
    for r, (query, label, hits) in enumerate(rows):
        y = r * (cell + CAPTION_HEIGHT)
        _tile(sheet, draw, query, (0, y), thumb, border, QUERY_FRAME, (label, None))
        for c, (path, hit_label, score) in enumerate(hits, start=1):
            frame = GREY if label is None else GREEN if hit_label == label else RED
            _tile(sheet, draw, path, (c * cell, y), thumb, border, frame, (hit_label, score))
    save_image(sheet, out, fmt)


# (path, caption's label, score) of one tile of `pactl audit`'s contact sheet
SheetTile = tuple[str, str, float]


def suspect_sheet(
    rows: list[tuple[SheetTile, list[SheetTile], list[SheetTile]]],
    out: Path,
    shown: int = 3,
    thumb: int = 96,
    border: int = 5,
    notes: Sequence[str] = (),
) -> None:
    """`pactl audit`'s contact sheet: per suspect (framed black, captioned `given→suggested`
    and its doubt), its `shown` nearest images carrying the given label (framed red), then its
    nearest carrying the suggested one (framed green), each captioned with label and cosine;
    `notes[r]`, where given, written across the top of row r's suspect (its evidence)."""
    fmt = check_image_path(out)
    from PIL import Image, ImageDraw

    cell = thumb + 2 * border
    height = max(len(rows), 1) * (cell + CAPTION_HEIGHT)
    sheet = Image.new("RGB", ((1 + 2 * shown) * cell, height), "white")
    draw = ImageDraw.Draw(sheet)
    draw.font = caption_font(CAPTION_FONT)
    for r, (suspect, given, suggested) in enumerate(rows):
        y = r * (cell + CAPTION_HEIGHT)
        path, label, score = suspect
        _tile(sheet, draw, path, (0, y), thumb, border, QUERY_FRAME, (label, score))
        if r < len(notes) and notes[r]:
            note = notes[r]
            while len(note) > 1 and draw.textlength(note) > thumb - 2:
                note = note[:-2] + "…"
            draw.rectangle([border, y + border, border + thumb - 1, y + border + 13], fill="white")
            draw.text((border + 1, y + border + 1), note, fill="black", anchor="lt")
        for c, (hit, frame) in enumerate(
            [*((h, RED) for h in given[:shown]), *((h, GREEN) for h in suggested[:shown])]
        ):
            column = 1 + c if frame == RED else 1 + shown + c - len(given[:shown])
            _tile(sheet, draw, hit[0], (column * cell, y), thumb, border, frame, hit[1:])
    save_image(sheet, out, fmt)


def caption_font(size: int) -> Any:
    """DejaVu Sans, which matplotlib ships (labels in Greek, Cyrillic or accented Latin are
    drawn, where Pillow's own font draws boxes), else Pillow's default."""
    from PIL import ImageFont

    try:
        import matplotlib

        path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
        return ImageFont.truetype(str(path), size)
    except (ImportError, OSError):
        return ImageFont.load_default(size=size)


def _tile(
    sheet: Image.Image,
    draw: ImageDraw.ImageDraw,
    path: str,
    at: tuple[int, int],
    thumb: int,
    border: int,
    frame: tuple[int, int, int],
    label_score: tuple[str | None, float | None],
) -> None:
    """One framed tile: the image fitted and centred on the background, its caption below."""
    from pactl.images import ImageError, load_image

    (x, y), cell = at, thumb + 2 * border
    draw.rectangle([x, y, x + cell - 1, y + cell - 1], fill=frame)
    inner = [x + border, y + border, x + border + thumb - 1, y + border + thumb - 1]
    draw.rectangle(inner, fill=TILE_BACKGROUND)
    try:
        image = fit_tile(load_image(Path(path), target_size=thumb), thumb)
        left, top = (thumb - image.width) // 2, (thumb - image.height) // 2
        sheet.paste(image, (x + border + left, y + border + top))
    except ImageError:
        draw.line([x, y, x + cell, y + cell], fill="black")
    text = caption(*label_score, fits=lambda t: draw.textlength(t) <= cell - 4)
    draw.text((x + 2, y + cell + 1), text, fill="black", anchor="lt")


def fit_tile(image: Image.Image, size: int) -> Image.Image:
    """`image` scaled, up or down, to fit a `size` square with its aspect ratio kept. Enlarged a
    lot (an 8x8 digit), it keeps crisp pixel blocks (NEAREST); made smaller, it is filtered
    (LANCZOS), so fine detail turns to tone rather than to aliasing."""
    from PIL import Image

    scale = size / max(image.size)
    width, height = (max(1, min(size, round(side * scale))) for side in image.size)
    if (width, height) == image.size:
        return image
    if scale >= NEAREST_FROM:
        return image.resize((width, height), Image.Resampling.NEAREST)
    if scale > 1:
        return image.resize((width, height), Image.Resampling.BICUBIC)
    return image.resize((width, height), Image.Resampling.LANCZOS, reducing_gap=3.0)


def caption(
    label: str | None, score: float | None = None, fits: Callable[[str], bool] = lambda _: True
) -> str:
    """A tile's caption: `query 8` under a query, `8 0.912` under a hit (three decimals: the
    scores of neighbours often differ only there). A label too long for `fits` is cut short
    with an ellipsis; the score always shows."""
    name = label or ""

    def compose(shown: str) -> str:
        return f"query {shown}".strip() if score is None else f"{shown} {score:.3f}".strip()

    shown, keep = name, len(name)
    while keep > 0 and not fits(compose(shown)):
        keep -= 1
        shown = name[:keep] + "…"
    return compose(shown)


def save_image(image: Image.Image, out: Path, fmt: str) -> None:
    """Write `image` atomically as `fmt` (from check_image_path); JPEG has no alpha channel."""
    if fmt == "JPEG" and image.mode != "RGB":
        image = image.convert("RGB")
    with atomic_path(out) as tmp:
        image.save(tmp, format=fmt, **SAVE_OPTIONS.get(fmt, {}))
