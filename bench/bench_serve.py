"""`pactl serve` under load on 127.0.0.1, against `pactl query` run as processes.

Targets (docs/benchmarks.md): with 8 concurrent clients sending --queries queries (one image
each, k=4) to a service over a --n item bundle, the service's p50 latency is at least 20x lower
than one `pactl query IMG` process per query, its throughput at least that of one
`pactl query -` process answering all of them, and its memory does not grow over the run.

Setup is bench/bench_query_load.py's, cached in --workdir: a real checkpoint (the untrained
'small' CNN, 16 px, --dim), --n unit vectors clustered around that model's own embeddings
indexed with the default index (IVF over 50,000 items), and seeded 16x16 PNG query images;
every query image is really decoded and embedded by the network, every search runs over the
whole bundle. Everything is bounded: --queries requests, --sample per-query processes, and
--deadline seconds for the service run (it stops early, and says so, past that).

Measured:
  service   `pactl serve BUNDLE --port P` (a free port on 127.0.0.1); 8 client threads on
            keep-alive connections post the query images (multipart); per-request latency,
            throughput = queries / wall time; the server's VmRSS from /proc at start (after
            a warm-up of 16 queries), at the middle and at the end, and its VmHWM.
  process   one `pactl query IMG --index BUNDLE --k 4 --format jsonl` per query, --sample of
            them one after another: their p50 wall time (each is a fresh process: imports,
            model and bundle load, one query).
  stdin     one `pactl query - --index BUNDLE --k 4 --format jsonl` for all --queries paths:
            throughput = queries / wall time.

Run from the repository root:
  python -m bench serve                 # 100,000 items, 2,000 queries, 8 clients
  python -m bench serve --quick         # 20,000 items, 400 queries
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_query_load import (
    _status_kb,
    ensure_bundle,
    make_checkpoint,
    pactl_command,
    write_queries,
)
from pactl.console import Reporter, err

K = 4
WARMUP = 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="items in the bundle")
    parser.add_argument("--dim", type=int, default=64, help="embedding size")
    parser.add_argument("--queries", type=int, default=2_000, help="requests to the service")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--distinct", type=int, default=200, help="distinct query images")
    parser.add_argument("--sample", type=int, default=30, help="one-process-per-query runs")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds for the service")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pactl-bench-serve"))
    parser.add_argument("--quick", action="store_true", help="20,000 items, 400 queries")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.queries, args.sample = 20_000, 400, 10
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kb(pid: int) -> tuple[int, int]:
    status = _status_kb(pid) or {}
    return status.get("VmRSS", 0), status.get("VmHWM", 0)


def start_service(bundle: Path, port: int) -> subprocess.Popen[bytes]:
    command = [*pactl_command(), "serve", str(bundle), "--port", str(port), "--quiet"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"pactl serve exited {process.returncode}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("pactl serve did not answer within 300 s")


def multipart(data: bytes) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="q.png"\r\n'
        "Content-Type: image/png\r\n\r\n"
    ).encode()
    return head + data + f"\r\n--{boundary}--\r\n".encode(), boundary


class Client(threading.Thread):
    """Posts its share of the queries on one keep-alive connection, timing each."""

    def __init__(self, port: int, images: list[bytes], stop_at: float) -> None:
        super().__init__(daemon=True)
        self.port, self.images, self.stop_at = port, images, stop_at
        self.latencies: list[float] = []
        self.failures = 0
        self.after: threading.Event | None = None

    def run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        for data in self.images:
            if time.monotonic() > self.stop_at:
                break
            body, boundary = multipart(data)
            headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
            t0 = time.perf_counter()
            connection.request("POST", f"/query?k={K}", body=body, headers=headers)
            response = connection.getresponse()
            payload = response.read()
            self.latencies.append(time.perf_counter() - t0)
            if response.status != 200 or len(json.loads(payload)["results"][0]["hits"]) != K:
                self.failures += 1
        connection.close()


def run_service(bundle: Path, queries: list[Path], clients: int, deadline: float) -> dict[str, Any]:
    port = free_port()
    process = start_service(bundle, port)
    try:
        data = [q.read_bytes() for q in queries]
        warm = Client(port, data[:WARMUP], time.monotonic() + deadline)
        warm.run()
        start_rss, _ = rss_kb(process.pid)
        stop_at = time.monotonic() + deadline
        workers = [Client(port, data[i::clients], stop_at) for i in range(clients)]
        middle: list[int] = []
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        while any(w.is_alive() for w in workers):
            done = sum(len(w.latencies) for w in workers)
            if not middle and done >= len(data) // 2:
                middle.append(rss_kb(process.pid)[0])
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        end_rss, hwm = rss_kb(process.pid)
    finally:
        process.terminate()
        process.wait(30)
    latencies = np.array([x for w in workers for x in w.latencies])
    return {
        "answered": len(latencies),
        "failures": sum(w.failures for w in workers),
        "wall_s": wall,
        "qps": len(latencies) / wall,
        "p50_ms": float(np.percentile(latencies, 50)) * 1000,
        "p99_ms": float(np.percentile(latencies, 99)) * 1000,
        "rss_mib": [start_rss / 1024, (middle or [0])[0] / 1024, end_rss / 1024],
        "hwm_mib": hwm / 1024,
        "stopped_early": len(latencies) < len(data),
    }


def run_processes(bundle: Path, queries: list[Path], sample: int) -> dict[str, Any]:
    walls = []
    for query in queries[:sample]:
        command = [*pactl_command(), "query", str(query), "--index", str(bundle)]
        t0 = time.perf_counter()
        subprocess.run(
            [*command, "--k", str(K), "--format", "jsonl", "--quiet"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        walls.append(time.perf_counter() - t0)
    return {"p50_ms": float(np.median(walls)) * 1000, "qps": len(walls) / sum(walls)}


def run_stdin(bundle: Path, queries: list[Path]) -> dict[str, Any]:
    command = [*pactl_command(), "query", "-", "--index", str(bundle), "--k", str(K)]
    paths = "".join(f"{q}\n" for q in queries).encode()
    t0 = time.perf_counter()
    done = subprocess.run(
        [*command, "--format", "jsonl", "--quiet"], input=paths, check=True, capture_output=True
    )
    wall = time.perf_counter() - t0
    rows = done.stdout.count(b"\n")
    if rows != len(queries) * K:
        raise SystemExit(f"pactl query - printed {rows} rows, not {len(queries) * K}")
    return {"wall_s": wall, "qps": len(queries) / wall}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = Reporter(err)
    args.workdir.mkdir(parents=True, exist_ok=True)
    ckpt, payload = make_checkpoint(args.workdir, args.dim)
    bundle, meta = ensure_bundle(args.workdir, args.n, args.seed, ckpt, payload, log)
    distinct = write_queries(args.workdir, args.distinct, args.seed, log)
    queries = [distinct[i % len(distinct)] for i in range(args.queries)]
    log.log(f"service: {args.clients} clients, {args.queries:,} queries, {meta['factory']}")
    service = run_service(bundle, queries, args.clients, args.deadline)
    log.log(f"one process per query: {args.sample} of them")
    process = run_processes(bundle, distinct, args.sample)
    log.log(f"one `pactl query -` for {args.queries:,} queries")
    stdin = run_stdin(bundle, queries)
    report(args, meta, service, process, stdin)
    met = (
        process["p50_ms"] / service["p50_ms"] >= 20
        and service["qps"] >= stdin["qps"]
        and service["rss_mib"][2] <= service["rss_mib"][1] * 1.05
        and not service["failures"]
    )
    return 0 if met else 1


def report(
    args: argparse.Namespace,
    meta: dict[str, Any],
    service: dict[str, Any],
    process: dict[str, Any],
    stdin: dict[str, Any],
) -> None:
    start, middle, end = service["rss_mib"]
    print(f"bundle: {args.n:,} x {args.dim} ({meta['factory']}), k={K}, CPUs: {os.cpu_count()}")
    print("| way | queries | throughput (q/s) | p50 (ms) | p99 (ms) | memory |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    print(
        f"| pactl serve, {args.clients} clients | {service['answered']:,} | "
        f"{service['qps']:.1f} | {service['p50_ms']:.1f} | {service['p99_ms']:.1f} | "
        f"RSS {start:.0f} / {middle:.0f} / {end:.0f} MiB (start/middle/end), "
        f"peak {service['hwm_mib']:.0f} MiB |"
    )
    print(
        f"| pactl query IMG per query | {args.sample} | {process['qps']:.2f} | "
        f"{process['p50_ms']:.0f} | | |"
    )
    print(f"| pactl query - | {args.queries:,} | {stdin['qps']:.1f} | | | |")
    print(f"p50: process per query / service = {process['p50_ms'] / service['p50_ms']:.0f}x")
    print(f"throughput: service / pactl query - = {service['qps'] / stdin['qps']:.2f}x")
    print(f"memory: end / middle = {end / middle if middle else float('nan'):.3f}")
    if service["failures"] or service["stopped_early"]:
        print(f"failures: {service['failures']}, stopped early: {service['stopped_early']}")


if __name__ == "__main__":
    sys.exit(main())
