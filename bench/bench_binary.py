"""Binary codes (`pactl index --binary`) against float vectors and FAISS product quantisation at
the same bytes per vector, side by side in one run (issue 38).

Synthetic (the default): bench/bench_index.py's clustered unit vectors (n x dim, seeded) written
as a vectors folder, 1,000 fresh queries, every bundle built by pactl's own path
(pactl.verbs.index.index_vectors, as `pactl index VECTORS`) and queried in a child process
(pactl.index.search over the loaded bundle, as `pactl query` searches), which reports its times
and peak RSS. Rows, at 64, 128, 256 and 512 bits (8, 16, 32, 64 bytes a vector):

  float exact      IndexFlatIP over the vectors (the truth: Recall@K is against it)
  float default    `pactl index VECTORS` (choose_factory; 2,048 bytes a vector at 512-d)
  sign             the vectors' own signs (--rotation none; only at as many bits as dimensions)
  itq              ITQ / PCA-ITQ codes (--rotation itq), in Hamming order (--rescore 0) and
                   rescored at the bundle's measured default
  PQm, IVF-PQm     FAISS product quantisers of m bytes (exhaustive, and IVF with pactl's
                   nlist and HNSW quantiser, nprobe tuned as pactl tunes), raw and rescored by
                   exact cosine at the itq bundle's depth

plus exact Hamming top-10 (IndexBinaryFlat over the 512-bit itq codes) against exact float top-10
(IndexFlatIP), batched and one query at a time, and a plot of Recall@1 against bytes per vector.

Real sets (--sets fonts,fashion): bench/real_sets.py's sets under --root; pactl's CLI trains the
CPU default from EfficientNet-Lite0's ImageNet weights (`pactl train SET --weights LITE0`) and the
same with `--bits 64` (learned codes), embeds each set's test classes, and scores, per bits, the
float vectors, sign and itq codes (Hamming and rescored) and the learned codes: Recall@1 and
MAP@R over the test classes (pactl.metrics, codes by pactl.index.binary.metrics as `pactl eval
--binary` scores them), and Recall@10 against exact float search.

Scale (--scale): n vectors written to --workdir a chunk at a time (bounded memory), the binary
default and the float default built there by `pactl index` (each its own process: its peak RSS),
queried in child processes; the data is deleted at the end unless --keep.

Run from the repository root (heavy: `flock /tmp/pactl-heavy.lock nice -n 5 ...`):
  python -m bench binary                          # 1,000,000 x 512
  python -m bench binary --quick                  # 100,000 x 128, a smoke test
  python -m bench binary --sets fonts,fashion     # the real sets (trains 4 networks)
  python -m bench binary --sets fonts28 --float-run RUN --bits-run RUN   # runs of yours
  python -m bench binary --scale --n 10000000 --workdir /tmp/pactl-scale
Results (markdown) go to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import harness
from bench.bench_index import K, data_parser, fastest, parsed, recall_at_10
from bench.data import CHUNK, Mixture

ROOT = Path(__file__).resolve().parents[1]

BITS = (64, 128, 256, 512)
REPEATS = 3  # timed batched passes; the fastest counts
SINGLE = 50  # queries timed one at a time
FINGERPRINT = "bench" * 12 + "aaaa"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- data on disk


def write_vectors(folder: Path, n: int, dim: int, seed: int, queries: int) -> np.ndarray:
    """`folder` as `pactl embed` writes it (vectors.npy, items.csv, meta.json), made a chunk at a
    time (memory: one chunk, whatever n), and the fresh queries drawn after it, returned."""
    rng = np.random.default_rng(seed)
    mixture = Mixture(n, dim, rng)
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(folder / "vectors.npy", "wb") as f:  # written, not mapped: no pages kept
        header = {"descr": "<f4", "fortran_order": False, "shape": (n, dim)}
        np.lib.format.write_array_header_1_0(f, header)
        for start in range(0, n, CHUNK * 4):
            mixture.draw(min(CHUNK * 4, n - start), rng)[0].tofile(f)
    with open(folder / "items.csv", "w") as f:
        f.write("id,path,label,size,mtime_ns\n")
        for start in range(0, n, 1_000_000):
            rows = range(start, min(n, start + 1_000_000))
            f.write("".join(f"{i},v/{i},,-1,-1\n" for i in rows))
    meta = {
        "format": "pactl.vectors",
        "version": 1,
        "dimension": dim,
        "count": n,
        "metric": "ip",
        "checkpoint": None,
        "fingerprint": FINGERPRINT,
        "model_config": {"backbone": "small", "weights": "none", "embedding_dim": dim},
    }
    (folder / "meta.json").write_text(json.dumps(meta))
    log(f"wrote {n:,} x {dim} vectors in {time.perf_counter() - started:.0f} s")
    return mixture.draw(queries, rng)[0]


def exact_truth(base: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest inner products over all of `base` (memory-mapped), a block at a
    time (pactl.index.build.exact_neighbours; the queries are not in the base)."""
    from pactl.index.exact import exact_neighbours

    own = np.full(len(queries), -1, dtype=np.int64)
    return exact_neighbours([(base, np.arange(len(base)))], queries, own, k)


