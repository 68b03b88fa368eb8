"""The pictures: retrieval grids fit tiny and huge images to their tiles, captions carry three
decimals, files hold the format their name says, curves zoom and mark best.pt's epoch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure
from PIL import Image, ImageDraw

from pactl import report
from pactl.errors import UsageError

THUMB, BORDER = 112, 5
CELL = THUMB + 2 * BORDER
BLUE = (0, 0, 255)


def write_image(path: Path, pixels: np.ndarray) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.astype(np.uint8)).save(path)
    return str(path)


def solid(path: Path, width: int, height: int) -> str:
    return write_image(path, np.broadcast_to(np.array(BLUE), (height, width, 3)))


def inner(sheet: Image.Image, row: int, column: int) -> np.ndarray:
    """The part of a tile inside its frame, as an (H, W, 3) array."""
    x, y = column * CELL + BORDER, row * (CELL + report.CAPTION_HEIGHT) + BORDER
    return np.asarray(sheet.convert("RGB"))[y : y + THUMB, x : x + THUMB]


def blue_box(tile: np.ndarray) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) margins of the blue pixels in a tile."""
    ys, xs = np.nonzero(np.all(tile == BLUE, axis=-1))
    return xs.min(), ys.min(), THUMB - 1 - xs.max(), THUMB - 1 - ys.max()


def test_tiny_and_large_images_fill_their_tiles_centred(tmp_path: Path) -> None:
    square = solid(tmp_path / "a" / "8x8.png", 8, 8)  # a digit: 14x smaller than the tile
    tall = solid(tmp_path / "b" / "4x8.png", 4, 8)
    large = solid(tmp_path / "c" / "300x200.png", 300, 200)
    report.retrieval_grid(
        [(square, "a", [(tall, "b", 0.5), (large, "c", 0.4)])], tmp_path / "g.png"
    )
    sheet = Image.open(tmp_path / "g.png")
    assert sheet.size == (3 * CELL, CELL + report.CAPTION_HEIGHT)

    tile = inner(sheet, 0, 0)  # 8x8 scaled up to the whole tile
    assert np.all(tile == BLUE)
    left, top, right, bottom = blue_box(inner(sheet, 0, 1))  # 4x8: 56x112, centred across
    assert (top, bottom) == (0, 0) and abs(left - right) <= 1 and left + right == THUMB // 2
    left, top, right, bottom = blue_box(inner(sheet, 0, 2))  # 300x200: 112x75, centred down
    assert (left, right) == (0, 0) and abs(top - bottom) <= 1
    assert THUMB - top - bottom == pytest.approx(THUMB * 2 / 3, abs=1)
    background = inner(sheet, 0, 2)[0, 0]
    assert tuple(background) == report.TILE_BACKGROUND


def test_enlarged_pixels_stay_crisp_and_reduced_detail_is_filtered(tmp_path: Path) -> None:
    checks = (np.indices((8, 8)).sum(axis=0) % 2 * 255)[..., None].repeat(3, axis=-1)
    tiny = write_image(tmp_path / "checks.png", checks)
    stripes = np.zeros((224, 224, 3))
    stripes[:, ::2] = 255  # one-pixel stripes: nearest-neighbour halving would keep one colour
    fine = write_image(tmp_path / "stripes.png", stripes)
    report.retrieval_grid([(tiny, None, [(fine, "x", 0.1)])], tmp_path / "g.png")
    sheet = Image.open(tmp_path / "g.png")

    enlarged = inner(sheet, 0, 0)
    assert set(np.unique(enlarged)) == {0, 255}  # no blended edges between the blocks
    assert np.all(enlarged[:14, :14] == 0) and np.all(enlarged[:14, 14:28] == 255)
    reduced = inner(sheet, 0, 1).astype(float)
    assert reduced.mean() == pytest.approx(127.5, abs=10) and reduced.std() < 20


