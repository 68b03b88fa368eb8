"""`pactl serve` while slow clients hold sockets open: the latency of normal queries.

Target (docs/benchmarks.md): with 500 slowloris sockets open (each sends a request line and
then one header byte every --drip seconds, never finishing its headers, and connects again
when the service closes it), normal queries keep their p99 under 1 s, and none fails (a 503
counts as failed, however fast).

Setup is bench/bench_query_load.py's, cached in --workdir: a real checkpoint (the untrained
'small' CNN, 16 px, 64-d), --n unit vectors around that model's own embeddings in the default
index, and seeded 16x16 PNG query images. Everything is on 127.0.0.1 and bounded: --slow
sockets, --queries queries per phase, --deadline seconds per phase.

Measured, on one `pactl serve BUNDLE` process (this checkout's code: `python -m pactl`):
  without   one client on a keep-alive connection posts --queries images (multipart, k=4)
            one after another: per-request latency p50 / p99.
  with      the same, once --slow slowloris sockets are open; meanwhile the sockets open at
            each query (least and mean) and how many the service closed (its header deadline).
The ratio is with / without, for p50 and p99.

Run from the repository root:
  python -m bench slowloris                 # 20,000 items, 500 slow sockets, 400 queries
  python -m bench slowloris --quick         # 5,000 items, 500 slow sockets, 100 queries
"""

from __future__ import annotations

import argparse
import http.client
import json
import selectors
import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_query_load import ensure_bundle, make_checkpoint, write_queries
from bench.bench_serve import K, free_port, multipart, start_service
from pactl.console import Reporter, err

SLOW_START = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20_000, help="items in the bundle")
    parser.add_argument("--slow", type=int, default=500, help="slowloris sockets")
    parser.add_argument("--drip", type=float, default=2.0, help="seconds between their bytes")
    parser.add_argument("--queries", type=int, default=400, help="normal queries per phase")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds per phase")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pactl-bench-serve"))
    parser.add_argument("--quick", action="store_true", help="5,000 items, 100 queries")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.queries = 5_000, 100
    return args


class Slowloris(threading.Thread):
    """Keeps `count` sockets open, each dripping one header byte every `drip` seconds; one the
    service closes is opened again at once."""

    def __init__(self, port: int, count: int, drip: float) -> None:
        super().__init__(daemon=True)
        self.port, self.count, self.drip = port, count, drip
        self.selector = selectors.DefaultSelector()
        self.stop = threading.Event()
        self.closed_by_service = 0
        self.ready = threading.Event()

    def open_one(self) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        sock.sendall(SLOW_START)
        sock.setblocking(False)
        self.selector.register(sock, selectors.EVENT_READ)

    def drop(self, sock: socket.socket) -> None:
        self.selector.unregister(sock)
        sock.close()

    @property
    def open_now(self) -> int:
        return len(self.selector.get_map())

    def run(self) -> None:
        for _ in range(self.count):
            self.open_one()
        self.ready.set()
        next_drip = time.monotonic() + self.drip
        while not self.stop.is_set():
            for key, _ in self.selector.select(timeout=0.05):  # readable: closed (or answered)
                self.drop(key.fileobj)  # type: ignore[arg-type]
                self.closed_by_service += 1
            if time.monotonic() >= next_drip:
                for key in list(self.selector.get_map().values()):
                    try:
                        key.fileobj.send(b"x")  # type: ignore[union-attr]
                    except OSError:
                        self.drop(key.fileobj)  # type: ignore[arg-type]
                        self.closed_by_service += 1
                next_drip = time.monotonic() + self.drip
            while self.open_now < self.count and not self.stop.is_set():
                self.open_one()
        for key in list(self.selector.get_map().values()):
            self.drop(key.fileobj)  # type: ignore[arg-type]


def normal_queries(
    port: int, images: list[bytes], deadline: float, slow: Slowloris | None
) -> dict[str, Any]:
    """One client on one keep-alive connection: latency per query, failures, and the slow
    sockets open at each query."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    latencies, failures, open_counts = [], 0, []
    stop_at = time.monotonic() + deadline
    for data in images:
        if time.monotonic() > stop_at:
            break
        body, boundary = multipart(data)
        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        t0 = time.perf_counter()
        connection.request("POST", f"/query?k={K}", body=body, headers=headers)
        response = connection.getresponse()
        payload = response.read()
        latencies.append(time.perf_counter() - t0)
        if response.status != 200 or len(json.loads(payload)["results"][0]["hits"]) != K:
            failures += 1
        if slow is not None:
            open_counts.append(slow.open_now)
    connection.close()
    ms = np.array(latencies) * 1000
    return {
        "queries": len(latencies),
        "failures": failures,
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
        "open_least": min(open_counts, default=0),
        "open_mean": float(np.mean(open_counts)) if open_counts else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = Reporter(err)
    args.workdir.mkdir(parents=True, exist_ok=True)
    ckpt, payload = make_checkpoint(args.workdir, 64)
    bundle, _ = ensure_bundle(args.workdir, args.n, args.seed, ckpt, payload, log)
    paths = write_queries(args.workdir, 200, args.seed, log)
    images = [paths[i % len(paths)].read_bytes() for i in range(args.queries)]
    port = free_port()
    process = start_service(bundle, port)
    try:
        normal_queries(port, images[:16], args.deadline, None)  # warm-up
        log.log(f"without slow sockets: {args.queries} queries")
        without = normal_queries(port, images, args.deadline, None)
        slow = Slowloris(port, args.slow, args.drip)
        slow.start()
        slow.ready.wait(120)
        log.log(f"with {slow.open_now} slow sockets: {args.queries} queries")
        with_slow = normal_queries(port, images, args.deadline, slow)
        slow.stop.set()
        slow.join(30)
    finally:
        process.terminate()
        process.wait(30)
    report(args, without, with_slow, slow.closed_by_service)
    return 0


def report(
    args: argparse.Namespace, without: dict[str, Any], with_slow: dict[str, Any], closed: int
) -> None:
    print("| normal queries | queries | failed | p50 (ms) | p99 (ms) | slow sockets open |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for name, r, sockets in (
        ("without slow sockets", without, "0"),
        (
            f"with {args.slow} slow sockets",
            with_slow,
            f"least {with_slow['open_least']}, mean {with_slow['open_mean']:.0f}; "
            f"{closed:,} closed by the service",
        ),
    ):
        print(
            f"| {name} | {r['queries']:,} | {r['failures']} | {r['p50']:.1f} | {r['p99']:.1f} "
            f"| {sockets} |"
        )
    print()
    met = with_slow["p99"] < 1000 and with_slow["failures"] == 0
    print(
        f"with / without: p50 {with_slow['p50'] / without['p50']:.2f}x, "
        f"p99 {with_slow['p99'] / without['p99']:.2f}x; with slow sockets p99 "
        f"{with_slow['p99']:.0f} ms, {with_slow['failures']} failed (target: p99 < 1,000 ms and "
        f"none failed: {'met' if met else 'missed'})"
    )


if __name__ == "__main__":
    raise SystemExit(main())
