"""Retrieval by binary codes: Hamming neighbours against a popcount brute force (ties
included), and the codes' metrics on a hand-computed case where ties decide."""

from __future__ import annotations

import numpy as np
import pytest

from pactl.codes import hamming


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
    scores = hamming.score_codes(codes, labels, (1, 2))
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
    """Recall@k, MAP@R and R-precision from each query's whole (distance, position) order, by
    definition (queries with nothing of their class to find left out)."""
    recalls: dict[int, list[bool]] = {k: [] for k in ks}
    aps, rps = [], []
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
        rps.append(found / r)
    out = {f"recall@{k}": float(np.mean(v)) for k, v in recalls.items()}
    out["map@r"] = float(np.mean(aps))
    out["r_precision"] = float(np.mean(rps))
    return out


@pytest.mark.parametrize("with_gallery", [False, True])
def test_hamming_metrics_match_a_brute_force(with_gallery: bool) -> None:
    rng = np.random.default_rng(8)
    centres = rng.standard_normal((5, 16))
    labels = rng.integers(0, 5, 90)
    codes = (centres[labels] + rng.standard_normal((90, 16))).astype(np.float32)
    if with_gallery:
        q, ql, g, gl = codes[:30], labels[:30], codes[30:], labels[30:]
        got = hamming.score_codes(q, ql, (1, 4), g, gl)
        expected = brute_force_metrics(q, ql, g, gl, False, (1, 4))
    else:
        got = hamming.score_codes(codes, labels, (1, 4))
        expected = brute_force_metrics(codes, labels, codes, labels, True, (1, 4))
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, abs=1e-12), name


def test_pack_is_the_signs_in_packbits_order() -> None:
    vectors = np.array([[0.5, -1, 2, -3, 0, 1, 1, -1, 0.1]], dtype=np.float32)
    assert hamming.pack(vectors).tolist() == [[0b10100110, 0b10000000]]


def test_signs_refuse_what_is_no_set_of_vectors_and_zero_is_negative() -> None:
    """Guards against an empty set or a 1-D array taken for codes, a single row or a single
    bit refused, and 0 read as a 1 bit (pack and FAISS take 0 as 0)."""
    for shape in [(0, 4), (4, 0), (0, 0), (4,)]:
        with pytest.raises(ValueError, match="non-empty"):
            hamming.signs(np.ones(shape, dtype=np.float32))
    assert hamming.signs(np.array([[0.0, 2.0, -1.0]])).tolist() == [[-1, 1, -1]]
    assert hamming.signs(np.array([[0.0], [3.0]])).tolist() == [[-1], [1]]


@pytest.mark.parametrize("exclude_self", [False, True])
def test_hamming_neighbours_for_every_k_and_only_those(exclude_self: bool) -> None:
    """Guards against a selection that keeps k items but not the k nearest (a partition at
    the wrong rank), a k limit off by one either way, non-integer distances, and a default
    that leaves each query's own item out: every k from 1 to all the gallery (less the query
    itself) is the brute force's prefix, and one more is refused."""
    rng = np.random.default_rng(11)
    gallery = rng.standard_normal((24, 6)).astype(np.float32)  # 6 bits, 24 items: ties
    pairs = popcount_neighbours(gallery, gallery, exclude_self)
    available = 23 if exclude_self else 24
    for k in range(1, available + 1):
        if exclude_self:
            distances, indices = hamming.neighbours(gallery, gallery, k, True)
        else:
            distances, indices = hamming.neighbours(gallery, gallery, k)  # the default
        assert distances.dtype == np.int64 and indices.dtype == np.int64
        assert distances.tolist() == [[d for d, _ in p[:k]] for p in pairs], k
        assert indices.tolist() == [[j for _, j in p[:k]] for p in pairs], k
    for k in (0, available + 1):
        with pytest.raises(ValueError, match="k must be in"):
            hamming.neighbours(gallery, gallery, k, exclude_self)
    # a gallery large enough that numpy's partition does not leave it sorted by chance
    large = rng.standard_normal((400, 12)).astype(np.float32)
    want = popcount_neighbours(large[:10], large, False)
    for k in (1, 2, 7):
        _, indices = hamming.neighbours(large[:10], large, k)
        assert indices.tolist() == [[j for _, j in p[:k]] for p in want], k


# Four 4-bit codes: from item 0, item 1 is 1 bit away, item 3 two, item 2 four (the farthest).
EDGE_CODES = np.array(
    [[1, 1, 1, 1], [1, 1, 1, -1], [-1, -1, -1, -1], [1, 1, -1, -1]], dtype=np.float32
)


def test_hamming_metrics_at_the_edges_without_a_gallery() -> None:
    """Guards against K capped at the wrong count (past the gallery: refused; short of it: the
    farthest class-mate missed), and a class of one item counted as a query with nothing
    found: items 0 and 2 share a class and are each other's farthest, item 4 is alone."""
    codes = np.vstack([EDGE_CODES, [[-1, 1, -1, 1]]]).astype(np.float32)
    labels = np.array([1, 0, 1, 0, 7])
    got = hamming.score_codes(codes, labels, (1, 3, 1000))
    expected = brute_force_metrics(codes, labels, codes, labels, True, (1, 3, 1000))
    assert got == pytest.approx(expected, abs=1e-12) and set(got) == set(expected)
    assert got["recall@1000"] == 1.0 and got["recall@1"] < 1.0


def test_hamming_metrics_at_the_edges_with_a_gallery() -> None:
    """Guards against a query of a class the gallery lacks (the highest label) counted or
    crashing the lookup, and K capped short of the whole gallery: query 0's only class-mate
    is the gallery's farthest item."""
    queries = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, -1]], dtype=np.float32)
    q_labels = np.array([1, 9, 0])
    g_labels = np.array([0, 0, 1, 0])
    got = hamming.score_codes(queries, q_labels, (1, 10), EDGE_CODES, g_labels)
    expected = brute_force_metrics(queries, q_labels, EDGE_CODES, g_labels, False, (1, 10))
    assert got == pytest.approx(expected, abs=1e-12) and set(got) == set(expected)
    assert (got["recall@1"], got["recall@10"], got["map@r"]) == (0.5, 1.0, 0.5)
    with pytest.raises(ValueError, match="ks must be positive"):
        hamming.score_codes(queries, q_labels, (0, 1), EDGE_CODES, g_labels)


def test_hamming_nmi_is_that_of_the_unit_codes_with_the_seed() -> None:
    """Guards against NMI computed on the float vectors instead of their codes, with another
    seed than the one given (0 by default), or left out: on random codes k-means' result
    depends on its seed, so each call must match its own seed's clustering of the codes."""
    from pactl import metrics

    rng = np.random.default_rng(2)
    labels = rng.integers(0, 4, 40)
    vectors = rng.standard_normal((40, 8)).astype(np.float32)
    codes = np.where(vectors > 0, 1.0, -1.0).astype(np.float32) / np.float32(np.sqrt(8))
    by_seed = {seed: metrics.nmi(codes, labels, seed) for seed in (0, 1, 2)}
    assert len(set(by_seed.values())) == 3  # the seed matters on these codes
    assert hamming.score_codes(vectors, labels, (1,), with_nmi=True)["nmi"] == by_seed[0]
    assert hamming.score_codes(vectors, labels, (1,), with_nmi=True, seed=2)["nmi"] == by_seed[2]
    separated = np.repeat(np.eye(4, 8, dtype=np.float32) * 2 - 1, 5, axis=0)
    assert hamming.score_codes(separated, np.repeat(np.arange(4), 5), (1,), with_nmi=True)[
        "nmi"
    ] == pytest.approx(1.0)
