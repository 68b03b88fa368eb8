"""Promises of docs/cli.md that no other test named, each tested as its sentence says."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli
from test_api import tiny_run


def test_download_list_is_pactl_list_datasets(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    """docs/cli.md, download: "`--list` is `pactl list datasets`"."""
    code, listed, err = run_cli(["list", "datasets"], monkeypatch, capsys)
    assert code == 0, err
    code, out, err = run_cli(["download", "--list"], monkeypatch, capsys)
    assert code == 0, err
    assert out == listed and "digits" in out


def test_embed_split_embeds_only_that_split_of_a_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """docs/cli.md, embed: `pactl embed SOURCE --checkpoint best.pt [--split S]` (the option's
    help: "Only this split of a manifest")."""
    checkpoint = tiny_run(tmp_path)
    photos = sorted((tmp_path / "photos").rglob("*.png"))
    splits = {p: ("train" if int(p.parent.name[-1]) < 2 else "test") for p in photos}
    with open(tmp_path / "manifest.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label", "split"])
        for p in photos:
            writer.writerow([p.relative_to(tmp_path).as_posix(), p.parent.name, splits[p]])
    args = ["embed", "manifest.csv", "--checkpoint", str(checkpoint), "--split", "test"]
    code, _, err = run_cli([*args, "--out", "test_vectors", "--quiet"], monkeypatch, capsys)
    assert code == 0, err
    with open(tmp_path / "test_vectors" / "items.csv", newline="") as f:
        embedded = {Path(row["path"]) for row in csv.DictReader(f)}
    assert embedded == {p.resolve() for p in photos if splits[p] == "test"}
    assert len(np.load(tmp_path / "test_vectors" / "vectors.npy")) == len(embedded) == 8


def audit_scores(args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: Any) -> dict[str, float]:
    """Every `label` row of `pactl audit ARGS --top 0 -f csv`: path -> score (the doubt)."""
    code, out, err = run_cli([*args, "--top", "0", "-f", "csv", "--quiet"], monkeypatch, capsys)
    assert code == 0, err
    rows = csv.DictReader(out.splitlines())
    return {r["path"]: float(r["score"]) for r in rows if r["kind"] == "label"}


def test_audit_score_classes_or_neighbours_ranks_by_one_witness_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """docs/cli.md, audit: "`--score classes` or `neighbours` ranks by one witness alone": the
    classes' (a softmax at scale 16 of the item's cosines to the class means, the item left
    out of its own) or the neighbours' (the share of its --neighbours nearest other items
    carrying its label); the doubt is 1 minus that belief. Checked against float64 by hand."""
    from test_audit import hand_set, write_vectors

    vectors, labels, _ = hand_set()
    write_vectors(tmp_path / "vec", vectors, labels)
    assert run_cli(["index", "vec", "--out", "b", "-q"], monkeypatch, capsys)[0] == 0
    x, names = vectors.astype(np.float64), np.array(labels)
    cosines = x @ x.T
    np.fill_diagonal(cosines, -np.inf)
    near = np.argsort(-cosines, axis=1, kind="stable")[:, :5]
    by_neighbours = 1 - (names[near] == names[:, None]).mean(axis=1)
    by_classes = []
    for i in range(len(x)):
        means = []
        for c in sorted(set(labels)):
            members = [j for j in range(len(x)) if names[j] == c and j != i]
            mean = x[members].mean(axis=0)
            means.append(x[i] @ mean / np.linalg.norm(mean))
        logits = 16 * np.array(means)
        p = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        by_classes.append(1 - p[sorted(set(labels)).index(labels[i])])
    args = ["audit", "b", "--neighbours", "5", "--no-copies"]
    for witness, expected in (("neighbours", by_neighbours), ("classes", by_classes)):
        got = audit_scores([*args, "--score", witness], monkeypatch, capsys)
        want = {f"/d/{i}.png": float(d) for i, d in enumerate(expected)}
        assert got.keys() == want.keys()
        assert max(abs(got[p] - want[p]) for p in got) < 1e-5, witness


def test_promise_every_test_a_doc_cites_exists() -> None:
    """docs/reliability.md's tables (and any doc page) name the test that holds each row
    (`test_x.py::test_name`, or a bare `test_name` beside it): every one cited exists, so a
    renamed or deleted test cannot leave a promise pointing at nothing."""
    import re

    root = Path(__file__).resolve().parents[1]
    defined = {
        f.name: set(re.findall(r"^(?:async )?def (test_\w+)", f.read_text(), re.M))
        for f in (root / "tests").glob("test_*.py")
    }
    every = set().union(*defined.values())
    pages = ["README.md", *(f"docs/{p}.md" for p in DOC_PAGES)]
    missing, cited = [], 0
    for page in pages:
        for cell in re.findall(r"`([^`\n]+)`", (root / page).read_text()):
            for file, name in re.findall(r"(test_\w+\.py)(?:::(test_\w+))?", cell):
                cited += 1
                if file not in defined or (name and name not in defined[file]):
                    missing.append(f"{page}: {cell}")
            if re.fullmatch(r"test_\w+", cell):
                cited += 1
                if cell not in every:
                    missing.append(f"{page}: {cell}")
    assert cited > 100 and not missing, missing


DOC_PAGES = ("cli", "api", "serving", "datasets", "training", "audit", "reliability")


def test_promise_a_collapsed_network_still_ends_its_run_with_a_calibration_and_its_plot(
    tmp_path: Path,
) -> None:
    """docs/cli.md, train: collapsed embeddings add "a `warning:` line after the epoch's" and
    the run goes on; its end calibrates best.pt and draws calibration.png. Every pair at one
    cosine gave an empty curve, and the plot of it a ValueError traceback at the end of the
    run (found by test_doc_options' frozen statistics)."""
    from pactl.calibrate import CalibrationConfig, calibrate
    from pactl.report import plot_calibration

    vectors = np.tile(np.float32([[0.6, 0.8, 0.0]]), (12, 1))
    vectors[:, 2] = np.linspace(0, 1e-4, 12)  # within one step of the curve's grid
    calibration = calibrate(vectors, np.arange(12) % 3, CalibrationConfig(), "test")
    assert len(calibration.curve) >= 1 and calibration.threshold is None
    plot_calibration(calibration, tmp_path / "calibration.png")
    assert (tmp_path / "calibration.png").stat().st_size > 0


def test_promise_index_of_vectors_without_out_is_dot_index_and_query_and_serve_find_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """docs/cli.md, index: "The default bundle folder is `runs/<run>/index` for a checkpoint in
    a run folder, else `./index`"; query: "Without `--index` the newest bundle ... is used
    (named on stderr)"; docs/serving.md: "With no BUNDLE, serve takes the bundle `pactl index`
    wrote last ...: ... `index/` when built from a vectors folder"."""
    pytest.importorskip("fastapi")
    from test_audit import hand_set, write_vectors

    import pactl.serve.server

    vectors, labels, _ = hand_set()
    write_vectors(tmp_path / "vec", vectors, labels)
    assert run_cli(["index", "vec", "-q"], monkeypatch, capsys)[0] == 0
    assert (tmp_path / "index" / "meta.json").is_file()
    np.save(tmp_path / "q.npy", vectors[:1])
    code, out, err = run_cli(["query", "--vectors", "q.npy", "-f", "csv"], monkeypatch, capsys)
    assert code == 0, err
    assert "index" in err and out.splitlines()[1].split(",")[3] == "/d/0.png"
    served: list[Any] = []
    monkeypatch.setattr(pactl.serve.server, "serve", lambda config, log: served.append(config))
    assert run_cli(["serve", "--port", "0"], monkeypatch, capsys)[0] in (0, 1)
    assert served and served[0].bundle.resolve() == (tmp_path / "index").resolve()


def test_promise_index_reload_loads_a_generation_another_writer_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """docs/api.md: "The `Index` then loads the new generation; `reload()` loads one another
    process wrote." A delete by `pactl index --delete` is not seen until reload(), then every
    search skips the item."""
    import pactl

    tiny_run(tmp_path)
    args = ["index", "photos", "--checkpoint", "best.pt", "--out", "bundle", "-q"]
    assert run_cli(args, monkeypatch, capsys)[0] == 0
    index = pactl.open_index("bundle")
    first = index.query("photos/class_0/0.png", k=1)[0][0]
    assert (
        run_cli(["index", "bundle", "--delete", str(first.id), "-q"], monkeypatch, capsys)[0] == 0
    )
    assert len(index) == 16  # still the generation it opened
    index.reload()
    assert len(index) == 15
    hits = index.query("photos/class_0/0.png", k=15)[0]
    assert first.id not in {h.id for h in hits} and len(hits) == 15


def test_promise_a_runs_split_csv_is_a_manifest_train_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """docs/datasets.md: "the run folder keeps it as `split.csv` (`path,label,split`, absolute
    paths), a manifest `pactl train` reads back": a run trained on it splits as the first."""
    from conftest import TINY, read_csv, train_tiny

    first = train_tiny(tmp_path, monkeypatch, capsys)
    split = first / "split.csv"
    args = ["train", str(split), *TINY, "--epochs", "1", "--name", "again", "--quiet"]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    rows = {(r["path"], r["label"], r["split"]) for r in read_csv(split)}
    again = {
        (r["path"], r["label"], r["split"])
        for r in read_csv(tmp_path / "runs" / "again" / "split.csv")
    }
    assert rows == again and {s for _, _, s in rows} >= {"train", "test"}


def test_promise_a_csv_path_listed_twice_is_read_once_and_with_two_labels_refused_by_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """docs/datasets.md: "`pactl embed` and `pactl index` need no split: they take a CSV of any
    number of classes. A path listed twice is read once; listed twice with two labels, it is
    refused naming the line"."""
    from conftest import one_error

    tiny_run(tmp_path)
    one_class = ["photos/class_0/0.png,a", "photos/class_0/1.png,a", "photos/class_0/0.png,a"]
    (tmp_path / "one.csv").write_text("path,label\n" + "\n".join(one_class) + "\n")
    args = ["embed", "one.csv", "--checkpoint", "best.pt", "--out", "v", "-q"]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    assert len(np.load(tmp_path / "v" / "vectors.npy")) == 2
    assert run_cli(["index", "v", "--out", "b", "-q"], monkeypatch, capsys)[0] == 0
    clash = [*one_class[:2], "photos/class_0/0.png,b"]
    (tmp_path / "two.csv").write_text("path,label\n" + "\n".join(clash) + "\n")
    args = ["embed", "two.csv", "--checkpoint", "best.pt", "--out", "w", "-q"]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code == 1 and "line 4" in one_error(err)
    assert not (tmp_path / "w").exists()
