"""pactl.training.samplers: the M-per-class sampler's batches, seeding and refusals."""

from __future__ import annotations

import pickle
from collections import Counter

import numpy as np
import pytest
import torch

from pactl.errors import PactlError
from pactl.training.samplers import MPerClassSampler


def sampler_labels() -> np.ndarray:
    # 10 classes of sizes 2..11 (class 0 has fewer than m=4 images), shuffled order.
    labels = np.concatenate([np.full(c + 2, c) for c in range(10)])
    return np.random.default_rng(0).permutation(labels)


def test_m_per_class_batches() -> None:
    labels = sampler_labels()  # 65 images
    m, batch_size = 4, 12
    sampler = MPerClassSampler(labels, m, batch_size, torch.Generator().manual_seed(0))
    indices = list(sampler)
    assert len(sampler) == len(indices) == (65 // 12) * 12
    seen: Counter[int] = Counter()
    for start in range(0, len(indices), batch_size):
        chunk = indices[start : start + batch_size]
        per_class = Counter(int(labels[i]) for i in chunk)
        assert len(per_class) == batch_size // m
        assert set(per_class.values()) == {m}
        for c in per_class:
            members = [i for i in chunk if labels[i] == c]
            if (labels == c).sum() >= m:
                assert len(set(members)) == m  # no repeats when the class is big enough
        seen.update(per_class)

    long = MPerClassSampler(labels, m, batch_size, np.random.default_rng(0), length=1200)
    assert len(long) == 1200
    counts = Counter(int(labels[i]) for i in long)
    assert set(counts) == set(range(10))
    assert min(counts.values()) >= 0.6 * max(counts.values())  # classes seen about equally
    small = [i for i in long if labels[i] == 0]
    assert set(small) == set(np.flatnonzero(labels == 0).tolist())  # with replacement


def test_m_per_class_reproducible() -> None:
    labels = sampler_labels()

    def order(seed: int, epoch: int) -> list[int]:
        s = MPerClassSampler(labels, 4, 12, torch.Generator().manual_seed(seed))
        s.set_epoch(epoch)
        return list(s)

    assert order(0, 0) == order(0, 0)
    assert order(0, 1) == order(0, 1)
    assert order(0, 0) != order(0, 1)
    assert order(0, 0) != order(1, 0)

    s = MPerClassSampler(labels, 4, 12, np.random.default_rng(5))
    first, second = list(s), list(s)  # no set_epoch: each pass moves on
    assert first != second
    s.set_epoch(0)
    assert list(s) == first
    assert pickle.loads(pickle.dumps(s)).seed == s.seed


def test_m_per_class_refuses_bad_shapes() -> None:
    labels = sampler_labels()
    g = np.random.default_rng(0)
    with pytest.raises(ValueError, match="multiple"):
        MPerClassSampler(labels, 4, 10, g)
    with pytest.raises(PactlError, match="only 10"):
        MPerClassSampler(labels, 2, 24, g)  # needs 12 classes
