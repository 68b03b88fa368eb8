"""`pactl query` over a large bundle with many query images from stdin: memory and throughput.

Target: querying a bundle of 1,000,000 vectors with 10,000 queries from stdin in one process
keeps memory bounded (streamed batches) and prints every result line.

Setup, all seeded and cached in --workdir between runs:
  - a real pactl checkpoint: the 'small' CNN, no pretrained weights, --dim-d embedding, 16 px
    input (what `pactl train` would export, untrained);
  - --queries 16x16 PNG query images (coarse random colour fields plus pixel noise);
  - a bundle of --n unit vectors clustered around that model's embeddings of fresh images made
    like the queries (see gallery_vectors), built with the default index, its meta.json naming
    the checkpoint and its fingerprint as `pactl index` writes them.
Each measured run is one `pactl query - --index BUNDLE --k K --format F` process with the query
paths on stdin and stdout to a file. Its peak resident memory is its VmHWM, polled from
/proc/PID/status along with its split into anonymous memory (heap: what streaming must keep
bounded) and file-backed pages (libraries and the memory-mapped index.faiss: shared page cache,
bounded by their size). Not ru_maxrss from wait4: subprocess starts the child with vfork, and
exec then records the parent's own peak as the child's, so this process's peak (the index
build) would be reported for every run. Every run is repeated with --baseline-queries
(default a tenth) queries: bounded memory means the big run's peak is about the small run's,
not ten times it.
The output is parsed back: every query must have exactly k rows, Q * k rows in all.

Run from the repository root:
  python -m bench query_load                 # 1,000,000 x 64; 10,000 vs 1,000 queries
  python -m bench query_load --quick         # 50,000 x 64; 1,000 vs 100 queries
  python -m bench query_load --n 200000 --queries 5000 --workdir /scratch/bench
Results go to stdout (a markdown table), progress to stderr.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pactl.config import IndexConfig, ModelConfig
from pactl.console import Reporter
from pactl.index import ItemTable, build_index, save_bundle

IMAGE_SIZE = 16
CHUNK = 65_536  # gallery vectors made per step
GALLERY = "model-centred, 50 per class"  # how gallery_vectors draws; a cached bundle must match
POLL_S = 0.02  # /proc sampling period: the process runs for seconds, peaks last longer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1_000_000, help="vectors in the bundle")
    p.add_argument("--dim", type=int, default=64, help="embedding dimension")
    p.add_argument("--queries", type=int, default=10_000, help="query images of the big run")
    p.add_argument("--baseline-queries", type=int, default=None, help="default: --queries / 10")
    p.add_argument("--k", type=int, default=10, help="neighbours per query")
    p.add_argument("--formats", default="jsonl,csv", help="output formats to measure")
    p.add_argument(
        "--no-exclude-self",
        dest="exclude_self",
        action="store_false",
        help="skip the extra jsonl --exclude-self run (it builds the path -> id map)",
    )
    p.add_argument("--quick", action="store_true", help="50,000 vectors, 1,000 vs 100 queries")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, default=None, help="cache of checkpoint/bundle/images")
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.queries = 50_000, 1_000
    if args.baseline_queries is None:
        args.baseline_queries = max(1, args.queries // 10)
    if args.workdir is None:
        args.workdir = Path(tempfile.gettempdir()) / "pactl-bench-query-load"
    return args


# ---------------------------------------------------------------------------- fixtures


def make_checkpoint(workdir: Path, dim: int) -> tuple[Path, dict[str, Any]]:
    """best.pt of an untrained 'small' network; deterministic, so written once."""
    from pactl import checkpoint

    path = workdir / f"small-d{dim}-s{IMAGE_SIZE}.pt"
    if not path.is_file():
        from pactl.model import build_model

        config = ModelConfig(
            backbone="small",
            weights="none",
            embedding_dim=dim,
            image_size=IMAGE_SIZE,
            resize_size=IMAGE_SIZE,
        )
        model, resolved = build_model(config, seed=0)
        state = checkpoint.clean_state_dict(model)
        checkpoint.save(path, checkpoint.export_payload(state, resolved, [], 0, {}))
    return path, checkpoint.load(path)


def query_image(rng: np.random.Generator) -> Any:
    """A 16x16 RGB image: a coarse random colour field, upsampled, plus pixel noise."""
    from PIL import Image

    coarse = rng.uniform(0, 255, (4, 4, 3)).astype(np.float32)
    blocks = np.kron(coarse, np.ones((IMAGE_SIZE // 4, IMAGE_SIZE // 4, 1), np.float32))
    pixels = blocks + rng.normal(0, 24, (IMAGE_SIZE, IMAGE_SIZE, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def gallery_vectors(ckpt: Path, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, dim) unit vectors clustered around the model's own embeddings, and their classes.

    An untrained network maps every image into a narrow cone (the query images' embeddings
    are at cosine ~0.97 to each other), so vectors drawn elsewhere on the sphere would leave
    all queries probing the same few IVF lists, which would understate both the search cost
    and the pages of the mapped index a run touches. Here n / 50 class centres are embeddings
    of fresh images made like the queries; items sit around their centre at half the distance
    to its nearest other centre; class sizes follow lognormal weights (sigma 1).
    """
    import faiss
    import torch

    from pactl.checkpoint import load_model
    from pactl.transforms import build_transform

    model, cfg, _ = load_model(ckpt)
    assert cfg.mean is not None and cfg.std is not None
    transform = build_transform(cfg.image_size, cfg.resize_size, cfg.mean, cfg.std, train=False)
    classes = max(2, n // 50)
    centres = np.empty((classes, cfg.embedding_dim), dtype=np.float32)
    with torch.inference_mode():
        for start in range(0, classes, 1024):
            images = [
                transform(query_image(np.random.default_rng([seed, 1, c])))
                for c in range(start, min(start + 1024, classes))
            ]
            centres[start : start + len(images)] = model(torch.stack(images)).numpy()
    squared, _ = faiss.knn(centres, centres, 2)  # L2; column 0 is the centre itself
    spread = 0.5 * float(np.sqrt(np.median(squared[:, 1])))
    rng = np.random.default_rng([seed, 2])
    weights = rng.lognormal(0.0, 1.0, classes)
    labels = rng.choice(classes, size=n, p=weights / weights.sum())
    out = np.empty((n, cfg.embedding_dim), dtype=np.float32)
    scale = np.float32(spread / math.sqrt(cfg.embedding_dim))
    for start in range(0, n, CHUNK):
        c = labels[start : start + CHUNK]
        noise = rng.standard_normal((len(c), cfg.embedding_dim), dtype=np.float32)
        moved = centres[c] + noise * scale
        out[start : start + len(c)] = moved / np.linalg.norm(moved, axis=1, keepdims=True)
    return out, labels


def ensure_bundle(
    workdir: Path, n: int, seed: int, ckpt: Path, payload: dict[str, Any], log: Reporter
) -> tuple[Path, dict[str, Any]]:
    """The cached bundle for (n, seed, model), built when missing or stale."""
    dim = int(payload["model_config"]["embedding_dim"])
    out = workdir / f"bundle-n{n}-d{dim}-s{seed}"
    meta_path = out / "meta.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        same = (meta.get("fingerprint"), meta.get("count"), meta.get("gallery"))
        if same == (payload["fingerprint"], n, GALLERY):
            log.log(f"reusing {out} ({meta['factory']}, built in {meta['build_seconds']} s)")
            return out, meta
    t0 = time.perf_counter()
    vectors, classes = gallery_vectors(ckpt, n, seed)
    log.log(f"made {n:,} x {dim} gallery vectors in {time.perf_counter() - t0:.1f} s")
    index, record = build_index(vectors, IndexConfig(), log, seed=seed)
    del vectors
    names = np.array([f"class{c:05d}" for c in range(int(classes.max()) + 1)], dtype=object)
    paths = np.array([f"gallery/{c:05d}/{i:07d}.png" for i, c in enumerate(classes)], dtype=object)
    items = ItemTable(np.arange(n, dtype=np.int64), paths, names[classes])
    meta = {
        "checkpoint": str(ckpt.resolve()),
        "fingerprint": payload["fingerprint"],
        "model_config": payload["model_config"],
        "metric": "ip",
        "gallery": GALLERY,
        **record,
    }
    if out.exists():
        shutil.rmtree(out)
    save_bundle(out, index, items, meta)
    return out, json.loads(meta_path.read_text())


def write_queries(workdir: Path, count: int, seed: int, log: Reporter) -> list[Path]:
    """`count` seeded query PNGs (existing ones are kept: same seed, same pixels)."""
    folder = workdir / f"queries-{IMAGE_SIZE}px-s{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"q{i:06d}.png" for i in range(count)]
    missing = [i for i, p in enumerate(paths) if not p.is_file()]
    for i in missing:
        query_image(np.random.default_rng([seed, 0, i])).save(paths[i])
    if missing:
        log.log(f"wrote {len(missing):,} query images to {folder}")
    return paths


# ---------------------------------------------------------------------------- one run


@dataclass
class Sampled:
    """Peaks from /proc/PID/status, in kB, and when output first appeared."""

    hwm: int = 0  # VmHWM: peak RSS since exec
    anon: int = 0
    file: int = 0
    anon_first_half: int = 0  # peak RssAnon while stdout held under half its final size
    trace: list[tuple[float, int, int, int]] = field(default_factory=list)  # t, bytes, anon, file
    first_output_s: float | None = None


def _status_kb(pid: int) -> dict[str, int] | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            rows = [line.split() for line in f]
    except (FileNotFoundError, ProcessLookupError):
        return None
    return {r[0].rstrip(":"): int(r[1]) for r in rows if len(r) == 3 and r[2] == "kB"}


def _poll(
    pid: int, out_file: Path, started: float, sampled: Sampled, stop: threading.Event
) -> None:
    while not stop.is_set():
        status = _status_kb(pid)
        if not status or "RssAnon" not in status:  # gone, or a zombie awaiting wait4
            return
        size = out_file.stat().st_size
        t = time.perf_counter() - started
        if size and sampled.first_output_s is None:
            sampled.first_output_s = t
        sampled.trace.append((t, size, status["RssAnon"], status["RssFile"]))
        sampled.hwm = max(sampled.hwm, status["VmHWM"])
        sampled.anon = max(sampled.anon, status["RssAnon"])
        sampled.file = max(sampled.file, status["RssFile"])
        stop.wait(POLL_S)


def pactl_command() -> list[str]:
    script = Path(sys.executable).with_name("pactl")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "pactl"]


