"""Retrieval metrics against hand-computed cases and a float64 brute force written here."""

from __future__ import annotations

import numpy as np
import pytest

from pactl.metrics import knn, map_at_r, nmi, r_precision, recall_at_k, score_vectors


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def clustered(
    rng: np.random.Generator, n: int, classes: int, dim: int, noise: float
) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors around one random centre per class, so metrics land mid-range."""
    labels = rng.integers(0, classes, n)
    centres = rng.standard_normal((classes, dim))
    return unit(centres[labels] + noise * rng.standard_normal((n, dim))), labels


def brute_force_order(queries: np.ndarray, gallery: np.ndarray, self_match: bool) -> np.ndarray:
    """(Q, N) gallery indices by decreasing float64 cosine; the query itself last when present."""
    sim = queries.astype(np.float64) @ gallery.astype(np.float64).T
    if self_match:
        np.fill_diagonal(sim, -np.inf)
    return np.argsort(-sim, axis=1, kind="stable")


def reference_metrics(
    ranked_labels: np.ndarray, query_labels: np.ndarray, r: np.ndarray, ks: list[int]
) -> dict[str, float]:
    """The metric definitions spelled out one query at a time."""
    totals = dict.fromkeys([f"recall@{k}" for k in ks] + ["map@r", "r_precision"], 0.0)
    counted = 0
    for row, label, big_r in zip(ranked_labels, query_labels, r, strict=True):
        if big_r == 0:
            continue
        counted += 1
        rel = [int(x == label) for x in row]
        for k in ks:
            totals[f"recall@{k}"] += float(any(rel[:k]))
        found, precision_sum = 0, 0.0
        for i in range(big_r):
            if rel[i]:
                found += 1
                precision_sum += found / (i + 1)
        totals["map@r"] += precision_sum / big_r
        totals["r_precision"] += sum(rel[:big_r]) / big_r
    return {name: value / counted for name, value in totals.items()}


# --- hand-computed cases ---------------------------------------------------------------


def test_recall_counts_a_query_once_any_of_its_first_k_matches() -> None:
    table = np.array([[2, 1, 1], [5, 7, 2], [9, 9, 9], [0, 2, 2]])
    labels = np.array([2, 2, 1, 2])
    # first hits at positions 1, 3, none, 2
    assert recall_at_k(table, labels, [1, 2, 3]) == {1: 0.25, 2: 0.5, 3: 0.75}


def test_map_at_r_worked_example() -> None:
    # R=4, hits at ranks 1 and 3 (the hit at rank 5 is past R): (1/1 + 2/3) / 4.
    # R=2, one hit at rank 2: (1/2) / 2.
    table = np.array([[7, 0, 7, 0, 7], [0, 3, 3, 0, 0]])
    labels = np.array([7, 3])
    r = np.array([4, 2])
    assert map_at_r(table, labels, r) == pytest.approx(((1 + 2 / 3) / 4 + 0.25) / 2)
    assert r_precision(table, labels, r) == pytest.approx((2 / 4 + 1 / 2) / 2)


def test_queries_with_nothing_to_retrieve_count_in_no_denominator() -> None:
    table = np.array([[1, 1], [4, 4]])
    labels = np.array([1, 4])
    r = np.array([1, 0])  # the second query's class has no other item
    assert map_at_r(table, labels, r) == 1.0
    assert r_precision(table, labels, r) == 1.0
    with pytest.raises(ValueError, match="no query"):
        map_at_r(table, labels, np.array([0, 0]))


def test_a_table_narrower_than_r_is_refused() -> None:
    with pytest.raises(ValueError, match="R=3"):
        map_at_r(np.array([[1, 1]]), np.array([1]), np.array([3]))
    with pytest.raises(ValueError, match="k=3"):
        recall_at_k(np.array([[1, 1]]), np.array([1]), [3])


def test_score_vectors_leaves_singleton_classes_out() -> None:
    angles = np.radians([0.0, 40.0, 10.0])  # a1, a2, and b between them nearer a1
    x = np.stack([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)
    labels = np.array([0, 0, 1])  # b is alone in its class
    # a1 ranks b then a2; a2 ranks b then a1: both find their class at rank 2.
    result = score_vectors(x, labels, ks=[1, 2])
    assert result == {"recall@1": 0.0, "recall@2": 1.0, "map@r": 0.0, "r_precision": 0.0}


# --- kNN against brute force --------------------------------------------------------------


def test_knn_matches_brute_force_and_ignores_batch_size() -> None:
    rng = np.random.default_rng(0)
    queries = unit(rng.standard_normal((53, 16)))
    gallery = unit(rng.standard_normal((300, 16)))
    scores, indices = knn(queries, gallery, k=9, batch_size=10)
    expected = brute_force_order(queries, gallery, self_match=False)[:, :9]
    np.testing.assert_array_equal(indices, expected)
    exact = np.take_along_axis(
        queries.astype(np.float64) @ gallery.T.astype(np.float64), expected, 1
    )
    np.testing.assert_allclose(scores, exact, atol=1e-5)
    assert scores.dtype == np.float32 and indices.dtype == np.int64


def test_knn_excludes_the_query_by_id() -> None:
    rng = np.random.default_rng(1)
    x = unit(rng.standard_normal((200, 12)))
    ids = np.arange(200) + 1000  # ids need not be positions
    _, indices = knn(x, x, k=5, query_ids=ids, gallery_ids=ids)
    expected = brute_force_order(x, x, self_match=True)[:, :5]
    np.testing.assert_array_equal(indices, expected)


def test_a_duplicate_of_the_query_stays_its_top_neighbour() -> None:
    rng = np.random.default_rng(2)
    x = unit(rng.standard_normal((60, 8)))
    x[[10, 20, 30]] = x[5]  # four identical vectors: 5, 10, 20, 30
    x[41] = x[40]
    ids = np.arange(60)
    scores, indices = knn(x, x, k=3, query_ids=ids, gallery_ids=ids)
    assert not (indices == ids[:, None]).any()
    for i in (5, 10, 20, 30):
        assert set(indices[i]) == {5, 10, 20, 30} - {i}
        np.testing.assert_allclose(scores[i], 1.0, atol=1e-6)
    assert indices[40, 0] == 41 and indices[41, 0] == 40
    assert scores[40, 0] == pytest.approx(1.0, abs=1e-6)


def test_knn_refuses_bad_arguments() -> None:
    x = unit(np.random.default_rng(3).standard_normal((10, 4)))
    ids = np.arange(10)
    with pytest.raises(ValueError, match="k must be"):
        knn(x, x, k=10, query_ids=ids, gallery_ids=ids)  # only 9 others exist
    with pytest.raises(ValueError, match="dims"):
        knn(x, x[:, :3], k=1)
    with pytest.raises(ValueError, match="both"):
        knn(x, x, k=1, query_ids=ids)
    with pytest.raises(ValueError, match="unique"):
        knn(x, x, k=1, query_ids=ids, gallery_ids=np.zeros(10, dtype=np.int64))


# --- score_vectors against brute force ----------------------------------------------------


# Blocks of 37 leave a ragged last block; blocks of 4 are narrower than the largest R, so a
# query's first block cannot fill its list of best other-class scores.
@pytest.mark.parametrize(("block", "threads"), [(1024, 1), (37, 3), (4, 2)])
def test_score_vectors_matches_brute_force_without_gallery(block: int, threads: int) -> None:
    rng = np.random.default_rng(4)
    x, labels = clustered(rng, n=300, classes=60, dim=8, noise=0.9)
    labels[:3] = [1000, 1001, 1002]  # singletons
    ks = [1, 2, 4, 8, 500]  # 500 is past the 299 others: every query finds its class
    result = score_vectors(x, labels, ks, block_size=block, threads=threads)
    order = brute_force_order(x, x, self_match=True)[:, :-1]  # the query itself is last
    r = np.array([np.sum(labels == y) - 1 for y in labels])
    expected = reference_metrics(labels[order], labels, r, ks)
    assert result.keys() == expected.keys()
    assert 0.2 < result["recall@1"] < 0.9 and result["recall@500"] == 1.0
    for name, value in expected.items():
        assert result[name] == pytest.approx(value, abs=1e-12), name


def test_score_vectors_matches_brute_force_with_gallery() -> None:
    rng = np.random.default_rng(5)
    centres = rng.standard_normal((30, 8))
    q_labels = rng.integers(0, 30, 120)
    g_labels = rng.integers(0, 25, 200)  # query classes 25..29 have nothing to find
    queries = unit(centres[q_labels] + 0.8 * rng.standard_normal((120, 8)))
    gallery = unit(centres[g_labels] + 0.8 * rng.standard_normal((200, 8)))
    ks = [1, 5, 10]
    result = score_vectors(
        queries, q_labels, ks, gallery_vectors=gallery, gallery_labels=g_labels, block_size=50
    )
    order = brute_force_order(queries, gallery, self_match=False)
    r = np.array([np.sum(g_labels == y) for y in q_labels])
    assert (r == 0).any()
    expected = reference_metrics(g_labels[order], q_labels, r, ks)
    for name, value in expected.items():
        assert result[name] == pytest.approx(value, abs=1e-12), name


def test_score_vectors_agrees_with_the_table_metrics_on_a_knn_table() -> None:
    rng = np.random.default_rng(6)
    x, labels = clustered(rng, n=250, classes=20, dim=6, noise=1.0)
    ids = np.arange(len(x))
    r = np.array([np.sum(labels == y) - 1 for y in labels])
    _, indices = knn(x, x, k=int(r.max()), query_ids=ids, gallery_ids=ids)
    table = labels[indices]
    result = score_vectors(x, labels, [1, 3])
    assert result["map@r"] == pytest.approx(map_at_r(table, labels, r), abs=1e-12)
    assert result["r_precision"] == pytest.approx(r_precision(table, labels, r), abs=1e-12)
    recalls = recall_at_k(table, labels, [1, 3])
    assert (result["recall@1"], result["recall@3"]) == (recalls[1], recalls[3])


def test_score_vectors_refuses_sets_with_nothing_to_retrieve() -> None:
    x = unit(np.random.default_rng(8).standard_normal((4, 3)))
    with pytest.raises(ValueError, match="no query"):
        score_vectors(x, np.arange(4), ks=[1])
    with pytest.raises(ValueError, match="ks"):
        score_vectors(x, np.zeros(4, dtype=np.int64), ks=[0])


# --- NMI ------------------------------------------------------------------------------------


def test_nmi_is_one_on_separated_clusters_and_low_on_random_labels() -> None:
    rng = np.random.default_rng(7)
    x, labels = clustered(rng, n=400, classes=10, dim=16, noise=0.01)
    assert nmi(x, labels) == pytest.approx(1.0, abs=1e-9)
    assert score_vectors(x, labels, [1], with_nmi=True)["nmi"] == pytest.approx(1.0, abs=1e-9)
    shuffled = rng.permutation(labels)
    assert nmi(x, shuffled) < 0.15


# --- limits, ties and the sweep's own record ---------------------------------------------


def test_each_refusal_names_the_argument_at_fault() -> None:
    """Guards against a message naming the wrong input (or none): each bad argument of knn and
    nmi is named in its refusal."""
    x = unit(np.random.default_rng(10).standard_normal((6, 4)))
    ids = np.arange(6)
    cases = [
        (lambda: knn(x[0], x, k=1), "queries must be"),
        (lambda: knn(x, x[0], k=1), "gallery must be"),
        (lambda: knn(x, x, k=1, query_ids=ids[:5], gallery_ids=ids), "query_ids must be"),
        (lambda: knn(x, x, k=1, query_ids=ids, gallery_ids=ids[:5]), "gallery_ids must be"),
        (lambda: nmi(x[0], ids), "vectors must be"),
        (lambda: nmi(x, ids[:5]), "labels must be"),
        (lambda: knn(x[:0], x, k=1), "queries must be a non-empty"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()


def test_each_refusal_of_score_vectors_names_the_argument_at_fault() -> None:
    """Guards against a message naming the wrong input (or none), and a block size of 0 let
    through when no thread count is given: each bad argument of score_vectors is named."""
    x = unit(np.random.default_rng(10).standard_normal((6, 4)))
    ids = np.arange(6)
    cases = [
        (lambda: score_vectors(x[0], ids, [1]), "^vectors must be"),
        (lambda: score_vectors(x, ids[:5], [1]), "^labels must be"),
        (lambda: score_vectors(x, ids, [1], x[:, :0], ids), "^gallery_vectors must be"),
        (lambda: score_vectors(x, ids, [1], x, ids[:5]), "^gallery_labels must be"),
        (lambda: score_vectors(x, ids % 2, [1], block_size=0), "block_size and threads"),
        (lambda: score_vectors(x, ids % 2, [1], threads=0), "block_size and threads"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()


def test_knn_at_its_limits() -> None:
    """Guards against limits moved by one: k may be the whole gallery (less the query with
    ids), a batch may be one query, and a batch of 0 is refused."""
    rng = np.random.default_rng(11)
    x = unit(rng.standard_normal((7, 5)))
    ids = np.arange(7)
    _, everything = knn(x, x, k=7, batch_size=1)
    np.testing.assert_array_equal(everything, brute_force_order(x, x, self_match=False))
    _, others = knn(x, x, k=6, query_ids=ids, gallery_ids=ids)
    np.testing.assert_array_equal(others, brute_force_order(x, x, self_match=True)[:, :6])
    with pytest.raises(ValueError, match="batch_size"):
        knn(x, x, k=1, batch_size=0)
    _, alone = knn(x[:1], x, k=2)  # one query
    np.testing.assert_array_equal(alone, brute_force_order(x[:1], x, self_match=False)[:, :2])
    line = np.array([[0.5], [-1.0], [2.0]], dtype=np.float32)  # one dimension
    np.testing.assert_array_equal(knn(line, line, k=1)[1], [[2], [1], [2]])


def test_knn_drops_only_the_queries_own_ids() -> None:
    """Guards against one query's own id dropping a neighbour of every query in its batch:
    half the queries have ids the gallery lacks, and they keep their true first neighbour."""
    rng = np.random.default_rng(12)
    x = unit(rng.standard_normal((40, 6)))
    query_ids = np.where(np.arange(40) % 2 == 0, np.arange(40), np.arange(40) + 1000)
    _, got = knn(x, x, k=4, query_ids=query_ids, gallery_ids=np.arange(40))
    sim = x.astype(np.float64) @ x.T.astype(np.float64)
    for i in range(0, 40, 2):  # the even queries' own items are left out, no other
        sim[i, i] = -np.inf
    np.testing.assert_array_equal(got, np.argsort(-sim, axis=1, kind="stable")[:, :4])
    assert (got[1::2, 0] == np.arange(1, 40, 2)).all()  # odd queries find themselves first


def test_table_metrics_refuse_labels_of_another_length() -> None:
    """Guards against query labels of the wrong length being broadcast against the table."""
    with pytest.raises(ValueError, match="must be \\(Q, K\\)"):
        recall_at_k(np.zeros((3, 2), dtype=np.int64), np.zeros(4, dtype=np.int64), [1])


def test_nmi_limits_and_its_seed() -> None:
    """Guards against 2 classes or one point per class refused, and a clustering that does
    not follow the seed given: the same seed repeats, on data where seeds disagree."""
    rng = np.random.default_rng(13)
    x, labels = clustered(rng, n=60, classes=2, dim=4, noise=0.05)
    assert nmi(x, labels) == pytest.approx(1.0)
    x4 = unit(rng.standard_normal((4, 3)))
    assert nmi(x4, np.arange(4)) == pytest.approx(1.0)
    codes = unit(rng.standard_normal((40, 8)))
    random_labels = rng.integers(0, 4, 40)
    by_seed = [nmi(codes, random_labels, seed) for seed in (0, 1, 2)]
    assert len(set(by_seed)) > 1  # the seed matters here
    assert [nmi(codes, random_labels, seed) for seed in (0, 1, 2)] == by_seed


def test_kmeans_plusplus_draws_in_proportion_to_squared_distance() -> None:
    """Guards against a wrong distance or a draw that can never reach the last point: on
    three points at 0, 1 and 3, the first centre is uniform and the second is drawn with
    probability d^2 / sum d^2 (e.g. after 1: 1/5 for 0, 4/5 for 3), over 6,000 seeded draws."""
    from pactl.metrics import _kmeans_plusplus

    x = np.array([[0.0], [1.0], [3.0]], dtype=np.float32)
    counts = np.zeros((3, 3))
    for seed in range(6000):
        first, second = _kmeans_plusplus(x, 2, np.random.default_rng(seed))[:, 0]
        counts[[0.0, 1.0, 3.0].index(first), [0.0, 1.0, 3.0].index(second)] += 1
    expected = np.array([[0, 1, 9], [1, 0, 4], [9, 4, 0]], dtype=np.float64)
    expected /= 3 * expected.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(counts / 6000, expected, atol=0.02)


def test_block_size_and_threads_change_no_number_even_at_exact_ties() -> None:
    """Guards against a tie between a same-class score and an other-class one counted one way
    in a query's first block and the other way in the rest, or one way by Recall@k and the
    other by MAP@R: coordinates of 0, 0.5 and 1 make the products exact, and level scores
    rank the same-class item first (ranking the other first would change every number)."""
    x = np.array([[1, 0], [0.5, 0.5], [0.5, 0.5], [0, 1], [1, 0], [0, 1]], dtype=np.float32)
    labels = np.array([0, 0, 1, 1, 2, 2])
    sim = x.astype(np.float64) @ x.T.astype(np.float64)
    r = np.array([np.sum(labels == y) - 1 for y in labels])

    def ranked(other_first: bool) -> dict[str, float]:
        other = (labels[None, :] != labels[:, None]) != other_first
        order = [
            sorted((j for j in range(6) if j != i), key=lambda j: (-sim[i, j], other[i, j]))
            for i in range(6)
        ]
        return reference_metrics(labels[np.array(order)], labels, r, [1, 2])

    assert ranked(other_first=True) != ranked(other_first=False)  # the ties decide
    for block, threads in [(1024, 1), (1, 1), (1, 2), (2, 1), (4, 2)]:
        got = score_vectors(x, labels, [1, 2], block_size=block, threads=threads)
        assert got == pytest.approx(ranked(other_first=False), abs=1e-12), (block, threads)


# 6 classes: R is about 10, wider than a small block; 20 classes and blocks of 30: a query's
# first block fills its short list with real scores before the other blocks are read.
@pytest.mark.parametrize(("classes", "block"), [(6, 1), (6, 2), (6, 7), (6, 1024), (20, 30)])
def test_the_sweep_gathers_each_querys_best_other_class_scores(classes: int, block: int) -> None:
    """Guards against the sweep missing other-class scores (a bar set too high when reading a
    block down its columns) or inventing some (a thread's list started from more than the
    bar): its record, for each query, of how many other-class items beat its best same-class
    one and of its R best other-class scores, is the brute force's."""
    from pactl.metrics import _positives, _Sweep

    rng = np.random.default_rng(14)
    x, labels = clustered(rng, n=60, classes=classes, dim=4, noise=1.5)
    width = max(int(np.sum(labels == y)) - 1 for y in labels)
    sim = x.astype(np.float64) @ x.T.astype(np.float64)
    other = np.where(labels[:, None] != labels[None, :], sim, -np.inf)
    same = np.where(labels[:, None] == labels[None, :], sim, -np.inf)
    np.fill_diagonal(same, -np.inf)
    positives, pairs = _positives(x, labels, x, labels, True, width)
    best = positives[:, 0].astype(np.float32)
    above, negatives = _Sweep(x, x, best, pairs, True, width, block).run(2, None)
    np.testing.assert_allclose(negatives, -np.sort(-other, axis=1)[:, :width], atol=1e-6)
    np.testing.assert_array_equal(above, (other > same.max(axis=1)[:, None]).sum(axis=1))


