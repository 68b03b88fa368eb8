"""pactl plot: tsne.png and retrieval.png written, with the layout and frames they should have."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import TINY, make_class_folder, one_error, run_cli
from PIL import Image

from pactl.research.plot import PlotConfig, Sample, retrieval_rows, tsne_figure, tsne_points

CELL, CAPTION = 112 + 2 * 5, 14  # retrieval_grid's default tile (thumb + 2 x border), caption
RED, GREEN = (210, 40, 40), (40, 170, 60)


def four_images(tmp_path: Path) -> list[str]:
    paths = []
    for i, colour in enumerate([(250, 0, 0), (0, 250, 0), (0, 0, 250), (250, 250, 0)]):
        path = tmp_path / f"{i}.png"
        Image.new("RGB", (16, 16), colour).save(path)
        paths.append(str(path))
    return paths


def test_a_wrong_hit_is_framed_red_and_a_right_one_green(tmp_path: Path) -> None:
    from pactl.report import retrieval_grid

    # Query 0 (class a): nearest is 2 (class b, cosine 0.9), then 1 (class a, cosine 0.6).
    vectors = np.array([[1, 0], [0.6, 0.8], [0.9, np.sqrt(1 - 0.81)], [-1, 0]], dtype=np.float32)
    sample = Sample(four_images(tmp_path), ["a", "a", "b", "b"], vectors)
    rows = retrieval_rows(sample, [0], k=2)
    assert [h[1] for h in rows[0][2]] == ["b", "a"]
    retrieval_grid(rows, tmp_path / "r.png")
    with Image.open(tmp_path / "r.png") as image:
        picture = image.convert("RGB")
    assert picture.size == (3 * CELL, CELL + CAPTION)  # the query and its 2 hits, one row
    assert picture.getpixel((1 * CELL + 1, 1)) == RED  # the wrong hit's frame
    assert picture.getpixel((2 * CELL + 1, 1)) == GREEN
    assert picture.getpixel((1 * CELL + CELL // 2, CELL // 2)) == (0, 0, 250)  # image 2 inside


def test_tsne_keeps_neighbours_and_draws_the_thumbnails(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    centres = np.array([[5.0, 0, 0], [0, 5.0, 0]])
    raw = np.concatenate([c + rng.standard_normal((10, 3)) * 0.3 for c in centres])
    vectors = (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype(np.float32)
    labels = ["a"] * 10 + ["b"] * 10
    sample = Sample(four_images(tmp_path) * 5, labels, vectors)
    points = tsne_points(vectors, PlotConfig())
    # Two tight clusters stay apart: every point's nearest other point is of its own class.
    d = np.linalg.norm(points[:, None] - points[None], axis=2) + np.eye(20) * 1e9
    assert all(labels[j] == labels[i] for i, j in enumerate(d.argmin(axis=1)))
    fig = tsne_figure(sample, points, PlotConfig(thumbnails=6))
    boxes = [a for a in fig.axes[0].artists if a.get_gid() == "thumbnail"]
    assert len(boxes) == 6


def test_plot_command_writes_both_pictures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=6, per_class=5)
    args = ["train", str(tmp_path / "imgs"), *TINY, "--epochs", "1", "--name", "t", "--quiet"]
    assert run_cli(args, monkeypatch, capsys)[0] == 0
    run = tmp_path / "runs" / "t"
    code, _, err = run_cli(
        ["plot", str(run), "--points", "20", "--thumbnails", "4", "--queries", "3", "-q"],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    for name in ("tsne.png", "retrieval.png"):
        assert (run / "plots" / name).stat().st_size > 0
    with Image.open(run / "plots" / "retrieval.png") as image:
        assert image.size == (5 * CELL, 3 * (CELL + CAPTION))  # 3 queries, each with 4 hits
    # plotted again: the pictures are kept, in one line before any embedding, unless asked
    drawn = (run / "plots" / "tsne.png").read_bytes()
    (run / "plots" / "retrieval.png").write_bytes(b"kept")
    again = ["plot", str(run), "--points", "20", "--thumbnails", "4", "--queries", "3", "-q"]
    code, out, err = run_cli(again, monkeypatch, capsys)
    assert code == 1 and out == "" and "tsne.png exists; pass --overwrite" in one_error(err)
    assert (run / "plots" / "retrieval.png").read_bytes() == b"kept"
    assert (run / "plots" / "tsne.png").read_bytes() == drawn
    code, _, err = run_cli([*again, "--overwrite"], monkeypatch, capsys)
    assert code == 0, err
    assert (run / "plots" / "retrieval.png").read_bytes() != b"kept"
    (run / "plots" / "tsne.png").unlink()
    (run / "plots" / "tsne.png").symlink_to(run / "best.pt")
    code, _, err = run_cli([*again, "--overwrite"], monkeypatch, capsys)
    assert code == 1 and "tsne.png is a symbolic link" in one_error(err)
