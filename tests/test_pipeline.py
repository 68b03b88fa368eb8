"""The whole flow through the real command line: train -> index -> query, embed -> index."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import make_class_folder, read_csv, run_cli

TINY = [
    "--backbone",
    "small",
    "--weights",
    "none",
    "--dim",
    "16",
    "--image-size",
    "16",
    "--batch-size",
    "8",
    "--lr",
    "1e-3",
    "--warmup-epochs",
    "0",
    "--quiet",
]


@pytest.fixture
def trained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Path:
    make_class_folder(tmp_path / "imgs", classes=6, per_class=5)
    code, _, err = run_cli(
        ["train", str(tmp_path / "imgs"), "--epochs", "2", "--name", "t", *TINY],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    return tmp_path / "runs" / "t"


def test_train_index_query_flow(
    trained: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(["index", "--quiet"], monkeypatch, capsys)
    assert code == 0, err
    bundle = trained / "index"
    meta = json.loads((bundle / "meta.json").read_text())
    assert meta["count"] == 15  # the held-out classes 3, 4, 5: 3 x 5 images
    test_images = sorted((tmp_path / "imgs").glob("class_[345]/*.png"))

    # One query, jsonl in a pipe: k rows, results only on stdout.
    code, out, err = run_cli(["query", str(test_images[0]), "--k", "4"], monkeypatch, capsys)
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["rank"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["path"] == str(test_images[0]) and rows[0]["score"] == pytest.approx(1, abs=1e-4)
    assert "using index" in err

    # Many queries from stdin, exclude-self, CSV: each query's own image never comes back.
    stdin = "".join(f"{p}\n" for p in test_images)
    code, out, err = run_cli(
        ["query", "-", "--k", "3", "--exclude-self", "--format", "csv"],
        monkeypatch,
        capsys,
        stdin=stdin,
    )
    assert code == 0, err
    table = list(csv.DictReader(out.splitlines()))
    assert len(table) == 3 * len(test_images)
    assert all(r["query"] != r["path"] for r in table)
    scores = np.array([float(r["score"]) for r in table]).reshape(len(test_images), 3)
    assert np.all(np.diff(scores, axis=1) <= 1e-6)  # ranked by score

    # The picture: one row per query, the query then its hits, each hit framed by correctness.
    code, out, err = run_cli(
        [
            "query",
            str(test_images[0]),
            str(test_images[-1]),
            "--k",
            "3",
            "--grid",
            "grid.png",
            "--format",
            "csv",
        ],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    hits = list(csv.DictReader(out.splitlines()))
    from PIL import Image

    from pactl.report import GREEN, RED

    grid = Image.open(tmp_path / "grid.png").convert("RGB")
    cell = 112 + 2 * 5
    assert grid.size == (4 * cell, 2 * (cell + 14))
    for n, hit in enumerate(hits):
        row, column = divmod(n, 3)
        query_label = Path(hit["query"]).parent.name
        frame = grid.getpixel(((column + 1) * cell + 1, row * (cell + 14) + 1))
        assert frame == (GREEN if hit["label"] == query_label else RED)


def test_query_with_another_model_is_refused(
    trained: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_cli(["index", "--quiet"], monkeypatch, capsys)[0] == 0
    code, _, err = run_cli(
        ["train", str(tmp_path / "imgs"), "--epochs", "1", "--name", "other", "--seed", "5", *TINY],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    image = next((tmp_path / "imgs").glob("class_3/*.png"))
    code, out, err = run_cli(
        [
            "query",
            str(image),
            "--index",
            str(trained / "index"),
            "--checkpoint",
            str(tmp_path / "runs" / "other" / "best.pt"),
        ],
        monkeypatch,
        capsys,
    )
    assert code == 1 and out == ""
    assert "is not the model that built" in err


def test_embed_then_index_a_plain_folder(
    trained: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "imgs" / "class_0" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    code, out, err = run_cli(
        [
            "embed",
            str(tmp_path / "imgs"),
            "--checkpoint",
            str(trained / "best.pt"),
            "--out",
            "vec",
            "--quiet",
        ],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    assert "1 unreadable images skipped" in err
    vectors = np.load(tmp_path / "vec" / "vectors.npy")
    assert vectors.shape == (30, 16) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    skipped = read_csv(tmp_path / "vec" / "skipped.csv")
    assert [Path(r["path"]).name for r in skipped] == ["broken.png"]
    items = read_csv(tmp_path / "vec" / "items.csv")
    assert [int(r["id"]) for r in items] == list(range(30))
    assert {r["label"] for r in items} == {f"class_{c}" for c in range(6)}
    code, out, err = run_cli(["index", "vec", "--out", "bundle", "--quiet"], monkeypatch, capsys)
    assert code == 0, err
    code, out, err = run_cli(
        ["query", items[7]["path"], "--index", "bundle", "--k", "1", "--paths-only"],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    assert out == items[7]["path"] + "\n"


def test_eval_writes_the_report(
    trained: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(["eval", "--quiet", "--report", "e.csv"], monkeypatch, capsys)
    assert code == 0, err
    report = read_csv(tmp_path / "e.csv")[0]
    # best.pt on the same split gives the best Recall@1 that training recorded.
    assert float(report["recall@1"]) == pytest.approx(
        max(float(r["recall@1"]) for r in read_csv(trained / "metrics.csv")), abs=1e-6
    )
    assert "recall@1" in out and "map@r" in out
