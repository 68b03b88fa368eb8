"""Recall@K, MAP@R and R-precision of codes on a labelled set: the neighbour tables of the codes
(Hamming distance, ties broken by id, so results repeat) and of the same codes' candidates
rescored by exact cosine, read by pactl.metrics' table functions.

The gallery is a BinaryIndex whose ids are the gallery's rows (its float vectors the gallery's
own); without a separate query set, every gallery item queries the others, itself excluded by id.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pactl import metrics
from pactl.index.binary.search import BinaryIndex, rescore
from pactl.index.search import exclude_by_id


def code_metrics(
    binary: BinaryIndex,
    queries: np.ndarray,
    query_labels: np.ndarray,
    gallery_labels: np.ndarray,
    ks: Sequence[int],
    symmetric: bool,
) -> dict[str, float]:
    """codes_recall@k for each k, codes_map@r, codes_r_precision (Hamming order), and the
    same with a rescored_ prefix (each query's k x binary.rescore nearest codes ordered by
    cosine), for `queries` against the gallery `binary` holds. `symmetric`: the queries are
    the gallery, query i is gallery item i and leaves itself out."""
    # labels as codes (-1: an empty slot of a table, no label)
    _, codes_of = np.unique(np.concatenate([query_labels, gallery_labels]), return_inverse=True)
    q_labels, g_labels = codes_of[: len(query_labels)], codes_of[len(query_labels) :]
    classes, counts = np.unique(g_labels, return_counts=True)
    at = np.minimum(np.searchsorted(classes, q_labels), len(classes) - 1)
    r = np.where(classes[at] == q_labels, counts[at], 0) - int(symmetric)
    valid = r > 0  # the others have nothing to find and count in no average
    if not valid.any():
        raise ValueError("no query has another item of its class to retrieve")
    available = len(g_labels) - int(symmetric)
    width = min(max(max(ks), int(r.max())), available)
    own = np.arange(len(queries)) if symmetric else np.full(len(queries), -1)
    codes = binary.rotation.codes(queries)
    _, found = binary.candidates(codes, width + int(symmetric))
    hamming = exclude_by_id(np.zeros(found.shape, np.float32), found, own, width)[1]
    depth = min(width * max(1, binary.rescore), available) + int(symmetric)
    _, candidates = binary.candidates(codes, depth)
    candidates = exclude_by_id(np.zeros(candidates.shape, np.float32), candidates, own, depth)[1]
    rescored = rescore(binary.floats, binary.positions, queries, candidates, width)[1]
    out: dict[str, float] = {}
    for name, table in (("codes", hamming), ("rescored", rescored)):
        labels = np.where(table[valid] >= 0, g_labels[table[valid]], -1)  # (Q, width)
        ks_in = [min(k, width) for k in ks]
        recalls = metrics.recall_at_k(labels, q_labels[valid], ks_in)
        out |= {f"{name}_recall@{k}": recalls[min(k, width)] for k in ks}
        out[f"{name}_map@r"] = metrics.map_at_r(labels, q_labels[valid], r[valid])
        out[f"{name}_r_precision"] = metrics.r_precision(labels, q_labels[valid], r[valid])
    return out
