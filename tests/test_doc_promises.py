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
