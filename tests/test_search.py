"""Finding queries among the indexed items by path."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from pactl.index import ItemTable
from pactl.index.search import PathIndex


def table(paths: list[str], ids: list[int]) -> ItemTable:
    return ItemTable.from_rows([(i, p, "") for i, p in zip(ids, paths, strict=True)])


def test_path_index_against_a_dict(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    paths = [str(tmp_path / f"d{i % 7}" / f"img_{i}.jpg") for i in range(500)]
    ids = rng.permutation(10_000)[:500].tolist()  # sparse, unordered ids
    lookup = PathIndex(table(paths, ids))
    reference = dict(zip(paths, ids, strict=True))
    asked = [*rng.choice(paths, 50).tolist(), str(tmp_path / "absent.jpg"), "/nowhere.png"]
    want = [reference.get(p, -1) for p in asked]
    np.testing.assert_array_equal(lookup.ids(asked), want)
    assert lookup.ids([]).shape == (0,)


def test_path_index_normalises_queries_and_relative_items(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    items = table([str(tmp_path / "a" / "x.png"), "b/y.png"], [5, 9])
    lookup = PathIndex(items)
    asked = ["a/x.png", f"{tmp_path}/a/./x.png", str(tmp_path / "b" / "y.png"), "b/../b/y.png"]
    np.testing.assert_array_equal(lookup.ids(asked), [5, 5, 9, 9])


def test_path_index_survives_hash_collisions(monkeypatch: pytest.MonkeyPatch) -> None:
    import pactl.index.search

    # Every path hashes alike: the lookup must still tell them apart by the path itself.
    monkeypatch.setattr(pactl.index.search, "hash", lambda _: 42, raising=False)
    paths = [os.path.abspath(f"p{i}.png") for i in range(20)]
    lookup = PathIndex(table(paths, list(range(100, 120))))
    np.testing.assert_array_equal(lookup.ids([paths[7], paths[0], "q.png"]), [107, 100, -1])
