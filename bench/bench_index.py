"""The default index against exact search, on clustered unit vectors.

Target: on 1,000,000 x 512 vectors the default index (choose_factory) reaches Recall@10 >= 0.95
against exact search, at least 10x faster per query than exact search (IndexFlatIP); build time
and memory reported.

Data: bench.data.Mixture, seeded clustered unit vectors (bench/data.py says how they are drawn).
The report gives the share of each query's true top-10 inside its own class (about 55-60%).

Run from the repository root:
  python -m bench index                      # 1,000,000 x 512, 1,000 queries
  python -m bench index --quick              # 100,000 x 128, 200 queries
  python -m bench index --n 300000 --dim 256
Results go to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from bench import harness
from bench.data import CHUNK, Mixture
from pactl.config import IndexConfig
from pactl.console import Reporter
from pactl.index import load_bundle
from pactl.index.search import search
from pactl.verbs.index import index_vectors

K = 10


def data_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the options of the synthetic data (Mixture) that the index benches share."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--n", type=int, default=1_000_000, help="vectors in the index")
    p.add_argument("--dim", type=int, default=512, help="dimension")
    p.add_argument("--queries", type=int, default=1_000, help="fresh query vectors")
    p.add_argument("--quick", action="store_true", help="100,000 x 128 with 200 queries")
    p.add_argument("--seed", type=int, default=0)
    return p


def parsed(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The arguments of a data_parser, --quick applied."""
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.dim, args.queries = 100_000, 128, 200
    return args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = data_parser(__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="timed passes; the fastest counts")
    p.add_argument("--workdir", type=Path, default=None, help="where the bundle is written")
    p.add_argument("--factory", default=None, help="a FAISS factory (default: pactl's choice)")
    p.add_argument(
        "--memory-budget", type=float, default=8.0, help="GB the default index must fit in"
    )
    p.add_argument(
        "--rescore", type=int, default=None, help="candidates per hit rescored (default: tuned)"
    )
    return parsed(p, argv)


def rss_gib(field: str = "VmRSS") -> float:
    """A /proc/self/status memory field in GiB (VmRSS now, VmHWM the peak since reset_peak)."""
    return (harness.status_bytes(field) or 0) / 2**30