def streaming_rate(r: dict[str, Any]) -> float | None:
    """Queries/s after the first rows appeared: the rate once the bundle and model are loaded."""
    s: Sampled = r["sampled"]
    first = next(((t, b) for t, b, _, _ in s.trace if b), None)
    # One chunk (or a first sample that already saw most rows) leaves nothing to time.
    if first is None or first[1] > r["out_bytes"] / 2 or r["wall_s"] <= first[0]:
        return None
    return r["q"] * (1 - first[1] / r["out_bytes"]) / (r["wall_s"] - first[0])


def run_query(
    bundle: Path, listing: Path, k: int, fmt: str, extra: list[str], out_file: Path
) -> dict[str, Any]:
    """One `pactl query -` process: wall time, peak memory (kB), exit status, stderr."""
    cmd = [
        *pactl_command(),
        "query",
        "-",
        "--index",
        str(bundle),
        "--k",
        str(k),
        "--format",
        fmt,
        "--device",
        "cpu",
        *extra,
    ]
    err_file = out_file.with_suffix(".stderr")
    sampled, stop = Sampled(), threading.Event()
    with open(listing, "rb") as stdin, open(out_file, "wb") as out, open(err_file, "wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=stdin, stdout=out, stderr=err)
        poller = threading.Thread(target=_poll, args=(proc.pid, out_file, started, sampled, stop))
        poller.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        stop.set()
        poller.join()
    final = out_file.stat().st_size
    sampled.anon_first_half = max((a for _, b, a, _ in sampled.trace if b < final / 2), default=0)
    return {
        "cmd": cmd,
        "rc": proc.returncode,
        "wall_s": wall,
        "maxrss_kb": sampled.hwm,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "sampled": sampled,
        "stderr": err_file.read_text(errors="replace").strip(),
        "out_bytes": final,
    }


def check_output(out_file: Path, fmt: str, k: int) -> dict[str, Any]:
    """Count result rows and rows per query; reading back proves each line is well formed."""
    per_query: Counter[str] = Counter()
    lines = 0
    with open(out_file, newline="", encoding="utf-8") as f:
        if fmt == "csv":
            reader = csv.reader(f)
            header = next(reader, None)
            lines = 1 if header is not None else 0
            for row in reader:
                per_query[row[0]] += 1
                lines += 1
        else:
            for line in f:
                per_query[json.loads(line)["query"]] += 1
                lines += 1
    rows = sum(per_query.values())
    return {
        "lines": lines,
        "rows": rows,
        "queries": len(per_query),
        "all_k": all(c == k for c in per_query.values()),
    }


# ---------------------------------------------------------------------------- stages


def _rss_kb() -> int:
    return (_status_kb(os.getpid()) or {}).get("VmRSS", 0)


def probed_lists(index: Any, vectors: np.ndarray) -> np.ndarray:
    """The IVF lists the queries' search visits (empty for other index kinds)."""
    import faiss

    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None or not len(vectors):
        return np.empty(0, dtype=np.int64)
    _, lists = ivf.quantizer.search(np.ascontiguousarray(vectors), int(ivf.nprobe))
    return np.unique(lists)


def list_sizes(index: Any) -> np.ndarray:
    """Vectors per IVF list (empty for other index kinds)."""
    import faiss

    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None:
        return np.empty(0, dtype=np.int64)
    lists: Any = ivf.invlists
    return np.array([lists.list_size(i) for i in range(int(ivf.nlist))], dtype=np.int64)


def stage_seconds(
    bundle_dir: Path, queries: list[Path], k: int, chunk: int = 512
) -> tuple[dict[str, float], str]:
    """Where the time of `pactl query` goes: the steps of pipeline.query_chunks, timed one by
    one in this process (jsonl to /dev/null), plus the path -> id map --exclude-self builds;
    and a line on how much of the index the queries reach."""
    from rich.console import Console

    from pactl.console import QUIET
    from pactl.embed import embed_files
    from pactl.index import ITEMS_FILE
    from pactl.index.search import PathIndex, hits, search
    from pactl.output import HitWriter
    from pactl.verbs.query import open_query_model

    t0 = time.perf_counter()
    ItemTable.read(bundle_dir / ITEMS_FILE)
    got = {"parse items.csv": time.perf_counter() - t0}
    t0 = time.perf_counter()
    opened = open_query_model(bundle_dir, None, "cpu")
    bundle, model, model_cfg, device = opened.bundle, opened.model, opened.config, opened.device
    got["open bundle + model"] = time.perf_counter() - t0
    steps = dict.fromkeys(("decode + embed", "search", "hit rows", "write jsonl"), 0.0)
    reached = []
    with open(os.devnull, "w") as sink:
        writer = HitWriter(Console(file=sink), sink, "jsonl", False, False)
        for start in range(0, len(queries), chunk):
            t0 = time.perf_counter()
            done = embed_files(model, queries[start : start + chunk], model_cfg, device, QUIET)
            t1 = time.perf_counter()
            scores, ids = search(bundle, done.vectors, k)
            t2 = time.perf_counter()
            rows = hits(bundle, [str(queries[start + i]) for i in done.rows], scores, ids)
            t3 = time.perf_counter()
            writer.write(rows)
            t4 = time.perf_counter()
            for name, seconds in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                steps[name] += seconds
            reached.append(probed_lists(bundle.index, done.vectors))
    got.update(steps)
    sizes, lists = list_sizes(bundle.index), np.unique(np.concatenate(reached))
    spread = (
        f"the {len(queries):,} queries probe {len(lists):,} of {len(sizes):,} IVF lists, "
        f"holding {int(sizes[lists].sum()):,} of {bundle.index.ntotal:,} vectors"
        if len(sizes)
        else "the index has no inverted lists: every query reads all of it"
    )
    before, t0 = _rss_kb(), time.perf_counter()
    position = PathIndex(bundle.items, skip=bundle.deleted)  # what --exclude-self builds
    got["path -> id map (--exclude-self)"] = time.perf_counter() - t0
    got["path -> id map MiB"] = (_rss_kb() - before) / 1024
    del position
    return got, spread


# ---------------------------------------------------------------------------- main


@dataclass(frozen=True)
class Variant:
    name: str
    fmt: str
    extra: tuple[str, ...] = ()


def variants(args: argparse.Namespace) -> list[Variant]:
    chosen = [Variant(f, f) for f in args.formats.split(",") if f]
    if args.exclude_self:
        chosen.append(Variant("jsonl --exclude-self", "jsonl", ("--exclude-self",)))
    return chosen


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = Reporter()
    args.workdir.mkdir(parents=True, exist_ok=True)
    ckpt, payload = make_checkpoint(args.workdir, args.dim)
    bundle, meta = ensure_bundle(args.workdir, args.n, args.seed, ckpt, payload, log)
    bundle_bytes = sum(p.stat().st_size for p in bundle.iterdir() if p.is_file())
    queries = write_queries(args.workdir, max(args.queries, args.baseline_queries), args.seed, log)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for q in (args.baseline_queries, args.queries):
            listing = Path(tmp) / f"queries-{q}.txt"
            listing.write_text("".join(f"{p}\n" for p in queries[:q]))
            for v in variants(args):
                log.log(f"pactl query: {q:,} queries, {v.name}")
                out_file = Path(tmp) / f"out-{q}-{v.fmt}-{len(v.extra)}.{v.fmt}"
                got = run_query(bundle, listing, args.k, v.fmt, list(v.extra), out_file)
                got.update(check_output(out_file, v.fmt, args.k), q=q, variant=v)
                if got["rc"] != 0 or got["stderr"]:
                    log.log(f"  exit {got['rc']}; stderr: {got['stderr'][-2000:]}")
                results.append(got)
    log.log(f"timing the steps in-process over {args.queries:,} queries")
    stages, spread = stage_seconds(bundle, queries[: args.queries], args.k)
    met = report(args, meta, bundle, bundle_bytes, results)
    report_stages(stages, args.queries)
    print(spread)
    return 0 if met else 1


def _mib(kb: float) -> str:
    return f"{kb / 1024:,.0f}"


def markdown(header: list[str], rows: list[list[str]]) -> None:
    """A markdown table; every column but the first is right-aligned."""
    print("| " + " | ".join(header) + " |")
    print("|---|" + "---:|" * (len(header) - 1))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


def rows_ok(r: dict[str, Any], k: int) -> bool:
    """Exit 0 and exactly k rows for each of the q queries."""
    return bool(r["rc"] == 0 and r["rows"] == r["q"] * k and r["queries"] == r["q"] and r["all_k"])


def run_row(r: dict[str, Any], k: int) -> list[str]:
    s: Sampled = r["sampled"]
    first = f"{s.first_output_s:.1f}" if s.first_output_s is not None else "-"
    rate = streaming_rate(r)
    return [
        r["variant"].name,
        f"{r['q']:,}",
        f"{r['wall_s']:.1f}",
        f"{r['cpu_s']:.1f}",
        f"{r['q'] / r['wall_s']:,.0f}",
        first,
        f"{rate:,.0f}" if rate is not None else "-",
        _mib(r["maxrss_kb"]),
        _mib(s.anon),
        _mib(s.anon_first_half),
        _mib(s.file),
        f"{r['rows']:,}",
        "yes" if rows_ok(r, k) else "NO",
    ]


def ratio_row(small: dict[str, Any], big: dict[str, Any]) -> tuple[list[str], float, float]:
    """Big run against small run of one variant: (table row, peak anon ratio, MiB of peak RSS
    added)."""
    rss = big["maxrss_kb"] / small["maxrss_kb"]
    anon = big["sampled"].anon / max(small["sampled"].anon, 1)
    extra_q, extra_s = big["q"] - small["q"], big["wall_s"] - small["wall_s"]
    marginal = f"{extra_q / extra_s:,.0f}" if extra_s > 0 and extra_q > 0 else "-"
    grown = (big["maxrss_kb"] - small["maxrss_kb"]) / 1024
    row = [big["variant"].name, f"{rss:.2f}", f"{anon:.2f}", f"{grown:+,.0f}", marginal]
    return row, anon, grown


def report(
    args: argparse.Namespace,
    meta: dict[str, Any],
    bundle: Path,
    bundle_bytes: int,
    results: list[dict[str, Any]],
) -> bool:
    """Markdown on stdout; True when every run printed every row and memory stayed bounded."""
    index_mib = int(meta["index_bytes"]) / 2**20
    shown = " ".join(str(c) for c in results[-1]["cmd"][:2])
    print(f"command: `python -m bench query_load {' '.join(sys.argv[1:])}`".rstrip())
    print()
    print(
        f"bundle: {args.n:,} x {args.dim} ({meta['factory']}, {meta['search_params']}), "
        f"{bundle_bytes / 2**20:,.0f} MiB on disk (index.faiss {index_mib:,.0f} MiB, "
        f"memory-mapped); k = {args.k}; each run is `{shown} - --index {bundle} --k {args.k} "
        f"--format F --device cpu < paths.txt > out`; {os.cpu_count()} CPUs"
    )
    print()
    header = "output,queries,wall s,CPU s,queries/s,first row s,streaming q/s,peak RSS MiB"
    header += ",peak anon MiB,anon 1st half MiB,peak file MiB,rows,rows ok"
    markdown(header.split(","), [run_row(r, args.k) for r in results])
    ok = all(rows_ok(r, args.k) for r in results)
    ratios = []
    for v in variants(args):
        small, big = (r for r in results if r["variant"] == v)
        row, anon, grown = ratio_row(small, big)
        ratios.append(row)
        # Bounded: the heap does not grow with the queries (a quarter allowed for allocator
        # noise); all else a bigger run may add is pages of the mapped index, at most its size.
        ok &= anon <= 1.25 and grown <= index_mib
    small_q, big_q = f"{args.baseline_queries:,}", f"{args.queries:,}"
    markdown(
        [
            "output",
            f"peak RSS {big_q} / {small_q}",
            "peak anon ratio",
            "RSS MiB added",
            "marg. q/s",
        ],
        ratios,
    )
    print(
        "peak RSS = the process's VmHWM (not ru_maxrss, see the docstring); anon/file = "
        f"RssAnon/RssFile; all sampled every {POLL_S * 1e3:.0f} ms (file pages are the "
        "mapped index and the libraries, shared page cache); 'anon 1st half' = peak "
        "RssAnon while stdout was under half its final size; streaming q/s = queries "
        "answered after the first row appeared, per second; marg. q/s = extra queries / "
        "extra seconds between the two sizes (start-up and bundle loading cancel out)"
    )
    print(
        f"target: every row printed, peak anon memory not growing with the queries and peak "
        f"RSS growing by at most index.faiss ({index_mib:,.0f} MiB): {'met' if ok else 'NOT met'}"
    )
    return ok


def report_stages(stages: dict[str, float], q: int) -> None:
    rows = [
        [name, f"{value:,.0f} MiB RSS", ""]
        if name.endswith("MiB")
        else [name, f"{value:.2f}", f"{1e3 * value / q:.3f}"]
        for name, value in stages.items()
    ]
    print()
    markdown([f"step (in-process, {q:,} queries)", "seconds", "ms/query"], rows)


if __name__ == "__main__":
    raise SystemExit(main())
