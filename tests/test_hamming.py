"""Retrieval by binary codes: Hamming neighbours against a popcount brute force (ties
included), and the codes' metrics on a hand-computed case where ties decide."""

from __future__ import annotations

import numpy as np
import pytest

from pactl import hamming


def popcount_neighbours(queries: np.ndarray, gallery: np.ndarray, exclude_self: bool) -> list:
    """Every query's gallery order by (Hamming distance, position), counted bit by bit on
    packed codes."""
    q, g = np.packbits(queries > 0, axis=1), np.packbits(gallery > 0, axis=1)
    table = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).sum(axis=1)
    orders = []
    for i, row in enumerate(q):
        dist = table[np.bitwise_xor(g, row)].sum(axis=1)
        pairs = sorted((int(d), j) for j, d in enumerate(dist) if not (exclude_self and j == i))
        orders.append(pairs)
    return orders


@pytest.mark.parametrize("exclude_self", [False, True])
def test_hamming_neighbours_match_a_popcount_brute_force_with_ties(exclude_self: bool) -> None:
    rng = np.random.default_rng(6)
    gallery = rng.standard_normal((60, 8)).astype(np.float32)  # 8 bits, 60 items: many ties
    queries = gallery if exclude_self else rng.standard_normal((7, 8)).astype(np.float32)
    k = 20
    distances, indices = hamming.neighbours(queries, gallery, k, exclude_self, block=3)
    for i, pairs in enumerate(popcount_neighbours(queries, gallery, exclude_self)):
        assert distances[i].tolist() == [d for d, _ in pairs[:k]]
        assert indices[i].tolist() == [j for _, j in pairs[:k]]
    assert len(set(distances.ravel().tolist())) < k  # there were ties to break


def test_hamming_metrics_break_ties_by_id() -> None:
    """Item 0 (class 0) has item 1 (class 1) and item 2 (class 0) at the same distance: by id,
    item 1 comes first, so its Recall@1 is 0 (a tie-break in the same-class item's favour would
    give 1)."""
    codes = np.array(
        [
            [1, 1, 1, 1, 1, 1, 1, 1],  # class 0
            [-1, -1, 1, 1, 1, 1, 1, 1],  # class 1: 2 bits from item 0
            [1, 1, -1, -1, 1, 1, 1, 1],  # class 0: 2 bits from item 0, 4 from item 1
            [-1, -1, -1, -1, -1, -1, 1, 1],  # class 1: 4 bits from item 1, 4 from item 2
        ],
        dtype=np.float32,
    )
    labels = np.array([0, 1, 0, 1])
    # Neighbours by (distance, id): 0 -> 1, 2, 3; 1 -> 0, 2|3 (4, 4: 2 first); 2 -> 0, 1, 3
    # (2; 4, 4); 3 -> 1, 2 (4, 4), 0 (6). First hits: 0 at rank 2, 1 at rank 3, 2 at rank 1,
    # 3 at rank 1. R = 1 for every item.
    scores = hamming.evaluate(codes, labels, (1, 2))
    assert scores["recall@1"] == pytest.approx(2 / 4)
    assert scores["recall@2"] == pytest.approx(3 / 4)
    assert scores["map@r"] == pytest.approx(2 / 4)


def brute_force_metrics(
    queries: np.ndarray,
    q_labels: np.ndarray,
    gallery: np.ndarray,
    g_labels: np.ndarray,
    exclude_self: bool,
    ks: tuple[int, ...],
) -> dict[str, float]:
    """Recall@k and MAP@R from each query's whole (distance, position) order, by definition
    (queries with nothing of their class to find left out)."""
    recalls = {k: [] for k in ks}
    aps = []
    for i, pairs in enumerate(popcount_neighbours(queries, gallery, exclude_self)):
        hits = [g_labels[j] == q_labels[i] for _, j in pairs]
        r = sum(hits)
        if r == 0:
            continue
        for k in ks:
            recalls[k].append(any(hits[:k]))
        found = 0
        precisions = []
        for rank, hit in enumerate(hits[:r], start=1):
            found += hit
            precisions.append(found / rank if hit else 0.0)
        aps.append(sum(precisions) / r)
    out = {f"recall@{k}": float(np.mean(v)) for k, v in recalls.items()}
    out["map@r"] = float(np.mean(aps))
    return out


@pytest.mark.parametrize("with_gallery", [False, True])
def test_hamming_metrics_match_a_brute_force(with_gallery: bool) -> None:
    rng = np.random.default_rng(8)
    centres = rng.standard_normal((5, 16))
    labels = rng.integers(0, 5, 90)
    codes = (centres[labels] + rng.standard_normal((90, 16))).astype(np.float32)
    if with_gallery:
        q, ql, g, gl = codes[:30], labels[:30], codes[30:], labels[30:]
        got = hamming.evaluate(q, ql, (1, 4), g, gl)
        expected = brute_force_metrics(q, ql, g, gl, False, (1, 4))
    else:
        got = hamming.evaluate(codes, labels, (1, 4))
        expected = brute_force_metrics(codes, labels, codes, labels, True, (1, 4))
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, abs=1e-12), name


def test_pack_is_the_signs_in_packbits_order() -> None:
    vectors = np.array([[0.5, -1, 2, -3, 0, 1, 1, -1, 0.1]], dtype=np.float32)
    assert hamming.pack(vectors).tolist() == [[0b10100110, 0b10000000]]