def test_captions_show_scores_to_three_decimals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[str] = []
    original = ImageDraw.ImageDraw.text

    def record(self: ImageDraw.ImageDraw, xy: object, text: str, *args: object, **kw: object):
        drawn.append(text)
        return original(self, xy, text, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(ImageDraw.ImageDraw, "text", record)
    image = solid(tmp_path / "q.png", 8, 8)
    hits = [(image, "8", 0.91234), (image, "3", 0.5), (image, "a" * 80, 0.25)]
    report.retrieval_grid([(image, "8", hits), (image, None, [])], tmp_path / "g.png")
    assert drawn[:3] == ["query 8", "8 0.912", "3 0.500"]
    assert drawn[3].endswith("… 0.250") and drawn[3].startswith("aaa")  # cut to fit its tile
    assert drawn[4] == "query"
    assert report.caption("8") == "query 8" and report.caption("8", 0.1) == "8 0.100"


MAGIC = {
    ".png": lambda b: b.startswith(b"\x89PNG\r\n\x1a\n"),
    ".jpg": lambda b: b.startswith(b"\xff\xd8\xff"),
    ".JPEG": lambda b: b.startswith(b"\xff\xd8\xff"),
    ".webp": lambda b: b[:4] == b"RIFF" and b[8:12] == b"WEBP",
}


@pytest.mark.parametrize("suffix", sorted(MAGIC))
def test_the_file_holds_the_format_its_name_says(tmp_path: Path, suffix: str) -> None:
    image = solid(tmp_path / "q.png", 8, 8)
    grid, curves = tmp_path / f"grid{suffix}", tmp_path / f"curves{suffix}"
    report.retrieval_grid([(image, "a", [(image, "a", 1.0)])], grid)
    write_metrics(tmp_path / "metrics.csv", with_val=False)
    report.plot_curves(tmp_path / "metrics.csv", curves)
    for out in (grid, curves):
        assert MAGIC[suffix](out.read_bytes()), out
        if suffix.lower() in (".jpg", ".jpeg"):
            assert Image.open(out).mode == "RGB"  # JPEG has no alpha channel
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left


@pytest.mark.parametrize("name", ["grid.gif", "grid.bmp", "grid", "grid.png.txt"])
def test_an_unknown_extension_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    def no_reading(*args: object, **kwargs: object) -> None:
        raise AssertionError("an image was read before the output name was checked")

    monkeypatch.setattr("pactl.images.load_image", no_reading)
    with pytest.raises(UsageError, match=r"\.png, \.jpg, \.jpeg, \.webp"):
        report.retrieval_grid([("q.png", "a", [("h.png", "a", 1.0)])], tmp_path / name)
    with pytest.raises(UsageError, match=r"\.png, \.jpg, \.jpeg, \.webp"):
        report.check_image_path(tmp_path / name)
    with pytest.raises(UsageError):
        report.plot_curves(tmp_path / "absent.csv", tmp_path / name)  # before the CSV is opened
    assert list(tmp_path.iterdir()) == []
    assert (
        report.check_image_path(Path("x.JPG")) == "JPEG"
        and report.check_image_path(Path("x.webp")) == "WEBP"
    )


# ---------------------------------------------------------------------------- curves


def write_metrics(path: Path, with_val: bool) -> None:
    """metrics.csv as training writes it: test Recall@1 peaks at epoch 5, validation Recall@1
    at epochs 3 and 6 (a tie: the later); epoch 4 was not evaluated (--eval-every)."""
    from pactl.config import TrainConfig
    from pactl.runs import append_metrics, metric_columns

    columns = metric_columns(TrainConfig(eval_ks=(1, 2)), with_val=with_val)
    test_r1 = [0.90, 0.93, 0.95, 0.96, -1.0, 0.975, 0.97]
    val_r1 = [0.80, 0.84, 0.85, 0.88, -1.0, 0.86, 0.88]
    for epoch, (t, v) in enumerate(zip(test_r1, val_r1, strict=True)):
        row: dict[str, float] = {"epoch": epoch, "seconds": 1.0}
        if epoch:
            row.update(loss=5.0 / (epoch + 1), lr=0.001)
        if t >= 0:
            row.update({"recall@1": t, "recall@2": t, "map@r": t - 0.5, "nmi": 0.5})
            if with_val:
                row.update({"val_recall@1": v, "val_recall@2": v, "val_map@r": v - 0.5})
        append_metrics(path, columns, row)


def marker_x(fig: Figure, gid: str) -> list[float]:
    """Where the lines tagged `gid` stand on the epoch axis, one entry per line."""
    found = []
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_gid() == gid:
                found += sorted({float(x) for x in np.asarray(line.get_xdata())})
    return found


@pytest.mark.parametrize(
    ("with_val", "selection", "best"), [(True, "val", 6), (False, "test", 5), (True, "last", 6)]
)
def test_curves_mark_the_epoch_best_pt_came_from(
    tmp_path: Path, with_val: bool, selection: str, best: int
) -> None:
    write_metrics(tmp_path / "metrics.csv", with_val)
    fig = report.curves_figure(report.read_metrics(tmp_path / "metrics.csv"), "cars-pa", selection)
    loss, recall, map_r = fig.axes
    assert fig.get_suptitle().startswith(f"cars-pa: best.pt is epoch {best} (")
    assert marker_x(fig, "best-epoch") == [best] * 3  # a line on each panel
    assert marker_x(fig, "best-point") == [best]
    for ax in fig.axes:
        low, high = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if low <= t <= high]
        assert ticks == list(range(7)), ax.get_title()  # whole epochs only
    values = [0.90, 0.975, *([0.80, 0.88] if with_val else [])]
    low, high = recall.get_ylim()
    assert low > 0.5 and high <= 1.0 and low < min(values) and max(values) < high
    assert "MAP@R" in map_r.get_title()
    plotted = {line.get_label(): list(np.asarray(line.get_ydata())) for line in map_r.get_lines()}
    assert plotted["test classes"] == pytest.approx([0.40, 0.43, 0.45, 0.46, 0.475, 0.47])
    assert ("validation classes" in plotted) == with_val
    assert list(np.asarray(loss.get_lines()[0].get_xdata())) == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]  # epoch 0 has no loss


