"""Same-item groups against brute force: connected components, strict groups, what to keep."""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import pytest
from conftest import unit

from pactl.index import dedup, grouping
from pactl.index.dedup import VectorSearcher
from pactl.index.grouping import DedupConfig, Groups, find_groups, removable


def planted(rng: np.random.Generator, n: int, groups: int, dim: int = 16) -> np.ndarray:
    """Random unit vectors, the first `groups` of them each copied 1 to 3 times with noise."""
    base = unit(rng.standard_normal((n, dim)))
    copies = [base]
    for g in range(groups):
        for _ in range(int(rng.integers(1, 4))):
            copies.append(unit(base[g : g + 1] + 0.05 * rng.standard_normal((1, dim))))
    x = np.concatenate(copies)
    return x[rng.permutation(len(x))].astype(np.float32)


def brute_components(x: np.ndarray, t: float) -> set[frozenset[int]]:
    same = (x.astype(np.float64) @ x.T.astype(np.float64)) >= t
    seen, found = set(), set()
    for start in range(len(x)):
        if start in seen:
            continue
        group, todo = {start}, [start]
        while todo:
            for j in np.flatnonzero(same[todo.pop()]).tolist():
                if j not in group:
                    group.add(j)
                    todo.append(j)
        seen |= group
        if len(group) > 1:
            found.add(frozenset(group))
    return found


def brute_strict(x: np.ndarray, t: float) -> set[frozenset[int]]:
    same = (x.astype(np.float64) @ x.T.astype(np.float64)) >= t
    taken: set[int] = set()
    found = set()
    for a in range(len(x)):
        if a in taken:
            continue
        group = {a} | {b for b in range(a + 1, len(x)) if same[a, b] and b not in taken}
        taken |= group
        if len(group) > 1:
            found.add(frozenset(group))
    return found


def as_sets(groups: Groups) -> set[frozenset[int]]:
    return {frozenset(groups.rows[groups.group == g].tolist()) for g in range(1, groups.count + 1)}


@pytest.mark.parametrize("t", [0.9, 0.5, 0.3])
def test_components_match_brute_force(t: float) -> None:
    x = planted(np.random.default_rng(0), 120, 20)
    groups = find_groups(VectorSearcher(x), DedupConfig(threshold=t, batch_size=17))
    assert as_sets(groups) == brute_components(x, t)
    firsts = groups.rows[np.append(True, groups.group[1:] != groups.group[:-1])]
    members = [sorted(s) for s in sorted(as_sets(groups), key=min)]
    assert firsts.tolist() == [m[0] for m in members]  # a group starts with its earliest item
    expected = np.einsum(
        "ij,ij->i", x[np.repeat(firsts, np.bincount(groups.group)[1:])], x[groups.rows]
    )
    assert groups.score == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("t", [0.5, 0.3])
def test_strict_groups_match_brute_force(t: float) -> None:
    x = planted(np.random.default_rng(1), 80, 15)
    groups = find_groups(VectorSearcher(x), DedupConfig(threshold=t, strict=True, batch_size=9))
    assert as_sets(groups) == brute_strict(x, t)
    assert (groups.score >= t - 1e-6).all()  # every member matches its group's first


