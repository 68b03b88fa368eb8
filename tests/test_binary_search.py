"""A binary bundle's search (pactl.index.binary.search) taken apart: the rescoring of candidate
ids against a float64 brute force (exact ties, missing candidates, the item at row 0, a block
of queries at a time), the candidates at their edges (none wanted, one item, all level), the
padding of short rows, FAISS search parameters passed through, and the widening each kind of
code index offers."""

from __future__ import annotations

from collections.abc import Callable

import faiss
import numpy as np
import pytest
from conftest import unit
from test_binary import code_index, none_rotation, popcount_top

from pactl.errors import PactlError
from pactl.index import rescoring
from pactl.index.binary.search import hnsw_of
from pactl.index.rescoring import MAX_RESCORE, rescore

FIRST_ID = 100  # item ids are rows + FIRST_ID, so no id is a row and id 0 is no item


def id_positions(n: int) -> Callable[[np.ndarray], np.ndarray]:
    """Item ids -> rows of the floats, -1 for an id that is no item (as a bundle maps them)."""

    def positions(ids: np.ndarray) -> np.ndarray:
        rows = np.asarray(ids, dtype=np.int64) - FIRST_ID
        return np.where((rows >= 0) & (rows < n), rows, -1)

    return positions


def tied_floats() -> np.ndarray:
    """30 rows of only 3 distinct unit vectors: most candidates' cosines tie exactly."""
    rng = np.random.default_rng(4)
    distinct = unit(rng.standard_normal((3, 8))).astype(np.float32)
    return distinct[np.arange(30) % 3]


def rescore_reference(
    floats: np.ndarray, queries: np.ndarray, found: np.ndarray, k: int
) -> tuple[list[list[float]], list[list[int]]]:
    """Each row's candidates by float64 cosine, level ones in candidate order, missing ones
    (-1) left out; then padded to min(k, m) with -inf and -1."""
    want_scores, want_ids = [], []
    for q, row in zip(queries.astype(np.float64), found, strict=True):
        scored = [
            (-(floats[i - FIRST_ID].astype(np.float64) @ q), at, int(i))
            for at, i in enumerate(row)
            if i >= 0
        ]
        best = sorted(scored)[:k]
        width = min(k, found.shape[1])
        want_scores.append([-s for s, _, _ in best] + [-np.inf] * (width - len(best)))
        want_ids.append([i for _, _, i in best] + [-1] * (width - len(best)))
    return want_scores, want_ids


