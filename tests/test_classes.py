"""The class view of an audit (pactl.audit.classes): the imbalance by brute force, the counts,
label quality, suspects and confusable pairs by hand."""

from __future__ import annotations

import numpy as np
import pytest

from pactl.audit.classes import balance, class_view, gini, rows


def test_gini_and_entropy_of_class_counts_by_brute_force() -> None:
    rng = np.random.default_rng(0)
    for counts in ([5, 5, 5], [1, 9], [3, 0, 7, 12, 1], rng.integers(1, 50, 9).tolist()):
        x = np.array(counts, dtype=float)
        pairs = np.abs(x[:, None] - x[None, :]).sum()  # every ordered pair, float64
        assert gini(x) == pytest.approx(pairs / (2 * len(x) ** 2 * x.mean()), abs=1e-12)
        p = x[x > 0] / x.sum()
        assert balance(x) == pytest.approx(-(p * np.log(p)).sum() / np.log(len(p)), abs=1e-12)
    assert gini(np.array([4, 4])) == 0.0 and balance(np.array([4, 4])) == pytest.approx(1.0)


def test_class_view_counts_quality_suspects_and_confused_pairs_by_hand() -> None:
    codes = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2])
    doubt = np.array([0.1, 0.9, 0.8, 0.2, 0.6, 0.0, 0.7, 0.3, 0.4])
    suggested = np.array([1, 1, 2, 1, 0, 2, 0, 0, 1])
    view = class_view(codes, ["a", "b", "c"], doubt, suggested)
    assert view.counts.tolist() == [4, 2, 3]
    assert view.quality.tolist() == pytest.approx([0.5, 0.7, 0.5333333333333])
    assert view.suspected.tolist() == [2, 1, 1]  # doubt >= 0.5 with another label suggested
    # a->b (row 1), a->c (2), b->a (4), c->a (6): a<->b 2 (1 each way), a<->c 2 (1 each way)
    assert view.pairs == [(0, 1, 1, 1), (0, 2, 1, 1)]
    assert view.ratio == 2.0
    table = rows(view)
    assert [r[2] for r in table if r[0] == "class"] == ["a", "c", "b"]  # worst quality first
    assert table[-1][:5] == ["pair", 2, "a", "c", 2]