def test_a_chain_is_one_component_but_not_one_strict_group() -> None:
    angles = np.radians([0.0, 20.0, 40.0])  # neighbours at cos 20 = 0.94, the ends at 0.77
    x = np.stack([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)
    loose = find_groups(VectorSearcher(x), DedupConfig(threshold=0.9))
    strict = find_groups(VectorSearcher(x), DedupConfig(threshold=0.9, strict=True))
    assert as_sets(loose) == {frozenset({0, 1, 2})}
    assert as_sets(strict) == {frozenset({0, 1})}


def test_compressed_index_with_rescoring_matches_brute_force(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dedup, "EXACT_MAX_ITEMS", 100)  # the IVF + SQ8 path on a small set
    x = planted(np.random.default_rng(2), 1500, 100, dim=64)
    searcher = VectorSearcher(x, nprobe=64)
    assert searcher.approximate
    groups = find_groups(searcher, DedupConfig(threshold=0.95))
    assert as_sets(groups) == brute_components(x, 0.95)


@pytest.mark.parametrize("n", [0, 1])
def test_empty_and_single_image(n: int) -> None:
    x = unit(np.random.default_rng(0).standard_normal((n, 8))).astype(np.float32)
    groups = find_groups(VectorSearcher(x), DedupConfig(threshold=0.5))
    assert groups.count == 0 and len(groups.rows) == 0 and groups.images == n


def test_keep_choices() -> None:
    groups = Groups(
        rows=np.array([0, 3, 5, 1, 2]),
        group=np.array([1, 1, 1, 2, 2]),
        score=np.ones(5, dtype=np.float32),
        images=6,
        pairs=4,
    )
    sizes = np.array([10, 30, 30, 5, 5])
    mtimes = np.array([1, 2, 9, 7, 3])
    kept = lambda keep: groups.rows[~removable(groups, sizes, mtimes, keep)].tolist()  # noqa: E731
    assert kept("first") == [0, 1]
    assert kept("largest") == [3, 1]  # a tie (3 and 5) goes to the earlier item
    assert kept("newest") == [5, 1]


def reference_sets(n: int, pairs: list[tuple[int, int]]) -> list[set[int]]:
    """Disjoint sets by merging Python sets pair by pair (no union-find)."""
    sets = [{i} for i in range(n)]
    for a, b in pairs:
        sa = next(s for s in sets if a in s)
        sb = next(s for s in sets if b in s)
        if sa is not sb:
            sets.remove(sb)
            sa |= sb
    return sets


def test_union_find_merges_several_groups_in_one_call() -> None:
    """Guards against a union that makes one pass instead of looping: one call whose pairs join
    four groups through one item (0-1, 2-3, 4-5, 6-7, then 1-7, 3-7, 5-7) must leave one set,
    rooted at its smallest member; a single pass of minimum.at keeps one of three links."""
    joined = grouping.UnionFind(9)
    joined.union(np.array([0, 2, 4, 6]), np.array([1, 3, 5, 7]))
    assert joined.roots().tolist() == [0, 0, 2, 2, 4, 4, 6, 6, 8]
    joined.union(np.array([1, 3, 5]), np.array([7, 7, 7]))
    assert joined.roots().tolist() == [0] * 8 + [8]
    assert joined.find(np.arange(9)).tolist() == [0] * 8 + [8]


@pytest.mark.parametrize("calls", [1, 3])
def test_union_find_matches_merged_sets(calls: int) -> None:
    """Guards against a union that makes one pass instead of looping (or a find that stops
    short): random pairs over 60 items, fed in one call or three, give the sets that merging
    Python sets gives, each rooted at its smallest member."""
    rng = np.random.default_rng(calls)
    a, b = rng.integers(0, 60, size=(2, 45))
    joined = grouping.UnionFind(60)
    for part in np.array_split(np.arange(45), calls):
        joined.union(a[part], b[part])
    roots = joined.roots()
    for s in reference_sets(60, list(zip(a.tolist(), b.tolist(), strict=True))):
        assert set(roots[sorted(s)].tolist()) == {min(s)}


def test_one_item_joins_several_groups() -> None:
    """Guards against a union that makes one pass instead of looping, through find_groups: the
    last item (along z) is within 20 degrees of three earlier ones that are 35 degrees and more
    apart, so the pairs of one batch, (0,3) (1,3) (2,3), must join four items into one group."""
    spokes = np.radians([0.0, 120.0, 240.0])
    tilt = np.radians(20.0)
    x = np.stack(
        [np.sin(tilt) * np.cos(spokes), np.sin(tilt) * np.sin(spokes), np.full(3, np.cos(tilt))],
        axis=1,
    )
    x = np.concatenate([x, [[0.0, 0.0, 1.0]]]).astype(np.float32)
    assert (x @ x.T)[:3, :3].max(initial=0, where=~np.eye(3, dtype=bool)) < 0.9
    groups = find_groups(VectorSearcher(x), DedupConfig(threshold=0.9))
    assert as_sets(groups) == {frozenset({0, 1, 2, 3})} == brute_components(x, 0.9)
    assert groups.pairs == 6  # each of the three pairs found from both of its ends


def test_a_score_exactly_at_the_threshold_joins() -> None:
    """Guards against joining at `>` instead of `>=` the threshold: cosines exact in float32
    (0.5 between items 0 and 1, 0.6 between 0 and 2, 0 between 1 and 2), each threshold equal
    to one of them."""
    x = np.array([[1.0, 0.0, 0.0], [0.5, 0.75**0.5, 0.0], [0.6, 0.0, 0.8]], dtype=np.float32)
    scores = x @ x.T
    assert scores[0, 1] == 0.5 and scores[0, 2] == np.float32(0.6)
    at_half = find_groups(VectorSearcher(x), DedupConfig(threshold=0.5))
    assert as_sets(at_half) == {frozenset({0, 1, 2})}
    at_six = find_groups(VectorSearcher(x), DedupConfig(threshold=float(scores[0, 2])))
    assert as_sets(at_six) == {frozenset({0, 2})}
    strict = find_groups(VectorSearcher(x), DedupConfig(threshold=0.5, strict=True))
    assert as_sets(strict) == {frozenset({0, 1, 2})}
    above = find_groups(
        VectorSearcher(x), DedupConfig(threshold=float(np.nextafter(scores[0, 2], 1)))
    )
    assert above.count == 0


def small_bundle(root: Path, x: np.ndarray, factory: str, rescore: int | None = None) -> Path:
    """A bundle of `x` (ids 100, 101, ...) built by `pactl index VECTORS` with `factory` (and
    `rescore`: 0 keeps no float copy beside lossy codes)."""
    from test_ondisk import write_vectors_folder

    from pactl.config import IndexConfig
    from pactl.console import QUIET
    from pactl.verbs.index import index_vectors

    write_vectors_folder(root / "v", x, np.arange(len(x)) + 100)
    index_vectors(root / "v", root / "b", IndexConfig(factory=factory, rescore=rescore), QUIET)
    return root / "b"


@pytest.mark.parametrize("factory", ["Flat", "IVF4,Flat"])
def test_a_bundles_own_index_groups_its_live_items(tmp_path: Path, factory: str) -> None:
    """BundleSearcher: a bundle's live items in table order, searched by the bundle's own index
    (exact codes: no margin), grouped as brute force groups their vectors. Items deleted and
    compacted away leave ids that are not 0..n-1 (an IVF read back by id needs a hash table
    then); an item deleted since is in no group and never comes back as a candidate."""
    from pactl.index import compact_bundle, delete_items, load_bundle

    x = planted(np.random.default_rng(3), 60, 12)
    bundle = small_bundle(tmp_path, x, factory)
    delete_items(bundle, [100 + 5, 100 + 17])
    compact_bundle(bundle)
    delete_items(bundle, [100 + 23])
    searcher = dedup.BundleSearcher(load_bundle(bundle))
    live = np.setdiff1d(np.arange(len(x)), [5, 17, 23])
    assert searcher.n == len(live) and not searcher.approximate and searcher.margin == 0.0
    assert searcher.ids.tolist() == (live + 100).tolist()
    np.testing.assert_allclose(searcher.vectors(np.array([30, 0])), x[live[[30, 0]]], atol=1e-6)
    if factory != "Flat":
        faiss.extract_index_ivf(searcher.index).nprobe = 4  # every list: exact
    groups = find_groups(searcher, DedupConfig(threshold=0.8, batch_size=13))
    assert as_sets(groups) == brute_components(x[live], 0.8)
    _, rows = searcher.candidates(x[[23]], 0.99)  # the deleted item's own vector
    assert 23 not in live[rows[rows >= 0]].tolist()


def test_a_bundle_of_compressed_codes_is_approximate(tmp_path: Path) -> None:
    """Codes that are not the vectors (SQ8, no float copy kept): scores are approximate, so
    candidates are searched CODE_MARGIN below the threshold and rescored; groups of near copies
    still match brute force on the vectors read back."""
    from pactl.index import load_bundle

    x = planted(np.random.default_rng(4), 80, 15, dim=32)
    searcher = dedup.BundleSearcher(load_bundle(small_bundle(tmp_path, x, "SQ8", rescore=0)))
    assert searcher.approximate and searcher.margin == dedup.CODE_MARGIN
    groups = find_groups(searcher, DedupConfig(threshold=0.9))
    read = searcher.vectors(np.arange(searcher.n))
    assert as_sets(groups) == brute_components(read, 0.9) == brute_components(x, 0.9)


def test_a_graph_index_is_refused_with_what_to_do(tmp_path: Path) -> None:
    from pactl.errors import PactlError
    from pactl.index import load_bundle

    x = planted(np.random.default_rng(5), 40, 5)
    hnsw = load_bundle(small_bundle(tmp_path / "h", x, "HNSW8"))
    with pytest.raises(PactlError, match="graph index.*its vectors folder"):
        dedup.check_range_search(hnsw.index, "b")
    dedup.check_range_search(load_bundle(small_bundle(tmp_path / "f", x, "Flat")).index, "b")


def test_file_facts_fill_only_what_is_unknown(tmp_path: Path) -> None:
    """Sizes and mtimes recorded as -1 are read from the files; known ones are kept, a file
    that is gone stays -1, and the arrays given are not changed."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"12345")
    b.write_bytes(b"1")
    paths = [str(a), str(b), str(tmp_path / "gone")]
    sizes, mtimes = np.array([-1, 7, -1]), np.array([-1, 9, -1])
    got_sizes, got_mtimes = dedup.file_facts(lambda i: paths[i], sizes, mtimes)
    assert got_sizes.tolist() == [5, 7, -1]
    assert got_mtimes.tolist() == [a.stat().st_mtime_ns, 9, -1]
    assert sizes.tolist() == [-1, 7, -1] and mtimes.tolist() == [-1, 9, -1]


def test_keep_newest_tells_apart_times_a_nanosecond_apart() -> None:
    """Guards against modification times compared as float64, where times in ns about 1.7e18
    within 256 ns of each other tie (and the earlier item was kept, not the newest); and an
    empty set of groups giving anything but an empty mask."""
    groups = Groups(
        rows=np.array([0, 1]), group=np.array([1, 1]), score=np.ones(2), images=2, pairs=2
    )
    t = 1_700_000_000_000_000_000
    mtimes = np.array([t, t + 1])
    assert removable(groups, np.array([5, 5]), mtimes, "newest").tolist() == [True, False]
    assert removable(groups, np.array([5, 6]), mtimes, "largest").tolist() == [True, False]
    empty = Groups(
        rows=np.zeros(0, np.int64),
        group=np.zeros(0, np.int64),
        score=np.zeros(0),
        images=3,
        pairs=0,
    )
    got = removable(empty, np.zeros(0, np.int64), np.zeros(0, np.int64), "first")
    assert got.shape == (0,) and got.dtype == bool


@pytest.mark.parametrize("strict", [False, True])
def test_thresholds_at_the_ends_of_the_cosine_range(strict: bool) -> None:
    """Guards against the threshold's limits moved: -1 (every pair) and 1 (identical vectors
    only) are thresholds, -1.5 and 1.5 are refused; a strict search that finds no pair gives no
    group."""
    from pactl.errors import PactlError

    x = unit(np.random.default_rng(3).standard_normal((5, 4))).astype(np.float32)
    x[4] = x[0]
    every = find_groups(VectorSearcher(x), DedupConfig(threshold=-1.0, strict=strict))
    assert as_sets(every) == {frozenset(range(5))}
    same = find_groups(VectorSearcher(x), DedupConfig(threshold=1.0, strict=strict))
    assert as_sets(same) <= {frozenset({0, 4})}  # float32 rounding may leave the twins apart
    for bad in (-1.5, 1.5):
        with pytest.raises(PactlError, match="--threshold must be a cosine"):
            find_groups(VectorSearcher(x), DedupConfig(threshold=bad, strict=strict))
    none = find_groups(VectorSearcher(x[:4]), DedupConfig(threshold=0.9999, strict=strict))
    assert none.count == 0 and none.pairs == 0


def test_pairs_and_scores_are_counted_over_every_batch() -> None:
    """Guards against the pair count keeping only the last batch's, and member scores left
    unwritten past the first batch: with batches of 3, the pairs found are the brute force's
    (each from both ends) and each member's score is its cosine to its group's first."""
    rng = np.random.default_rng(4)
    x = planted(rng, 40, 6)
    t = 0.9
    groups = find_groups(VectorSearcher(x), DedupConfig(threshold=t, batch_size=3))
    sim = x.astype(np.float64) @ x.T.astype(np.float64)
    np.fill_diagonal(sim, -np.inf)
    assert groups.pairs == int((sim >= t).sum()) and groups.pairs > 6
    first = {int(g): int(r) for g, r in zip(groups.group[::-1], groups.rows[::-1], strict=True)}
    want = [
        sim[first[int(g)], r] if first[int(g)] != r else 1.0
        for g, r in zip(groups.group, groups.rows, strict=True)
    ]
    np.testing.assert_allclose(groups.score, want, atol=1e-6)


class ShiftedSearcher:
    """A Searcher whose index scores every pair `shift` below its cosine, as compressed codes
    may: what the margin below the threshold is for."""

    approximate = True
    margin = 0.1

    def __init__(self, x: np.ndarray, shift: float) -> None:
        self.x, self.n, self.shift = x, len(x), shift

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        return self.x[rows]

    def candidates(self, queries: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray]:
        scores = queries @ self.x.T - self.shift
        hits = [np.flatnonzero(row > radius) for row in scores]
        lims = np.concatenate([[0], np.cumsum([len(h) for h in hits])])
        return lims, np.concatenate(hits)


def test_an_approximate_index_is_searched_below_the_threshold_then_rescored() -> None:
    """Guards against the margin of an approximate searcher ignored: a pair at cosine 0.97,
    which the index scores 0.92, is found at threshold 0.95 (searched from 0.85, rescored from
    the vectors); an unrelated item is not."""
    x = unit(np.array([[1.0, 0.0, 0.0], [0.97, np.sqrt(1 - 0.97**2), 0.0], [0.0, 0.0, 1.0]]))
    groups = find_groups(ShiftedSearcher(x.astype(np.float32), 0.05), DedupConfig(threshold=0.95))
    assert as_sets(groups) == {frozenset({0, 1})}
    np.testing.assert_allclose(groups.score, [1.0, 0.97], atol=1e-6)