# ---------------------------------------------------------------------------- building


def build(vectors: Path, out: Path, options: list[str]) -> dict[str, Any]:
    """`pactl index VECTORS --out OUT OPTIONS` in its own process: its meta.json, the build's
    seconds and peak RSS (GiB, harness.run_fresh), the bundle's in-memory index bytes and its
    bytes on disk."""
    command = ["-m", "pactl", "index", str(vectors), "--out", str(out), *options, "--quiet"]
    done = harness.run_fresh(command, check=False)
    if done.returncode != 0:
        raise SystemExit(f"pactl index {' '.join(options)} failed ({done.returncode})")
    meta = json.loads((out / "meta.json").read_text())
    disk = sum(p.stat().st_size for p in out.iterdir() if p.is_file() and p.name != "meta.json")
    return {
        "meta": meta,
        "build_s": done.seconds,
        "build_gib": done.peak_bytes / 2**30,
        "index_bytes": (out / "index.faiss").stat().st_size,
        "disk_bytes": disk,
    }


def query(
    bundle: Path, workdir: Path, rescore: int | None = None, pq_rescore: int | None = None
) -> dict[str, Any]:
    """A child process (--child) loads the bundle and answers the queries; its figures."""
    command = [sys.executable, "-m", "bench.bench_binary", "--child", str(bundle)]
    command += ["--workdir", str(workdir)]
    command += ["--rescore", str(rescore)] if rescore is not None else []
    command += ["--pq-rescore", str(pq_rescore)] if pq_rescore is not None else []
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"query child failed: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout))


def child(args: argparse.Namespace) -> int:
    """--child BUNDLE: load it, answer workdir/queries.npy (batched, REPEATS times, the fastest
    counts; then SINGLE one at a time), score against workdir/truth.npy; JSON on stdout."""
    from bench.bench_index import rss_gib
    from pactl.index import load_bundle
    from pactl.index.search import search

    queries = np.load(args.workdir / "queries.npy")
    truth = np.load(args.workdir / "truth.npy")
    bundle = load_bundle(Path(args.child))
    loaded = rss_gib()
    if args.pq_rescore is not None:
        run = _pq_rescored(bundle, args.workdir / "vectors" / "vectors.npy", args.pq_rescore)
    else:

        def run(q: np.ndarray) -> np.ndarray:
            return search(bundle, q, K, rescore=args.rescore)[1]

    started = time.perf_counter()
    run(queries)  # the first pass reads what the page cache lacks; timed on its own
    first = time.perf_counter() - started
    seconds, found = fastest(REPEATS, lambda: run(queries), warm_up=False)
    started = time.perf_counter()
    for i in range(SINGLE):
        run(queries[i : i + 1])
    single = (time.perf_counter() - started) / SINGLE
    print(
        json.dumps(
            {
                "first_ms": 1e3 * first / len(queries),
                "batched_ms": 1e3 * seconds / len(queries),
                "single_ms": 1e3 * single,
                "recall_at_1": float(np.mean(found[:, 0] == truth[:, 0])),
                "recall_at_10": recall_at_10(found, truth),
                "loaded_gib": loaded,
                "peak_gib": rss_gib("VmHWM"),
            }
        )
    )
    return 0


