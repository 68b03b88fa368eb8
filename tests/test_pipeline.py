"""The whole flow through the real command line: train -> index -> query, embed -> index."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY, make_class_folder, one_error, read_csv, run_cli, train_tiny


@pytest.fixture
def trained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Path:
    return train_tiny(tmp_path, monkeypatch, capsys, epochs=2)


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
    assert meta["count"] == 15  # the held-out classes, 3 of the 6 drawn: 3 x 5 images
    with (trained / "split.csv").open(newline="") as f:  # the run's draw of classes
        test_images = sorted(Path(r["path"]) for r in csv.DictReader(f) if r["split"] == "test")
    assert len(test_images) == 15

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
        [
            "train",
            str(tmp_path / "imgs"),
            "--epochs",
            "1",
            "--name",
            "other",
            "--seed",
            "5",
            *TINY,
            "--quiet",
        ],
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
    assert "is not the network that made these vectors" in err

    # Other weights under the bundle's recorded fingerprint: recomputed, and refused.
    import torch

    from pactl import checkpoint as ckpt

    forged = ckpt.load(tmp_path / "runs" / "other" / "best.pt")
    forged["fingerprint"] = ckpt.load(trained / "best.pt")["fingerprint"]
    torch.save(forged, tmp_path / "forged.pt")
    code, out, err = run_cli(
        ["query", str(image), "--index", str(trained / "index"), "--checkpoint", "forged.pt"],
        monkeypatch,
        capsys,
    )
    assert code == 1 and "is not the network that made these vectors" in err


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
    assert "1 unreadable image skipped" in err
    vectors = np.load(tmp_path / "vec" / "vectors.npy")
    assert vectors.shape == (30, 16) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    skipped = read_csv(tmp_path / "vec" / "skipped.csv")
    assert [Path(r["path"]).name for r in skipped] == ["broken.png"]
    items = read_csv(tmp_path / "vec" / "items.csv")
    # An id is the image's position in the sorted input; the unreadable one has none.
    everything = sorted(str(p) for p in (tmp_path / "imgs").rglob("*.png"))
    broken = everything.index(str(tmp_path / "imgs" / "class_0" / "broken.png"))
    assert [int(r["id"]) for r in items] == [i for i in range(31) if i != broken]
    assert [r["path"] for r in items] == [p for p in everything if "broken" not in p]
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


def test_reembed_only_new_or_changed_files(
    trained: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from PIL import Image

    embed = [
        "embed",
        str(tmp_path / "imgs"),
        "--checkpoint",
        str(trained / "best.pt"),
        "--out",
        "vec",
        "--quiet",
    ]
    assert run_cli(embed, monkeypatch, capsys)[0] == 0
    before = np.load(tmp_path / "vec" / "vectors.npy")
    old_items = {r["path"]: int(r["id"]) for r in read_csv(tmp_path / "vec" / "items.csv")}
    changed = tmp_path / "imgs" / "class_1" / "0.png"
    Image.new("RGB", (16, 16), (250, 10, 10)).save(changed)
    added = tmp_path / "imgs" / "class_1" / "new.png"
    Image.new("RGB", (16, 16), (10, 250, 10)).save(added)
    removed = tmp_path / "imgs" / "class_2" / "0.png"
    removed.unlink()

    code, out, err = run_cli(embed, monkeypatch, capsys)
    assert code == 0, err
    meta = json.loads((tmp_path / "vec" / "meta.json").read_text())
    assert (meta["embedded"], meta["reused"], meta["count"]) == (2, 28, 30)
    items = read_csv(tmp_path / "vec" / "items.csv")
    after = np.load(tmp_path / "vec" / "vectors.npy")
    ids = {r["path"]: int(r["id"]) for r in items}
    assert str(removed) not in ids
    assert ids[str(changed)] == old_items[str(changed)]
    assert ids[str(added)] == max(old_items.values()) + 1
    old_rows = {p: i for i, p in enumerate(old_items)}
    for row, r in enumerate(items):  # unchanged files keep their exact vectors
        if r["path"] not in (str(changed), str(added)):
            assert np.array_equal(after[row], before[old_rows[r["path"]]])
    assert not np.allclose(
        after[[r["path"] for r in items].index(str(changed))], before[old_rows[str(changed)]]
    )
    code, out, err = run_cli([*embed[:-1]], monkeypatch, capsys)  # not quiet: says why
    assert code == 0 and "up to date" in err
    # another network into the same folder: refused, the vectors kept; --overwrite replaces
    # them (every image again), and a line says why
    other = ["embed", "imgs", "--backbone", "small", "--weights", "none", "--out", "vec"]
    monkeypatch.chdir(tmp_path)
    kept = (tmp_path / "vec" / "meta.json").read_bytes()
    code, out, err = run_cli([*other, "--quiet"], monkeypatch, capsys)
    assert code == 1 and out == ""
    assert "come from another network" in one_error(err) and "--overwrite" in err
    assert (tmp_path / "vec" / "meta.json").read_bytes() == kept
    code, out, err = run_cli([*other, "--overwrite"], monkeypatch, capsys)
    assert code == 0 and "come from another network" in err, err
    assert json.loads((tmp_path / "vec" / "meta.json").read_text())["reused"] == 0


def test_shards_merge_to_the_same_index_and_add_appends(
    trained: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    best = str(trained / "best.pt")
    imgs = str(tmp_path / "imgs")
    assert (
        run_cli(
            ["embed", imgs, "--checkpoint", best, "--out", "whole", "--quiet"], monkeypatch, capsys
        )[0]
        == 0
    )
    for i in (2, 0, 1):  # any order
        code, _, err = run_cli(
            ["embed", imgs, "--checkpoint", best, "--out", "parts", "--shard", f"{i}/3", "--quiet"],
            monkeypatch,
            capsys,
        )
        assert code == 0, err
    code, _, err = run_cli(["index", "parts", "--out", "b1", "--quiet"], monkeypatch, capsys)
    assert code == 0, err
    assert run_cli(["index", "whole", "--out", "b2", "--quiet"], monkeypatch, capsys)[0] == 0
    assert read_csv(tmp_path / "b1" / "items.csv") == read_csv(tmp_path / "b2" / "items.csv")
    image = str(next((tmp_path / "imgs").glob("class_4/*.png")))
    answers = []
    for bundle in ("b1", "b2"):
        code, out, err = run_cli(
            ["query", image, "--index", bundle, "--k", "5"], monkeypatch, capsys
        )
        answers.append([(r["id"], r["path"]) for r in map(json.loads, out.splitlines())])
    assert answers[0] == answers[1]

    # A missing shard is named, not silently ignored.
    import shutil

    shutil.rmtree(tmp_path / "parts" / "shards" / "00001-of-00003")
    code, _, err = run_cli(["index", "parts", "--out", "b3", "--quiet"], monkeypatch, capsys)
    assert code == 1 and "has 2 of 3 shards; missing: 1/3" in err

    make_class_folder(tmp_path / "more", classes=1, per_class=3, seed=1)
    more = sorted((tmp_path / "more").rglob("*.png"))
    code, out, err = run_cli(
        ["index", str(tmp_path / "more"), "--add", "b2", "--quiet"], monkeypatch, capsys
    )
    assert code == 0, err
    assert "added 3 items" in out
    items = read_csv(tmp_path / "b2" / "items.csv")
    assert len(items) == 33 and [int(r["id"]) for r in items[-3:]] == [30, 31, 32]
    code, out, err = run_cli(
        ["query", str(more[1]), "--index", "b2", "--k", "1"], monkeypatch, capsys
    )
    assert json.loads(out)["path"] == str(more[1])
    code, out, err = run_cli(
        ["index", str(tmp_path / "more"), "--add", "b2", "--quiet"], monkeypatch, capsys
    )
    assert code == 0 and "added 0 items" in out