def lloyd_nmi(x: np.ndarray, labels: np.ndarray, seed: int, iterations: int) -> float:
    """NMI of k-means from pactl's k-means++ seeding, then Lloyd's iterations in float64
    over every point (assign to the nearest centre, move each centre to its points' mean)."""
    from sklearn.metrics import normalized_mutual_info_score

    from pactl.metrics import _kmeans_plusplus

    classes = np.unique(labels).size
    centres = _kmeans_plusplus(x, classes, np.random.default_rng(seed)).astype(np.float64)
    points = x.astype(np.float64)
    for _ in range(iterations + 1):
        nearest = ((points[:, None, :] - centres[None]) ** 2).sum(axis=2).argmin(axis=1)
        centres = np.stack([points[nearest == c].mean(axis=0) for c in range(classes)])
    return float(normalized_mutual_info_score(labels, nearest))


def test_nmi_is_20_lloyd_iterations_on_every_point() -> None:
    """Guards against k-means run for another number of iterations, on a subsample of the
    points (FAISS's default above 256 a centre), or with another default seed than 0: 3,000
    uniform points in 10 classes are far from settled after 20 iterations, so each of those
    changes the clustering."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 3000)
    x = rng.random((3000, 2)).astype(np.float32)
    assert nmi(x, labels) == pytest.approx(lloyd_nmi(x, labels, 0, 20), abs=1e-12)
    assert lloyd_nmi(x, labels, 0, 21) != pytest.approx(lloyd_nmi(x, labels, 0, 20), abs=1e-6)


def test_score_vectors_passes_its_seed_and_reports_progress() -> None:
    """Guards against score_vectors's NMI ignoring the seed given (or defaulting to another than
    0), and progress never reported: the progress steps add up to the queries."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 3000)
    x = rng.random((3000, 2)).astype(np.float32)
    steps: list[int] = []
    got = score_vectors(x, labels, [1], with_nmi=True, progress=steps.append, block_size=700)
    assert got["nmi"] == nmi(x, labels, 0) and sum(steps) == 3000 and len(steps) == 5
    assert score_vectors(x, labels, [1], with_nmi=True, seed=3)["nmi"] == nmi(x, labels, 3)
    assert nmi(x, labels, 3) != nmi(x, labels, 0)


def test_float64_vectors_give_the_float32_numbers() -> None:
    """Guards against float64 input being used as it comes (the products then differ from
    the float32 ones every other path computes): knn, score_vectors and nmi cast it first."""
    rng = np.random.default_rng(15)
    x, labels = clustered(rng, n=90, classes=6, dim=5, noise=1.0)
    wide = x.astype(np.float64)
    for a, b in zip(knn(wide, wide, k=4), knn(x, x, k=4), strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert score_vectors(wide, labels, [1, 4], with_nmi=True) == score_vectors(
        x, labels, [1, 4], with_nmi=True
    )