def reset_peak() -> bool:
    """Reset VmHWM (Linux >= 4.0), so the next peak reading covers what follows only."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")
        return True
    return False


def fastest(repeats: int, run: Callable[[], Any], warm_up: bool = True) -> tuple[float, Any]:
    """Best wall time of `repeats` runs (after an untimed one, which pages a memory-mapped index
    in) and the last result (harness.timed)."""
    timing, result = harness.timed(run, repeats=repeats, warmup=1 if warm_up else 0)
    return timing.fastest, result


def recall_at_10(found: np.ndarray, truth: np.ndarray) -> float:
    return statistics.fmean(
        len(set(f) & set(t)) / len(t) for f, t in zip(found.tolist(), truth.tolist(), strict=True)
    )


def exact_search(
    base: np.ndarray, queries: np.ndarray, repeats: int, log: Reporter
) -> tuple[float, np.ndarray, float]:
    """Brute force with IndexFlatIP: (seconds for all queries, top-10 ids, single-query ms)."""
    flat = faiss.IndexFlatIP(base.shape[1])
    for start in range(0, len(base), CHUNK):
        flat.add(base[start : start + CHUNK])
    log.log(f"exact search: {len(queries):,} queries over {flat.ntotal:,} vectors")
    # Brute force has no cache to warm: every pass reads all vectors.
    seconds, (_, truth) = fastest(repeats, lambda: flat.search(queries, K), warm_up=False)
    single = _single_query_ms(lambda q: flat.search(q, K), queries)
    return seconds, truth, single


def _single_query_ms(
    run: Callable[[np.ndarray], Any], queries: np.ndarray, count: int = 20
) -> float:
    """Mean latency of one query at a time (no batching), over the first `count` queries."""
    start = time.perf_counter()
    for i in range(min(count, len(queries))):
        run(queries[i : i + 1])
    return 1e3 * (time.perf_counter() - start) / min(count, len(queries))


def vectors_folder(folder: Path, base: np.ndarray) -> None:
    """`base` as a vectors folder (vectors.npy, items.csv, meta.json), as `pactl embed` writes
    one, for `pactl index` to read."""
    import json

    from pactl.embed import VECTORS_FORMAT

    folder.mkdir(parents=True)
    np.save(folder / "vectors.npy", base)
    rows = "".join(f"{i},item/{i}.jpg,,0,0\n" for i in range(len(base)))
    (folder / "items.csv").write_text("id,path,label,size,mtime_ns\n" + rows)
    meta = {"format": VECTORS_FORMAT, "version": 1, "dimension": int(base.shape[1])}
    meta.update(count=len(base), metric="ip", checkpoint="none.pt", fingerprint="0" * 64)
    meta["model_config"] = {}
    (folder / "meta.json").write_text(json.dumps(meta))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = Reporter()
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    mixture = Mixture(args.n, args.dim, rng)
    base, base_class = mixture.draw(args.n, rng)
    queries, query_class = mixture.draw(args.queries, rng)
    log.log(f"made {args.n:,} x {args.dim} clustered vectors in {time.perf_counter() - t0:.1f} s")
    got: dict[str, Any] = {"rss_data": rss_gib()}

    got["exact_s"], truth, got["exact_single"] = exact_search(base, queries, args.repeats, log)
    got["in_class"] = float(np.mean(base_class[truth] == query_class[:, None]))

    config = IndexConfig(
        factory=args.factory, memory_budget_gb=args.memory_budget, rescore=args.rescore
    )
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        out = Path(tmp) / "bundle"
        vectors_folder(Path(tmp) / "vectors", base)
        reset_peak()
        got["rss_before"] = rss_gib()
        t0 = time.perf_counter()  # as `pactl index VECTORS` builds it: floats kept where lossy
        _, record = index_vectors(Path(tmp) / "vectors", out, config, log)
        got["build_s"] = time.perf_counter() - t0
        got["peak_build"] = rss_gib("VmHWM")
        got["index_bytes"] = (out / "index.faiss").stat().st_size
        bundle = load_bundle(out, mmap=True)
        got["approx_s"], (_, found) = fastest(args.repeats, lambda: search(bundle, queries, K))
        got["approx_single"] = _single_query_ms(lambda q: search(bundle, q, K), queries)
    got["recall"] = recall_at_10(found, truth)
    met = report(args, record, got)
    return 0 if met else 1


def report(args: argparse.Namespace, record: dict[str, Any], got: dict[str, Any]) -> bool:
    """Print the figures on stdout; True when the target is met."""
    nq = args.queries
    speedup = got["exact_s"] / got["approx_s"]
    met = bool(got["recall"] >= 0.95 and speedup >= 10)
    lines = [
        f"command         python -m bench index {' '.join(sys.argv[1:])}".rstrip(),
        f"data            {args.n:,} x {args.dim} clustered unit vectors (seed {args.seed}), "
        f"{nq:,} fresh queries; {got['in_class']:.1%} of true top-10 in the query's class",
        f"threads         {faiss.omp_get_max_threads()}",
        f"default index   {record['factory']}  ({record['search_params']}"
        + (f", rescore={record['rescore']}" if record.get("rescore") else "")
        + ")",
        f"tuning          target {record['target_recall']}, reached: "
        f"{record['target_reached']}, limited by: {record.get('limited_by')}; "
        f"{len(record.get('operating_points') or [])} operating points measured",
        f"build           {got['build_s']:.1f} s: train on {record['train_points']:,} points, "
        f"add, tune on {record['tuning_queries']:,} held-out points",
        f"memory          {got['rss_data']:.2f} GiB RSS holding the data; peak "
        f"{got['peak_build']:.2f} GiB during the build (from {got['rss_before']:.2f} GiB)",
        f"index size      {got['index_bytes'] / 2**30:.3f} GiB (memory-mapped for search)",
        f"recall@10       {got['recall']:.4f} on fresh queries (tuning measured "
        f"{record['recall_at_10']:.4f} on held-out data points)",
        f"exact           {1e3 * got['exact_s'] / nq:.3f} ms/query batched, "
        f"{got['exact_single']:.2f} ms one at a time (IndexFlatIP)",
        f"default index   {1e3 * got['approx_s'] / nq:.3f} ms/query batched, "
        f"{got['approx_single']:.2f} ms one at a time (pactl.index.search over the bundle)",
        f"speed-up        {speedup:.1f}x batched, "
        f"{got['exact_single'] / got['approx_single']:.1f}x one at a time",
        f"target          recall@10 >= 0.95 and >= 10x faster: {'met' if met else 'NOT met'}",
    ]
    print("\n".join(lines))
    return met


if __name__ == "__main__":
    raise SystemExit(main())
