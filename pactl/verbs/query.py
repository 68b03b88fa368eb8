"""`pactl query`, the service and the API's Index.query: a bundle and its network opened once
(QueryModel), query images embedded and searched in bounded chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pactl.config import ModelConfig
from pactl.console import Reporter
from pactl.errors import PactlError
from pactl.results import QueryChunk
from pactl.verbs.lineage import bundle_checkpoint, calibration_of, no_network, records_network

if TYPE_CHECKING:
    import torch
    from torch import nn

    from pactl.checkpoint import ModelSource
    from pactl.index import Bundle


def find_bundle(runs: Path, name_one: str = "pass --index") -> Path:
    """The most recently written bundle under `runs/` (or `./index`)."""
    metas = [*runs.glob("*/index/meta.json"), *Path("index").glob("meta.json")]
    if not metas:
        raise PactlError(
            f"no index bundle under {runs}/ or ./index: build one with `pactl index` or {name_one}"
        )
    return max(metas, key=lambda p: p.stat().st_mtime).parent


@dataclass
class QueryModel:
    """A bundle and the network that made it, opened once for many queries."""

    bundle: Bundle
    model: nn.Module  # the bundle's network, on `device`
    config: ModelConfig  # its preprocessing and sizes
    device: torch.device


# What `pactl query` can do for a bundle that records no network.
QUERY_INSTEAD = (
    "give --checkpoint the network that made its vectors, or give query vectors of that "
    "network with `pactl query --vectors FILE.npy`"
)

# What Index.query says of a bundle that records no network.
OPEN_INSTEAD = (
    "open it with the checkpoint or backbone that made its vectors "
    "(pactl.open_index(path, checkpoint=...)), or pass vectors of that network to Index.search"
)


def open_query_model(
    bundle_dir: Path,
    checkpoint: ModelSource | None,
    device_name: str,
    faiss_device: str = "auto",
    who: str = "`pactl query`",
    instead: str = QUERY_INSTEAD,
) -> QueryModel:
    """Load the bundle (searching where `faiss_device` says) and its model once; refuse a
    model other than the bundle's. A bundle that records no network (another tool's vectors)
    takes `checkpoint` (a file or a backbone's config) on the caller's word, of its dimension;
    without one, `who` says in one line that it cannot embed images, and `instead` what can."""
    from pactl.index import load_bundle_or_set

    bundle = load_bundle_or_set(bundle_dir, faiss_device=faiss_device)
    return with_network(bundle, bundle_dir, checkpoint, device_name, who, instead)


def with_network(
    bundle: Bundle,
    bundle_dir: Path,
    checkpoint: ModelSource | None,
    device_name: str,
    who: str = "`pactl query`",
    instead: str = QUERY_INSTEAD,
) -> QueryModel:
    """A loaded bundle with its network (open_query_model)."""
    from pactl.checkpoint import network_of, open_network
    from pactl.runtime import resolve_device

    if records_network(bundle.meta):
        model, network = network_of(
            bundle.meta, checkpoint or bundle_checkpoint(bundle.meta, bundle_dir)
        )
    elif checkpoint is None:
        raise no_network(bundle_dir, who, instead)
    else:
        model, network = open_network(checkpoint)
        _check_dimension(model, network.config, int(bundle.index.d), bundle_dir)
    device = resolve_device(device_name)
    model.to(device)
    return QueryModel(bundle, model, network.config, device)


def _check_dimension(model: nn.Module, config: ModelConfig, dimension: int, where: Path) -> None:
    """A network given for a bundle that recorded none makes vectors of its dimension (one
    blank image through it, on the CPU, tells)."""
    import torch

    with torch.inference_mode():
        made = int(model(torch.zeros(1, 3, config.image_size, config.image_size)).shape[1])
    if made != dimension:
        raise PactlError(
            f"the network given makes {made}-dimensional vectors, {where} holds {dimension}: "
            "give the network that made its vectors"
        )


def query_chunks(
    bundle_dir: Path,
    images: Any,
    k: int,
    checkpoint: Path | None,
    exclude_self: bool,
    device_name: str,
    reporter: Reporter,
    chunk: int = 512,
    batch_size: int = 128,
    know_labels: bool = False,
    faiss_device: str = "auto",
    qdrant: tuple[str, str] | None = None,
    same_item: bool = False,
    threshold: float | None = None,
    rescore: int | None = None,
) -> Any:
    """Yield a QueryChunk per `chunk` query images: memory stays bounded for any number.
    `qdrant`: (URL or folder, collection) searched instead of the bundle's index, the queries
    embedded with the bundle's network all the same. With `same_item`, only hits at or above
    the same-item threshold (`threshold`, else the bundle's calibrated one) are kept: a query
    may then have none. `rescore`: a binary bundle's candidates per hit rescored by cosine
    (0: Hamming order), instead of its own."""
    from pactl.index.search import rescored

    opened = open_query_model(bundle_dir, checkpoint, device_name, faiss_device)
    rescored(opened.bundle.index, rescore)  # a float bundle has nothing to rescore: said now
    least = _least(opened.bundle, bundle_dir, same_item, threshold, reporter)
    find = None
    if qdrant is not None:
        from pactl.interop.qdrant import QdrantSearch

        find = QdrantSearch(*qdrant, int(opened.bundle.index.d), k)
        reporter.log(find.describe())
    try:
        yield from answer_chunks(
            opened,
            images,
            k,
            exclude_self,
            reporter,
            chunk,
            batch_size,
            know_labels,
            find,
            least,
            rescore,
        )
    finally:
        if find is not None:
            find.close()


def _least(
    bundle: Bundle, bundle_dir: Path, same_item: bool, threshold: float | None, reporter: Reporter
) -> float | None:
    """The lowest score a hit keeps: with `same_item`, `threshold` or the bundle's calibrated
    same-item threshold (said on stderr); else None, every hit."""
    if not same_item:
        return None
    from pactl.calibrate import same_item_threshold

    least, how = same_item_threshold(calibration_of(bundle.meta), str(bundle_dir), threshold)
    reporter.log(f"same item: {how}")
    return least


def vector_chunks(
    bundle_dir: Path,
    vectors: np.ndarray,
    k: int,
    reporter: Reporter,
    faiss_device: str = "auto",
    same_item: bool = False,
    threshold: float | None = None,
    rescore: int | None = None,
    chunk: int = 512,
) -> Any:
    """query_chunks for query vectors of the bundle's network ((N, dimension) rows, taken as
    Index.search takes them: scaled to length 1, NaN, Inf and zero rows refused) instead of
    images: no network is loaded, so a bundle of another tool's vectors answers too; a query's
    name is its row number, as Index.search names it."""
    from pactl.arguments import unit_queries
    from pactl.index import load_bundle_or_set
    from pactl.index.search import hits, rescored, search

    bundle = load_bundle_or_set(bundle_dir, faiss_device=faiss_device)
    rescored(bundle.index, rescore)
    x = unit_queries(vectors, int(bundle.index.d))  # as Index.search takes them
    if not len(x):
        raise PactlError("no query vectors: the array holds no rows")
    least = _least(bundle, bundle_dir, same_item, threshold, reporter)
    if k > bundle.live_count:
        reporter.log(f"--k {k} is more than the {bundle.live_count} items indexed; showing all")
    for start in range(0, len(x), chunk):
        names = [str(i) for i in range(start, min(start + chunk, len(x)))]
        scores, ids = search(bundle, x[start : start + chunk], k, rescore=rescore)
        found = hits(bundle, names, scores, ids)
        if least is not None:
            found = [[h for h in row if h.score >= least] for row in found]
        yield QueryChunk(names, found, [], [None] * len(names))


def answer_chunks(
    opened: QueryModel,
    images: Any,
    k: int,
    exclude_self: bool,
    reporter: Reporter,
    chunk: int = 512,
    batch_size: int = 128,
    know_labels: bool = False,
    find: Any = None,
    least: float | None = None,
    rescore: int | None = None,
) -> Any:
    """query_chunks over a bundle and model already open (open_query_model): `pactl query` and
    pactl.api.Index.query embed and search query files by this one loop. `find(names, vectors,
    own ids or None)` gives the hits instead of the bundle's index (a Qdrant collection). Hits
    below `least` (a same-item threshold) are left out; `rescore` as in query_chunks."""
    from itertools import islice

    from pactl.embed import embed_files, fastpath
    from pactl.images import reason_of
    from pactl.index.search import PathIndex, hits, search

    bundle, model, model_cfg, device = opened.bundle, opened.model, opened.config, opened.device
    if k > bundle.live_count:
        reporter.log(f"--k {k} is more than the {bundle.live_count} items indexed; showing all")
    # Queries are found among the indexed items only when that is asked for.
    wanted = exclude_self or know_labels
    lookup = PathIndex(bundle.items, skip=bundle.deleted) if wanted else None
    it = iter(images)
    while batch := list(islice(it, chunk)):
        if len(batch) >= fastpath.PREPARE_MIN_IMAGES:  # many queries: prepare the network, once
            model = fastpath.inference_model(model, model_cfg, device)
        done = embed_files(model, batch, model_cfg, device, reporter, batch_size=batch_size)
        names = [str(batch[i]) for i in done.rows]
        own = lookup.ids(names) if lookup else np.full(len(names), -1, dtype=np.int64)
        if find is None:
            excluded = own if exclude_self else None
            scores, ids = search(bundle, done.vectors, k, excluded, rescore=rescore)
            found = hits(bundle, names, scores, ids)
        else:
            found = find(names, done.vectors, own if exclude_self else None)
        failed = [(str(batch[i]), reason_of(batch[i], why)) for i, why in done.failed]
        labels = [_item_label(bundle, int(i)) for i in own]
        if least is not None:
            found = [[h for h in row if h.score >= least] for row in found]
        yield QueryChunk(names, found, failed, labels)


def _item_label(bundle: Any, item_id: int) -> str | None:
    if item_id < 0:
        return None
    return str(bundle.items.labels[bundle.items.positions(np.array([item_id]))[0]])
