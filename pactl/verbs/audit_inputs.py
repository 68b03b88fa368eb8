"""What `pactl audit` reads: labelled items, their vectors, their nearest neighbours, and the
proxies of the network that made the vectors.

A run: its data (or --source DATA) embedded by the run's network, checkpoint.pt's (the last
epoch's network with the proxies trained beside it) or, without one, best.pt's; a run trained
with --label-noise is audited with the labels it trained on (noise.csv applied), and the rows
that noise changed are marked, so that the audit can be scored against them. A bundle: its
vectors and the labels of its items (or, with --source, those of a manifest, matched by path),
searched through its own FAISS index.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pactl.audit import doubt
from pactl.console import Reporter, counted
from pactl.errors import PactlError, UsageError
from pactl.index.exact import cosine_index

# (rows (B,)) -> (neighbours (B, k) rows, -1 for none; their cosines (B, k)), self left out
Neighbours = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]
NO_PROXIES = (
    "{what} has no proxies (a bundle, a best.pt export, or a loss without them, such as "
    "multi_similarity or contrastive): use --centres means"
)


@dataclass
class Labelled:
    """Row i: `paths[i]` (absolute), label `names[codes[i]]`, in `splits[i]` ('' unknown)."""

    paths: Sequence[str]
    codes: np.ndarray  # (N,) int64
    names: list[str]
    splits: Sequence[str]
    vectors: Callable[[np.ndarray], np.ndarray]  # rows -> (B, D) float32 unit rows
    neighbours: Neighbours
    proxies: doubt.ClassCentres | None  # the network's proxies, by label code
    planted: np.ndarray | None = None  # (N,) bool: labels a run's --label-noise changed
    what: str = ""  # the run or bundle, for messages

    def __len__(self) -> int:
        return len(self.codes)


def encode(names: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """Label names -> (codes (N,), the names by code, sorted)."""
    order, codes = np.unique(np.asarray(list(names), dtype=object), return_inverse=True)
    return codes.astype(np.int64), [str(n) for n in order]


def proxies_of(payload: dict[str, Any], names: list[str]) -> doubt.ClassCentres | None:
    """A full checkpoint's proxies as centres of the label codes its classes have here (None:
    an export, or a loss without proxies)."""
    state = payload.get("proxies") or {}
    proxies, classes = state.get("proxies"), payload.get("classes")
    if proxies is None or not classes or len(classes) != len(proxies):
        return None
    position = {name: code for code, name in enumerate(names)}
    known = [(i, position[c]) for i, c in enumerate(classes) if c in position]
    if not known:
        return None
    rows, codes = (np.array(x) for x in zip(*known, strict=True))
    return doubt.proxy_centres(proxies.float().numpy()[rows], codes)


def row_neighbours(vectors: np.ndarray) -> Neighbours:
    """k nearest by cosine among `vectors` (in memory): exact up to
    pactl.index.exact.EXACT_ITEMS, else an IVF."""
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    nearest = cosine_index(x)

    def search(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        sims, found = nearest(x[rows], min(k + 1, len(x)))
        return without_self(rows, found, sims, k)

    return search


def without_self(
    rows: np.ndarray, found: np.ndarray, sims: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's hits less the row itself (by id, wherever it ranks), cut to k."""
    keep = (found != rows[:, None]) & (found >= 0)
    order = np.argsort(~keep, axis=1, kind="stable")[:, :k]  # kept hits first, rank kept
    found = np.where(np.take_along_axis(keep, order, 1), np.take_along_axis(found, order, 1), -1)
    sims = np.where(found >= 0, np.take_along_axis(sims, order, 1), -np.inf)
    if found.shape[1] < k:
        pad = k - found.shape[1]
        found = np.pad(found, ((0, 0), (0, pad)), constant_values=-1)
        sims = np.pad(sims, ((0, 0), (0, pad)), constant_values=-np.inf)
    return found, sims.astype(np.float32)


