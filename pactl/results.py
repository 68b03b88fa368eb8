"""Query results as plain records, standard library only: a client of `pactl serve`
(pactl.serve.client) reads them without numpy, FAISS or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Hit:
    query: str  # the query's name (its path, or what the caller calls it)
    rank: int  # 1 = most similar
    id: int  # the item's id in the bundle
    path: str
    label: str  # "" when the item has no label
    score: float  # cosine similarity (inner product of unit vectors)


@dataclass
class QueryChunk:
    names: list[str]  # the queries of this chunk that were embedded
    hits: list[list[Any]]  # per query, its pactl.index.search.Hit rows
    failed: list[tuple[str, str]]  # (query, reason without the path) of unreadable images
    labels: list[str | None]  # a query's label when it is itself an indexed item