def _pq_rescored(bundle: Any, floats_file: Path, depth: int) -> Any:
    """A float bundle's K x depth hits rescored by exact cosine on the vectors file (mapped):
    what rescoring gives product-quantised candidates."""
    from pactl.index.rescoring import rescore
    from pactl.index.search import search

    floats = np.load(floats_file, mmap_mode="r")

    def rows(ids: np.ndarray) -> np.ndarray:
        return np.where((ids >= 0) & (ids < len(floats)), ids, -1)

    def run(q: np.ndarray) -> np.ndarray:
        found = search(bundle, q, K * depth)[1]
        return rescore(floats, rows, q, found, K)[1]

    return run


# ---------------------------------------------------------------------------- synthetic


def synthetic(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """Every row of the synthetic table, built and queried in `work`."""
    vectors = work / "vectors"
    queries = write_vectors(vectors, args.n, args.dim, args.seed, args.queries)
    np.save(work / "queries.npy", queries)
    base = np.load(vectors / "vectors.npy", mmap_mode="r")
    rows = [exact_float(base, queries, work)]
    rows.append(bundle_row("float default", 4 * args.dim, vectors, work / "float", []))
    nlist = 2 ** round(np.log2(4 * np.sqrt(args.n)))
    for bits in (b for b in BITS if b <= args.dim):
        rows += binary_rows(bits, args.dim, vectors, work)
        depth = next(r["meta"]["binary"]["rescore"] for r in rows if r.get("bits") == bits)
        m = bits // 8
        for kind, factory in (("PQ", f"PQ{m}"), ("IVF-PQ", f"IVF{nlist}_HNSW32,PQ{m}")):
            out = work / factory.replace(",", "-")
            row = bundle_row(f"{kind}{m}", m, vectors, out, ["--factory", factory], kind=kind)
            rescored = {**row, "name": f"{kind}{m} rescored x{depth}", "kind": f"{kind} rescored"}
            rows += [row, {**rescored, **query(out, work, pq_rescore=depth)}]
            shutil.rmtree(out)
    rows.append(exact_hamming(base, queries, work))
    rows += approximate_codes(widest(args.dim), nlist, vectors, work)
    return rows


def approximate_codes(bits: int, nlist: int, vectors: Path, work: Path) -> list[dict[str, Any]]:
    """The widest itq codes in FAISS's approximate binary indexes (IVF, HNSW) instead of BFlat,
    each tuned by pactl (F, then nprobe or efSearch)."""
    rows = []
    for factory in (f"BIVF{nlist}_HNSW32", "BHNSW32"):
        out = work / factory
        options = ["--binary", "--bits", str(bits), "--rotation", "itq", "--factory", factory]
        kind = f"itq rescored, {'IVF' if 'IVF' in factory else 'HNSW'}"
        row = bundle_row(f"itq {bits} {factory} rescored", bits // 8, vectors, out, options, kind)
        row["name"] += f" x{row['meta']['binary']['rescore']} ({row['meta']['search_params']})"
        rows.append(row)
        shutil.rmtree(out)
    return rows


def exact_float(base: np.ndarray, queries: np.ndarray, work: Path) -> dict[str, Any]:
    """IndexFlatIP over the vectors (in memory): the truth, its times (and workdir/truth.npy)."""
    import faiss

    flat = faiss.IndexFlatIP(base.shape[1])
    for start in range(0, len(base), CHUNK):
        flat.add(np.ascontiguousarray(base[start : start + CHUNK]))
    seconds, (_, truth) = fastest(REPEATS, lambda: flat.search(queries, K), warm_up=False)
    np.save(work / "truth.npy", truth)
    started = time.perf_counter()
    for i in range(SINGLE):
        flat.search(queries[i : i + 1], K)
    single = (time.perf_counter() - started) / SINGLE
    log(f"exact float: {1e3 * seconds / len(queries):.2f} ms/query batched")
    return {
        "name": "float exact (IndexFlatIP)",
        "kind": "float exact",
        "bytes": 4 * base.shape[1],
        "batched_ms": 1e3 * seconds / len(queries),
        "single_ms": 1e3 * single,
        "recall_at_1": 1.0,
        "recall_at_10": 1.0,
        "index_bytes": flat.ntotal * flat.d * 4,
    }


def bundle_row(
    name: str, code_bytes: int, vectors: Path, out: Path, options: list[str], kind: str = ""
) -> dict[str, Any]:
    """`pactl index` with `options` into `out`, queried at the bundle's own settings."""
    log(f"building {name}")
    built = build(vectors, out, options)
    row = {"name": name, "kind": kind or name, "bytes": code_bytes, **built}
    row |= query(out, out.parent)
    log(f"  {name}: recall@10 {row['recall_at_10']:.4f}, {row['batched_ms']:.3f} ms/query")
    return row


def binary_rows(bits: int, dim: int, vectors: Path, work: Path) -> list[dict[str, Any]]:
    """sign (at bits == dim) and itq codes, each in Hamming order and rescored."""
    rows = []
    for rotation in (["none"] if bits == dim else []) + ["itq"]:
        out = work / f"binary-{rotation}-{bits}"
        name = "sign" if rotation == "none" else "itq"
        options = ["--binary", "--bits", str(bits), "--rotation", rotation]
        kind = f"{name} rescored"
        row = bundle_row(f"{name} {bits} rescored", bits // 8, vectors, out, options, kind)
        row["bits"] = bits if rotation == "itq" else None
        row["name"] += f" x{row['meta']['binary']['rescore']}"
        hamming = {**row, "name": f"{name} {bits} Hamming", "kind": f"{name} Hamming"}
        hamming |= query(out, work, rescore=0)
        hamming["bits"] = None
        rows += [hamming, row]
        if not (rotation == "itq" and bits == widest(dim)):  # kept for exact_hamming
            shutil.rmtree(out)
    return rows


def widest(dim: int) -> int:
    return max(b for b in BITS if b <= dim)


def exact_hamming(base: np.ndarray, queries: np.ndarray, work: Path) -> dict[str, Any]:
    """IndexBinaryFlat top-10 over the widest itq codes of the whole base (the bundle's own
    index), timed as exact_float is: the published comparison of exact searches."""
    from pactl.index import load_bundle

    bits = widest(base.shape[1])
    bundle = load_bundle(work / f"binary-itq-{bits}")
    codes = bundle.index.rotation.codes(queries)
    index = bundle.index.codes
    seconds, _ = fastest(REPEATS, lambda: index.search(codes, K))
    started = time.perf_counter()
    for i in range(SINGLE):
        index.search(codes[i : i + 1], K)
    single = (time.perf_counter() - started) / SINGLE
    return {
        "name": f"exact Hamming top-10 (IndexBinaryFlat, {bits}-bit itq codes)",
        "kind": "",
        "bytes": bits // 8,
        "batched_ms": 1e3 * seconds / len(queries),
        "single_ms": 1e3 * single,
    }


# ---------------------------------------------------------------------------- report


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| method | bytes/vector | Recall@1 | Recall@10 | ms/query batched (first pass) | "
        "ms/query one at a time | build s | index MiB (in memory) | disk MiB | query peak "
        "RSS GiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        cells = [
            r["name"],
            str(r["bytes"]),
            _f(r.get("recall_at_1"), 4),
            _f(r.get("recall_at_10"), 4),
            _f(r.get("batched_ms"), 3) + (f" ({r['first_ms']:.3f})" if "first_ms" in r else ""),
            _f(r.get("single_ms"), 2),
            _f(r.get("build_s"), 1),
            _f(r["index_bytes"] / 2**20 if "index_bytes" in r else None, 1),
            _f(r["disk_bytes"] / 2**20 if "disk_bytes" in r else None, 1),
            _f(r.get("peak_gib"), 2),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _f(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's 1M targets, read from this run's rows."""
    by = {r["name"].split(" x")[0]: r for r in rows}
    flat, default = by["float exact (IndexFlatIP)"], by["float default"]
    code = by[f"itq {widest(flat['bytes'] // 4)} rescored"]
    hamming = next(r for r in rows if r["name"].startswith("exact Hamming"))
    smaller = default["index_bytes"] / code["index_bytes"]
    faster = flat["batched_ms"] / hamming["batched_ms"]
    single = flat["single_ms"] / hamming["single_ms"]
    return [
        f"- in-memory index {smaller:.1f}x smaller than the float default's (target >= 16x): "
        f"{'met' if smaller >= 16 else 'missed'}",
        f"- exact Hamming top-10 {faster:.1f}x faster batched, {single:.1f}x one at a time than "
        f"exact float (target >= 15x): {'met' if min(faster, single) >= 15 else 'see rows'}",
        f"- rescored at its default ({code['meta']['binary']['rescore']} candidates a hit) "
        f"Recall@10 {code['recall_at_10']:.4f} (target >= 0.95): "
        f"{'met' if code['recall_at_10'] >= 0.95 else 'missed'}",
        f"- against the float default: {code['batched_ms'] / default['batched_ms']:.1f}x its "
        f"batched query time, {code['single_ms'] / default['single_ms']:.1f}x one at a time",
    ]


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Recall@1 against bytes per vector, one line per kind of code."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r.get("recall_at_1") is not None:
            series.setdefault(r["kind"], []).append((r["bytes"], r["recall_at_1"]))
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for kind, points in sorted(series.items()):
        points.sort()
        axes.plot(*zip(*points, strict=True), marker="o", label=kind)
    axes.set_xscale("log", base=2)
    axes.set_xlabel("bytes per vector")
    axes.set_ylabel("Recall@1 against exact float search")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    log(f"wrote {path}")


# ---------------------------------------------------------------------------- scale


def scale(args: argparse.Namespace) -> int:
    """The binary default and the float default over n vectors on disk, side by side."""
    work = (args.workdir or Path(tempfile.gettempdir())) / "bench-binary-scale"
    need = args.n * args.dim * 4 * 1.1 + 4 * 2**30  # the vectors, the float index, the codes
    free = shutil.disk_usage(work.parent).free
    if free < need:
        raise SystemExit(
            f"{free / 2**30:.0f} GiB free under {work.parent}: need {need / 2**30:.0f}"
        )
    try:
        vectors = work / "vectors"
        if not (vectors / "meta.json").is_file():
            np.save(
                work / "queries.npy",
                write_vectors(vectors, args.n, args.dim, args.seed, args.queries),
            )
        queries = np.load(work / "queries.npy")
        base = np.load(vectors / "vectors.npy", mmap_mode="r")
        if not (work / "truth.npy").is_file():
            started = time.perf_counter()
            np.save(work / "truth.npy", exact_truth(base, queries, K))
            log(f"exact top-{K} over {args.n:,} in {time.perf_counter() - started:.0f} s")
        rows = [bundle_row("binary default", args.dim // 8, vectors, work / "binary", ["--binary"])]
        rows[0]["kind"] = "binary rescored"
        hamming = {**rows[0], "name": "binary default, Hamming order", "kind": "binary Hamming"}
        rows.append(hamming | query(work / "binary", work, rescore=0))
        rows.append(flat_codes(work / "binary", base, queries))
        rows.append(bundle_row("float default", 4 * args.dim, vectors, work / "float", []))
        print(f"`python -m bench binary {' '.join(sys.argv[1:])}`: {args.n:,} x {args.dim}")
        print("\n".join(table(rows)))
        print("\n".join(built(r) for r in rows if "meta" in r))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def built(row: dict[str, Any]) -> str:
    """A line on how a row's bundle was built: factory, setting, peak RSS, binary record."""
    meta = row["meta"]
    return (
        f"- {row['name']}: {meta['factory']} ({meta['search_params'] or 'exact'}), build peak "
        f"RSS {row['build_gib']:.2f} GiB, tuning Recall@10 {meta['recall_at_10']:.4f}, "
        f"{json.dumps(meta.get('binary', {}))}"
    )


def flat_codes(bundle_dir: Path, base: np.ndarray, queries: np.ndarray) -> dict[str, Any]:
    """Exact Hamming search (IndexBinaryFlat) over the binary bundle's codes of all of `base`,
    coded a block at a time with its rotation: how long a BFlat query takes at this size."""
    import faiss

    from pactl.index import load_bundle
    from pactl.index.mapped import blocks

    rotation = load_bundle(bundle_dir).index.rotation
    flat = faiss.IndexBinaryFlat(rotation.bits)
    for _, block in blocks(base):
        flat.add(rotation.codes(np.ascontiguousarray(block)))
    codes = rotation.codes(queries)
    seconds, _ = fastest(1, lambda: flat.search(codes, K))
    started = time.perf_counter()
    for i in range(SINGLE):
        flat.search(codes[i : i + 1], K)
    return {
        "name": "exact Hamming top-10 (IndexBinaryFlat over the same codes)",
        "kind": "",
        "bytes": rotation.bits // 8,
        "batched_ms": 1e3 * seconds / len(queries),
        "single_ms": 1e3 * (time.perf_counter() - started) / SINGLE,
        "index_bytes": flat.ntotal * flat.code_size,
    }


# ---------------------------------------------------------------------------- real sets


def pactl_run(args: list[str], work: Path) -> None:
    """`pactl ARGS` with the scratch runs and home of `work`; exit on failure."""
    env = {**os.environ, "PACTL_RUNS": str(work / "runs"), "PACTL_HOME": str(work / "home")}
    log("pactl " + " ".join(args))
    done = subprocess.run([sys.executable, "-m", "pactl", *args, "--quiet"], env=env, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"pactl {' '.join(args)} failed ({done.returncode})")


def test_vectors(name: str, extra: list[str], args: argparse.Namespace, work: Path) -> Any:
    """The test classes' vectors (and their labels) of the CPU default trained on set `name`
    from EfficientNet-Lite0's weights with `extra` options; run and vectors reused if there."""
    from pactl.verbs.vector_sources import gather_vectors

    run = f"{name}-{'-'.join(e.strip('-') for e in extra) or 'float'}"
    best = work / "runs" / run / "best.pt"
    given = args.bits_run if extra else args.float_run
    if given is not None:  # a run trained elsewhere (bench_codes.py's, say)
        run, best = f"{name}-{given.name}", given / "best.pt"
    elif not best.is_file():
        weights = str(args.root / "lite0.pth")
        pactl_run(
            ["train", str(args.root / name), "--weights", weights, "--name", run, *extra], work
        )
    out = work / f"vectors-{run}"
    if not (out / "meta.json").is_file():
        source = str(args.root / name)
        embed = ["embed", source, "--checkpoint", str(best), "--split", "test", "--out", str(out)]
        pactl_run(embed, work)
    vectors, items, _ = gather_vectors(out)
    labels = np.unique(np.asarray(items.labels.tolist()), return_inverse=True)[1]
    return np.ascontiguousarray(vectors), labels.astype(np.int64)


def scored(
    vectors: np.ndarray, labels: np.ndarray, config: Any, truth: np.ndarray
) -> dict[str, Any]:
    """Recall@1 and MAP@R of codes made as `pactl eval --binary` makes them (Hamming and
    rescored), and their Recall@10 against exact float search (each item querying the others)."""
    from pactl.console import QUIET
    from pactl.index.binary.build import build_codes
    from pactl.index.binary.metrics import code_metrics
    from pactl.index.search import exclude_by_id

    n = len(vectors)
    ids = np.arange(n, dtype=np.int64)

    def rows(wanted: np.ndarray) -> np.ndarray:
        return np.where((wanted >= 0) & (wanted < n), wanted, -1)

    binary, record = build_codes([(vectors, ids)], config, QUIET, vectors, rows)
    got = code_metrics(binary, vectors, labels, labels, [1], True)
    out = {"rescore": binary.rescore, "rotation": record["binary"]["rotation"], **got}
    for name, depth in (("codes", 0), ("rescored", binary.rescore)):
        scores, found = binary.with_rescore(depth).search(vectors, K + 1)
        found = exclude_by_id(scores, found, ids, K)[1]
        out[f"{name}_recall_at_10"] = recall_at_10(found, truth)
    return out


def real_set(name: str, args: argparse.Namespace, work: Path) -> list[str]:
    """The table rows of set `name`: float, sign and itq codes per bits, learned 64-bit codes."""
    from pactl import metrics
    from pactl.config import IndexConfig

    vectors, labels = test_vectors(name, [], args, work)
    n, dim = vectors.shape
    floats = metrics.score_vectors(vectors, labels, [1])
    _, truth = metrics.knn(vectors, vectors, K, np.arange(n), np.arange(n))
    lines = [
        f"| {name} | float {dim}-d | {4 * dim} | {floats['recall@1']:.4f} | "
        f"{floats['map@r']:.4f} | 1 | |"
    ]
    for bits in (b for b in BITS if b <= dim):
        for rotation in (["none"] if bits == dim else []) + ["itq"]:
            config = IndexConfig(binary=True, bits=bits, rotation=rotation)
            got = scored(vectors, labels, config, truth)
            what = f"{'sign' if rotation == 'none' else 'itq'} {bits}"
            lines += _rows(name, what, bits, got, floats)
    if args.float_run is not None and args.bits_run is None:
        return lines  # a float run of one's own and no --bits run: no learned codes
    learned, learned_labels = test_vectors(name, ["--bits", "64"], args, work)
    if not (learned_labels == labels).all():
        raise SystemExit(f"{name}: the two networks embedded the test images in other orders")
    got = scored(learned, labels, IndexConfig(binary=True, bits=64, rotation="none"), truth)
    return lines + _rows(name, "learned 64 (train --bits 64)", 64, got, floats)


def _rows(
    name: str, what: str, bits: int, got: dict[str, Any], floats: dict[str, float]
) -> list[str]:
    keep1 = got["codes_recall@1"] / floats["recall@1"]
    keep2 = got["rescored_recall@1"] / floats["recall@1"]
    return [
        f"| {name} | {what} Hamming | {bits // 8} | {got['codes_recall@1']:.4f} ({keep1:.1%}) | "
        f"{got['codes_map@r']:.4f} | {got['codes_recall_at_10']:.4f} | {got['rotation']} |",
        f"| {name} | {what} rescored x{got['rescore']} | {bits // 8} | "
        f"{got['rescored_recall@1']:.4f} ({keep2:.1%}) | {got['rescored_map@r']:.4f} | "
        f"{got['rescored_recall_at_10']:.4f} | {got['rotation']} |",
    ]


def real_sets(args: argparse.Namespace) -> int:
    work = (args.workdir or args.root / "work") / "binary"
    work.mkdir(parents=True, exist_ok=True)
    lines = [
        "| set | codes | bytes/vector | Recall@1 (of float's) | MAP@R | Recall@10 against exact "
        "float | rotation |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for name in args.sets.split(","):
        lines += real_set(name, args, work)
    print(f"`python -m bench binary {' '.join(sys.argv[1:])}`: test classes of each set\n")
    print("\n".join(lines))
    return 0


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = data_parser(__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=None, help="where data and bundles go")
    p.add_argument("--plot", type=Path, default=None, help="Recall@1 against bytes (.png)")
    p.add_argument("--sets", default=None, help="real sets instead: fonts,fashion")
    p.add_argument("--root", type=Path, default=Path("/tmp/pactl-real"))
    p.add_argument("--float-run", type=Path, default=None, help="with one set: its float run")
    p.add_argument("--bits-run", type=Path, default=None, help="its --bits 64 run (none: no row)")
    p.add_argument("--scale", action="store_true", help="the scale run (binary and float default)")
    p.add_argument("--keep", action="store_true", help="keep the scale run's data")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--rescore", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--pq-rescore", type=int, default=None, help=argparse.SUPPRESS)
    return parsed(p, argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        return child(args)
    if args.sets is not None:
        return real_sets(args)
    if args.scale:
        return scale(args)
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="bench-binary-") as tmp:
        work = Path(tmp)
        rows = synthetic(args, work)
        command = " ".join(["python -m bench binary", *sys.argv[1:]])
        data = f"{args.n:,} x {args.dim} clustered unit vectors (seed {args.seed})"
        print(f"`{command}`: {data}, {args.queries:,} fresh queries, against exact float search\n")
        print("\n".join(table(rows)))
        print()
        print("\n".join(targets(rows)))
        plot(rows, args.plot or Path(f"binary_recall_{args.n}x{args.dim}.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
