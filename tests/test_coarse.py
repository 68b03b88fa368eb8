"""Two-level training of a large IVF's coarse quantiser (pactl.index.coarse): the split of the
lists among first-level clusters, by hand; the centroids' quality against FAISS's one-level
k-means and random centroids, in float64; and a build that takes this path against brute
force."""

from __future__ import annotations

import faiss
import numpy as np
import pytest
from conftest import clustered

import pactl.index.coarse as coarse
from pactl.config import IndexConfig
from pactl.console import QUIET
from pactl.index import build_index
from pactl.index.coarse import shares, two_level_centroids

DIM = 32


@pytest.fixture(scope="module")
def data(faiss_one_thread: None) -> np.ndarray:
    rng = np.random.default_rng(3)
    return clustered(rng, 12_000, rng.standard_normal((200, DIM)), spread=1.2)


def test_shares_split_in_proportion_by_largest_remainder() -> None:
    assert shares(np.array([10, 30, 60]), 10).tolist() == [1, 3, 6]
    # exact shares 0.5, 0.5, 49: one left over goes to the first of the tied remainders
    assert shares(np.array([1, 1, 98]), 50).tolist() == [1, 0, 49]
    # a group never gets more centroids than points: the rest go where there is room
    assert shares(np.array([2, 2, 4]), 8).tolist() == [2, 2, 4]
    assert shares(np.array([0, 5, 0, 7]), 6).tolist() == [0, 3, 0, 3]
    with pytest.raises(ValueError):
        shares(np.array([2, 3]), 6)


def _mean_best_cosine(points: np.ndarray, centroids: np.ndarray) -> float:
    """Mean over points of the cosine to the nearest centroid, in float64."""
    c = centroids.astype(np.float64)
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    return float(np.mean(np.max(points.astype(np.float64) @ c.T, axis=1)))


def test_two_level_centroids_fit_as_well_as_one_level_kmeans(data: np.ndarray) -> None:
    nlist = 256
    two = two_level_centroids(data, nlist, seed=0, spherical=True)
    assert two.shape == (nlist, DIM) and two.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(two, axis=1), 1.0, atol=1e-5)
    one = faiss.Kmeans(DIM, nlist, niter=10, seed=0, spherical=True)
    one.train(data)
    rng = np.random.default_rng(0)
    random = data[rng.choice(len(data), nlist, replace=False)]
    fit_two, fit_one = _mean_best_cosine(data, two), _mean_best_cosine(data, one.centroids)
    fit_random = _mean_best_cosine(data, random)
    assert fit_two >= fit_one - 0.02, (fit_two, fit_one)
    assert fit_two > fit_random + 0.01, (fit_two, fit_random)


def _recall(index: object, data: np.ndarray, queries: np.ndarray) -> float:
    truth = np.argsort(-(queries.astype(np.float64) @ data.astype(np.float64).T), axis=1)[:, :10]
    _, found = index.search(queries, 10)  # type: ignore[attr-defined]
    return float(np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth, strict=True)]))


def test_a_large_ivf_is_trained_in_two_levels_and_searches_as_well(
    data: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = IndexConfig(factory="IVF128,Flat", target_recall=0.9)
    queries = data[:200]
    built_one, _ = build_index(data, config, QUIET, seed=0)
    calls: list[int] = []
    original = coarse.two_level_centroids

    def spy(sample: np.ndarray, nlist: int, seed: int, spherical: bool) -> np.ndarray:
        calls.append(nlist)
        return original(sample, nlist, seed, spherical)

    monkeypatch.setattr(coarse, "TWO_LEVEL_FROM", 128)
    monkeypatch.setattr(coarse, "two_level_centroids", spy)
    built_two, record = build_index(data, config, QUIET, seed=0)
    assert calls == [128]
    for index in (built_one, built_two):
        faiss.extract_index_ivf(index).nprobe = 4
    assert _recall(built_two, data, queries) >= _recall(built_one, data, queries) - 0.03
    assert record["train_points"] == 64 * 128
