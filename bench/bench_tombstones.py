"""Searching past deleted items: pactl's over-fetch against FAISS's own ID selector.

`pactl.index.search.search` asks the index for k + min(deleted, k) hits (more in a second round for
the rows that came back short) and drops the tombstones; FAISS can instead skip them inside the
scan with `SearchParameters(sel=IDSelectorNot(IDSelectorBatch(deleted)))`. Both are run on the
same bundle, per index kind and share of deleted items; the ids must agree (exact kinds) and the
ratio is over-fetch time / selector time (below 1: over-fetch is faster).

    python -m bench tombstones                       # 100,000 x 128, 2,000 queries
    python -m bench tombstones --n 20000 --queries 500

Synthetic clustered unit vectors; nothing is downloaded. Table to stdout.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from bench import harness
from bench.data import around
from pactl.config import IndexConfig
from pactl.console import QUIET
from pactl.index import build_index, delete_items, load_bundle, save_bundle
from pactl.index.search import search

KINDS = {"Flat": "", "IVF256,Flat": "nprobe=16", "HNSW32,Flat": "efSearch=64"}
SHARES = (0.01, 0.1, 0.5)


def with_selector(bundle: object, queries: np.ndarray, k: int, params: str) -> np.ndarray:
    """FAISS's own skipping: the selector goes down through the id map into the scan."""
    index = bundle.index  # type: ignore[attr-defined]
    dead = bundle.deleted  # type: ignore[attr-defined]
    selector = faiss.IDSelectorNot(faiss.IDSelectorBatch(dead))
    if params.startswith("nprobe"):
        sp: object = faiss.SearchParametersIVF(sel=selector, nprobe=int(params.split("=")[1]))
    elif params.startswith("efSearch"):
        sp = faiss.SearchParametersHNSW(sel=selector, efSearch=int(params.split("=")[1]))
    else:
        sp = faiss.SearchParameters(sel=selector)
    return index.search(queries, k, params=sp)[1]


def timed(run: Callable[[], Any], repeat: int = 3) -> tuple[float, Any]:
    """Fastest seconds of `repeat` runs, and the last result (harness.timed)."""
    timing, out = harness.timed(run, repeats=repeat, warmup=0)
    return timing.fastest, out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--queries", type=int, default=2_000)
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args(argv)
    faiss.omp_set_num_threads(1)  # one core each: a fair ratio on a shared machine
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((256, args.dim))
    base = around(centres, args.n, rng, scale=0.1)
    queries = around(centres, args.queries, rng, scale=0.1)
    print("kind          deleted  over-fetch s  selector s  ratio  same ids")
    with tempfile.TemporaryDirectory() as tmp:
        for factory, params in KINDS.items():
            index, record = build_index(base, IndexConfig(factory=factory), QUIET)
            record["search_params"] = params
            for share in SHARES:
                folder = Path(tmp) / f"{factory}-{share}".replace(",", "_")
                save_bundle(folder, index, [(i, f"/{i}", "") for i in range(args.n)], record)
                dead = rng.choice(args.n, size=int(args.n * share), replace=False)
                delete_items(folder, ids=dead.tolist())
                bundle = load_bundle(folder)
                ours, ids = timed(lambda b=bundle: search(b, queries, args.k)[1])
                theirs, sel_ids = timed(
                    lambda b=bundle, p=params: with_selector(b, queries, args.k, p)
                )
                same = float(np.mean(np.asarray(ids) == np.asarray(sel_ids)))
                print(
                    f"{factory:13} {share:7.0%}  {ours:12.3f}  {theirs:10.3f}  "
                    f"{ours / theirs:5.2f}  {same:8.1%}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