@pytest.mark.parametrize("block_bytes", [32 * 2**20, 1])  # one block; a block a query
def test_rescore_is_the_float64_order_ties_in_candidate_order(
    block_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards against an unstable sort reordering exact ties, the item at row 0 scored as
    another or dropped, missing candidates (-1) scored or ranked first, and a block of queries
    without candidates ending the rescoring: the first query has none, the others 24 of 30
    items (only 3 distinct vectors), some missing, the item at row 0 among them."""
    monkeypatch.setattr(rescoring, "RESCORE_BYTES", block_bytes)
    floats = tied_floats()
    rng = np.random.default_rng(5)
    queries = unit(rng.standard_normal((4, 8))).astype(np.float32)
    found = np.stack([rng.permutation(30)[:24] + FIRST_ID for _ in range(4)]).astype(np.int64)
    found[0] = -1
    found[1, [3, 11, 20]] = -1
    found[2, 5] = FIRST_ID  # row 0
    for k in (5, 24, 30):
        scores, ids = rescore(floats, id_positions(30), queries, found, k)
        want_scores, want_ids = rescore_reference(floats, queries, found, k)
        assert scores.dtype == np.float32 and ids.tolist() == want_ids, k
        assert np.allclose(scores, want_scores, atol=1e-6) and np.isneginf(scores[0]).all()


def test_rescore_refuses_a_candidate_that_is_no_item() -> None:
    """Guards against a candidate id that maps to no row (a code index out of step with the
    item table) being scored as some other row: id 0 is no item here; row 0 is one."""
    floats = tied_floats()
    queries = floats[:1]
    fine = np.array([[FIRST_ID + 1, FIRST_ID, -1]])  # the query is row 0's vector
    assert rescore(floats, id_positions(30), queries, fine, 2)[1].tolist() == [[100, 101]]
    with pytest.raises(PactlError, match="not an item: rebuild"):
        rescore(floats, id_positions(30), queries, np.array([[FIRST_ID, 0]]), 2)


def test_rescore_drops_the_pages_of_each_blocks_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards against pages left mapped (or the wrong ones dropped) after a block is read: one
    query a block, each drop covers its candidates' rows from the first to the last."""
    dropped: list[tuple[int, int]] = []
    floats = tied_floats()
    base, row_bytes = floats.__array_interface__["data"][0], floats.strides[0]

    def record(rows: np.ndarray) -> bool:
        dropped.append(((rows.__array_interface__["data"][0] - base) // row_bytes, len(rows)))
        return False

    monkeypatch.setattr(rescoring, "drop_pages", record)
    monkeypatch.setattr(rescoring, "RESCORE_BYTES", 1)
    found = np.array([[FIRST_ID + 7, FIRST_ID + 3, FIRST_ID + 9], [FIRST_ID, -1, FIRST_ID + 4]])
    rescore(floats, id_positions(30), floats[:2], found, 2)
    assert dropped == [(3, 7), (0, 5)]


def small_index(n: int, factory: str = "BFlat", seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    vectors = unit(rng.standard_normal((n, 16))).astype(np.float32)
    ids = np.arange(n, dtype=np.int64) + FIRST_ID
    return code_index(vectors, ids, none_rotation(16), factory), vectors, ids


def test_candidates_at_their_edges() -> None:
    """Guards against wrong shapes or dtypes when no candidate is wanted, a one-item index
    (the fetch then has one column), and a cut level with every item where no deeper fetch is
    possible (it must end, not fetch again forever): each against the popcount brute force."""
    binary, vectors, ids = small_index(40)
    q = binary.rotation.codes(vectors[:5])
    distances, found = binary.candidates(q, 0)
    assert (distances.shape, distances.dtype, found.shape, found.dtype) == (
        (5, 0),
        np.int32,
        (5, 0),
        np.int64,
    )
    for m in (1, 3):
        distances, found = binary.candidates(q, m)
        want_d, want_i = popcount_top(q, binary.rotation.codes(vectors), ids, m)
        assert distances.dtype == np.int32 and np.array_equal(distances, want_d)
        assert np.array_equal(found, want_i)
    one, vectors, _ = small_index(1)
    assert one.candidates(one.rotation.codes(vectors), 1)[1].tolist() == [[FIRST_ID]]
    same = np.repeat(vectors, 10, axis=0)  # 10 items, one code: every cut is level
    level = code_index(same, np.arange(10, dtype=np.int64), none_rotation(16))
    distances, found = level.candidates(level.rotation.codes(same[:2]), 5)
    assert found.tolist() == [[0, 1, 2, 3, 4]] * 2 and not distances.any()


@pytest.mark.parametrize("rescore_depth", [0, 2])
def test_search_pads_short_rows_as_faiss_does(rescore_depth: int) -> None:
    """Guards against a row of fewer hits than k left short, or padded with anything but -1
    and -inf (or +inf, which would sort first), and scores that are not float32: 6 items,
    k = 6 (no padding), 7 and 9."""
    binary, vectors, _ = small_index(6)
    binary = binary.with_rescore(rescore_depth)
    for k in (6, 7, 9):
        scores, found = binary.search(vectors[:3], k)
        assert scores.shape == found.shape == (3, k) and scores.dtype == np.float32
        assert (found[:, 6:] == -1).all() and np.isneginf(scores[:, 6:]).all()
        assert (found[:, :6] >= FIRST_ID).all() and np.isfinite(scores[:, :6]).all()


@pytest.mark.parametrize("rescore_depth", [0, 3])
def test_search_parameters_reach_the_code_index(rescore_depth: int) -> None:
    """Guards against FAISS search parameters (pactl.index.search's widening of short rows)
    being dropped: an IVF probing 1 of 8 lists leaves candidates missing (-1, scored -inf,
    never +inf), and probing all 8 through `params` finds the exhaustive index's hits."""
    exact, vectors, _ = small_index(64, seed=1)
    ivf, _, _ = small_index(64, "BIVF8", seed=1)
    assert faiss.downcast_IndexBinary(ivf.codes).nprobe == 1
    exact, ivf = exact.with_rescore(rescore_depth), ivf.with_rescore(rescore_depth)
    queries = vectors[:6]
    scores, found = ivf.search(queries, 20)
    assert (found == -1).any() and np.isneginf(scores[found == -1]).all()
    assert not np.isposinf(scores).any()
    wide = faiss.SearchParametersIVF(nprobe=8)
    got_scores, got = ivf.search(queries, 20, params=wide)
    want_scores, want = exact.search(queries, 20)
    assert np.array_equal(got, want) and np.allclose(got_scores, want_scores)


def test_widening_of_each_kind_of_code_index() -> None:
    """Guards against a widening that does not widen (or narrows), one that stops short of
    the index's width or claims it early, and the wrong kind found: IVF nprobe and HNSW
    efSearch grow by the factor up to all lists or all items, and say so exactly there."""
    ivf, _, _ = small_index(64, "BIVF8")
    faiss.downcast_IndexBinary(ivf.codes).nprobe = 2
    wider, widest = ivf.widening()
    assert [wider(f).nprobe for f in (1, 2, 3, 8)] == [2, 4, 6, 8]
    assert [widest(f) for f in (1, 3, 4, 8)] == [False, False, True, True]
    graph, _, _ = small_index(64, "BHNSW8")
    hnsw_of(graph.codes).hnsw.efSearch = 16
    wider, widest = graph.widening()
    assert [wider(f).efSearch for f in (1, 2, 3, 8)] == [16, 32, 48, 64]
    assert [widest(f) for f in (1, 3, 4, 8)] == [False, False, True, True]
    flat, _, _ = small_index(64)
    wider, widest = flat.widening()
    assert wider(4) is None and widest(1) is True


def test_hnsw_of_finds_the_graph_bare_or_under_an_id_map() -> None:
    """Guards against a graph under an id map missed (its widening lost), or a bare index
    taken for an id map."""
    bare = faiss.index_binary_factory(16, "BHNSW8")
    assert isinstance(hnsw_of(bare), faiss.IndexBinaryHNSW)
    assert isinstance(hnsw_of(faiss.IndexBinaryIDMap2(bare)), faiss.IndexBinaryHNSW)
    assert hnsw_of(faiss.index_binary_factory(16, "BIVF8")) is None
    assert hnsw_of(faiss.IndexBinaryIDMap2(faiss.IndexBinaryFlat(16))) is None


def test_rescoring_depth_takes_0_to_the_maximum() -> None:
    """Guards against the limit moved by one: MAX_RESCORE is allowed, one more is not."""
    binary, _, _ = small_index(4)
    assert binary.with_rescore(MAX_RESCORE).rescore == MAX_RESCORE
    assert binary.with_rescore(0).rescore == 0
    for bad in (-1, MAX_RESCORE + 1):
        with pytest.raises(PactlError, match="--rescore"):
            binary.with_rescore(bad)