def read_run(
    run: Path, source: str | None, device: str, reporter: Reporter, proxies: bool = False
) -> Labelled:
    """A run's data (or `source`) embedded by its network, with its labels and proxies (which
    `proxies` requires: refused before any image is read where the run has none)."""
    from pactl.checkpoint import load_model
    from pactl.datasets import load_source
    from pactl.embed import embed_files
    from pactl.runs import resumed_configs
    from pactl.runtime import resolve_device

    trained_on, _, cfg = resumed_configs(run)
    path = run / "checkpoint.pt" if (run / "checkpoint.pt").is_file() else run / "best.pt"
    if not path.is_file():
        raise PactlError(f"{run} has no checkpoint.pt or best.pt: let it train an epoch first")
    manifest = load_source(source or trained_on, reporter, follow_links=cfg.follow_links)
    model, model_cfg, payload = load_model(path)
    if proxies and (payload.get("proxies") or {}).get("proxies") is None:
        raise UsageError(NO_PROXIES.format(what=run))
    reporter.log(f"embedding {counted(len(manifest), 'image')} of {manifest.source} with {path}")
    done = embed_files(model, manifest.files(), model_cfg, resolve_device(device), reporter)
    if done.failed:
        reporter.warn(f"{counted(len(done.failed), 'unreadable image')} left out of the audit")
    rows = done.rows
    names = [manifest.class_names[i] for i in rows.tolist()]
    planted = None
    if source is None or source == trained_on:
        names, planted = trained_labels(run, [manifest.paths[i] for i in rows.tolist()], names)
    codes, by_code = encode(names)
    vectors = done.vectors
    return Labelled(
        paths=[os.path.abspath(manifest.root / manifest.paths[i]) for i in rows.tolist()],
        codes=codes,
        names=by_code,
        splits=[manifest.splits[i] for i in rows.tolist()],
        vectors=lambda r: vectors[r],
        neighbours=row_neighbours(vectors),
        proxies=proxies_of(payload, by_code),
        planted=planted,
        what=str(run),
    )


def trained_labels(
    run: Path, paths: list[str], names: list[str]
) -> tuple[list[str], np.ndarray | None]:
    """The labels the run trained on: its noise.csv applied (None: the data's own labels)."""
    from pactl.training.noise import read_noise

    noisy = read_noise(run)
    if not noisy:
        return names, None
    changed = np.array([p in noisy for p in paths])
    return [noisy.get(p, n) for p, n in zip(paths, names, strict=True)], changed


def read_bundle(folder: Path, source: str | None, reporter: Reporter) -> Labelled:
    """A bundle's live items, vectors and index; labels from its items or from `source`."""
    from pactl.index import load_bundle
    from pactl.index.dedup import BundleSearcher

    bundle = load_bundle(folder, mmap=True)
    reader = BundleSearcher(bundle)  # its positions: the live items in table order
    live = np.flatnonzero(~bundle.is_deleted(bundle.items.ids))
    items = bundle.items.take(live)
    if source is not None:
        names, splits, rows = labels_from(source, items.paths, reporter)
        codes, by_code = encode(names)
    else:
        if not any(items.labels.names.tolist()):
            raise PactlError(
                f"{folder} holds no labels: give --source DATA, the manifest or folder whose "
                "labels its images carry"
            )
        (codes, by_code), splits = label_codes(items.labels), [""] * len(items)
        rows = np.arange(len(items))
    audited = np.full(len(bundle.items), -1, dtype=np.int64)  # table position -> audited row
    audited[live[rows]] = np.arange(len(rows))

    def neighbours(at: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The index's k + 1 nearest (its tuned search, no widening: a row the index answers
        short keeps fewer), deleted and unaudited items and the row itself left out."""
        depth = min(k + 1, int(bundle.index.ntotal))
        sims, found = bundle.searcher(depth).search(reader.vectors(rows[at]), depth)
        found = np.where(bundle.is_deleted(found), -1, found)
        hit = np.where(found >= 0, audited[np.maximum(bundle.items.positions(found), 0)], -1)
        return without_self(at, hit, sims, k)

    return Labelled(
        paths=items.paths if source is None else [items.paths[i] for i in rows.tolist()],
        codes=codes,
        names=by_code,
        splits=splits,
        vectors=lambda r: reader.vectors(rows[r]),
        neighbours=neighbours,
        proxies=None,
        what=str(folder),
    )


def label_codes(labels: Any) -> tuple[np.ndarray, list[str]]:
    """A bundle's Labels (codes into its own table of names) -> (codes, names sorted)."""
    codes, by_code = encode(labels.names.tolist())
    return codes[np.asarray(labels.codes)], by_code


def labels_from(
    source: str, paths: Sequence[str], reporter: Reporter
) -> tuple[list[str], list[str], np.ndarray]:
    """(names, splits, rows): the labels and splits `source` gives the items at `paths`, and the
    item rows it covers (items it does not name are left out)."""
    from pactl.datasets import load_source

    manifest = load_source(source, reporter)
    given = {os.path.abspath(manifest.root / p): i for i, p in enumerate(manifest.paths)}
    rows = np.array([r for r, p in enumerate(paths) if p in given], dtype=np.int64)
    if not len(rows):
        raise PactlError(
            f"{source} names none of the bundle's images: give the manifest they are from"
        )
    if len(rows) < len(paths):
        reporter.log(
            f"{counted(len(paths) - len(rows), 'item')} of the bundle not in {source}: left out"
        )
    at = [given[paths[r]] for r in rows.tolist()]
    return [manifest.class_names[i] for i in at], [manifest.splits[i] for i in at], rows
