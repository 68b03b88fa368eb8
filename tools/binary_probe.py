"""What a built binary bundle's code index gives at other settings, on fresh queries with known
exact neighbours: Recall@10 of the rescored answers at several nprobe (an IVF of codes), and of
exact Hamming search (BFlat over the same codes, taken out of the IVF's lists) at several
rescoring depths, with their times. Made for the scale run of bench_binary.py, kept with --keep:

    python -m tools.binary_probe /tmp/bbscale/bench-binary-scale --queries 200

WORK holds binary/ (the bundle), queries.npy and truth.npy (exact top-10 ids), as bench_binary's
scale run leaves them. Results (markdown) go to stdout.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import faiss
import numpy as np

from bench.bench_index import K, recall_at_10
from pactl.index import load_bundle
from pactl.index.search import search


def flat_codes(ivf: faiss.IndexBinaryIVF) -> faiss.IndexBinaryFlat:
    """An exact index of the IVF's codes, row i = id i."""
    codes = np.empty((ivf.ntotal, ivf.code_size), dtype=np.uint8)
    lists = ivf.invlists
    for number in range(ivf.nlist):
        m = lists.list_size(number)
        if m:
            ids = faiss.rev_swig_ptr(lists.get_ids(number), m).copy()
            got = faiss.rev_swig_ptr(lists.get_codes(number), m * ivf.code_size)
            codes[ids] = got.copy().reshape(m, ivf.code_size)
    flat = faiss.IndexBinaryFlat(ivf.d)
    flat.add(codes)
    return flat


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    bundle = load_bundle(args.work / "binary")
    queries = np.load(args.work / "queries.npy")[: args.queries]
    truth = np.load(args.work / "truth.npy")[: args.queries]
    ivf = faiss.downcast_IndexBinary(bundle.index.codes)
    if not isinstance(ivf, faiss.IndexBinaryIVF):
        raise SystemExit("the bundle's code index is no IVF")
    graph = faiss.downcast_IndexBinary(ivf.quantizer)
    depth = bundle.index.rescore
    print(f"{ivf.ntotal:,} codes, {ivf.nlist:,} lists, rescoring {depth} candidates a hit\n")
    print("| code search | Recall@10 rescored | ms/query batched (search + rescoring) |")
    print("| --- | ---: | ---: |")
    for nprobe in (4, 16, 64, 256, 1024, 4096):
        ivf.nprobe = nprobe
        graph.hnsw.efSearch = max(64, 2 * nprobe)  # as pactl sets it
        started = time.perf_counter()
        found = search(bundle, queries, K, rescore=depth)[1]
        ms = (time.perf_counter() - started) * 1e3 / len(queries)
        print(f"| IVF nprobe={nprobe} | {recall_at_10(found[:, :K], truth):.3f} | {ms:.1f} |")
    flat = flat_codes(ivf)
    codes = bundle.index.rotation.codes(queries)
    for rescore in (30, depth, 64):
        started = time.perf_counter()
        candidates = flat.search(codes, K * rescore)[1]
        searched = time.perf_counter() - started
        answers = []
        for query, rows in zip(queries, candidates, strict=True):
            rows = np.sort(rows)
            scores = np.asarray(bundle.index.floats[rows]) @ query
            answers.append(rows[np.argsort(-scores)[:K]])
        ms = (time.perf_counter() - started) * 1e3 / len(queries)
        print(
            f"| BFlat, {rescore} candidates a hit | {recall_at_10(np.array(answers), truth):.3f} | "
            f"{ms:.1f} ({searched * 1e3 / len(queries):.1f} + rescoring) |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