def test_plot_curves_takes_the_selection_and_name_from_the_run(tmp_path: Path) -> None:
    run = tmp_path / "my-run"
    run.mkdir()
    write_metrics(run / "metrics.csv", with_val=True)
    report.plot_curves(
        run / "metrics.csv", run / "curves.png"
    )  # no config.json: val columns choose
    assert Image.open(run / "curves.png").format == "PNG"
    rows = report.read_metrics(run / "metrics.csv")
    assert report.run_selection(run, set().union(*rows)) == "val"
    assert report.best_epoch(rows, "val") == 6
    (run / "config.json").write_text(json.dumps({"train_config": {"selection": "test"}}))
    assert report.run_selection(run, set().union(*rows)) == "test"
    assert report.best_epoch(rows, "test") == 5


def test_curves_without_map_columns_have_two_panels(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text("epoch,loss,recall@1\n0,,0.5\n1,2.0,0.6\n2,1.0,\n")
    fig = report.curves_figure(report.read_metrics(path), "r", "test")
    assert len(fig.axes) == 2
    assert marker_x(fig, "best-epoch") == [1, 1]


def test_grid_captions_draw_labels_beyond_ascii() -> None:
    """A label such as 'lettre É' or 'Ζeta' is drawn with its letters, not as the boxes of a
    font without them (each compared with the glyph of a code point no font has)."""
    font = report.caption_font(report.CAPTION_FONT)

    def glyph(char: str) -> bytes:
        return bytes(font.getmask(char))

    missing = glyph("\U000f0000")  # private use: drawn as the font's 'no glyph' box
    assert all(glyph(c) != missing for c in "AÉΖж")
