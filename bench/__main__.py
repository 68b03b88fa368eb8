"""`python -m bench`: the benchmarks, listed; `python -m bench NAME [--quick] [ARGS...]` runs one
from the repository root and records its result under bench/results/.

NAME's own options follow it (`python -m bench index --n 300000`; `python -m bench NAME --help`
lists them). `--quick` runs it at the small sizes its entry below names, to check that it works
(minutes, not hours, on 2 CPU cores); benchmarks that need data made outside pactl say which.
The result, bench/results/NAME.json (NAME.quick.json for --quick), holds the machine, the git
commit, the parameters and the figures: every markdown table the benchmark printed to stdout,
and its other result lines.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from bench import harness

REAL = "the real sets of tools/real_sets.py (make bench-real makes them)"


@dataclass(frozen=True)
class Bench:
    module: str  # under bench/
    what: str
    quick: tuple[str, ...] | None  # the options of --quick; None: no quick mode
    needs: str = ""  # what it needs beyond pactl's `bench` extra


BENCHES = {
    "loss": Bench("bench_loss", "Proxy-Anchor loss at SOP scale against pytorch-metric-learning",
                  ("--quick",)),
    "train_step": Bench("bench_train_step", "a training step against the official loop's",
                        ("--quick",)),
    "eval": Bench("bench_eval", "evaluation at SOP scale against the official recall loop",
                  ("--quick",)),
    "index": Bench("bench_index", "the default index against exact search, 1,000,000 x 512",
                   ("--quick",)),
    "coarse": Bench("bench_coarse", "two-level k-means against one level for an IVF's lists",
                    ("--quick",)),
    "autofaiss": Bench("bench_autofaiss", "pactl index against autofaiss",
                       ("--n", "20000", "--dim", "64", "--queries", "100"),
                       "autofaiss in its own virtualenv (--autofaiss-python)"),
    "ondisk": Bench("bench_ondisk", "on-disk merging of shards: memory", ("--quick",)),
    "binary": Bench("bench_binary", "binary codes against float and product quantisation",
                    ("--quick",)),
    "codes": Bench("bench_codes", "learned binary codes against rotated float codes",
                   ("--quick",)),
    "tombstones": Bench("bench_tombstones", "search past deleted items against an ID selector",
                        ("--n", "20000", "--queries", "200")),
    "items": Bench("bench_items", "opening a bundle: items.bin against items.csv",
                   ("--n", "20000", "--repeat", "2")),
    "checksums": Bench("bench_checksums", "a bundle's content checksums: what they cost",
                       ("--n", "20000", "--repeat", "3")),
    "dedup": Bench("bench_dedup", "same-item groups over 1,000,000 x 512 vectors",
                   ("--n", "20000", "--groups", "400", "--sample", "200",
                    "--work", "/tmp/pactl-bench-dedup-quick")),
    "embed": Bench("bench_embed", "embedding photo-sized JPEGs against a plain torchvision loop",
                   ("--quick",)),
    "decode": Bench("bench_decode", "JPEG draft decoding", ("--image-size", "64"),
                    "scikit-image's sample photos"),
    "onnx": Bench("bench_onnx", "ONNX Runtime against pactl's CPU fast path",
                  ("--images", "32", "--batch", "16"), "onnxruntime"),
    "resume": Bench("bench_resume", "resumable embed: what committing progress costs",
                    ("--quick",)),
    "recipe": Bench("bench_recipe", "the CPU recipe: a training step per backbone and size",
                    ("--backbones", "resnet18", "--sizes", "64", "--rounds", "1")),
    "help": Bench("bench_help", "pactl --help start-up time", ("--runs", "3")),
    "query_load": Bench("bench_query_load", "query load: one process per query against one for all",
                        ("--quick",)),
    "serve": Bench("bench_serve", "pactl serve under load", ("--quick",)),
    "slowloris": Bench("bench_slowloris", "pactl serve with slowloris sockets open", ("--quick",)),
    "sweep": Bench("bench_sweep", "a sweep point's overhead outside training", None, REAL),
    "real": Bench("bench_real", "learning on real images, each way", ("--quick",), REAL),
    "audit": Bench("bench_audit", "noisy labels and copies: audit beside cleanlab", None, REAL),
    "audit_quality": Bench("bench_audit_quality", "planted wrong labels over seeds and noises, "
                           "beside cleanlab", ("--sets", "fonts28", "--seeds", "0", "--once", "",
                           "--epochs", "1", "--work", "/tmp/pactl-quality-quick"), REAL),
    "noise": Bench("bench_noise", "the noisy-label study's tables from its runs", None,
                   "the runs of the noisy-label study"),
    "wallpapers": Bench("bench_wallpapers", "same-item groups on Debian's wallpapers copied", None,
                        "Debian's wallpaper packages"),
}  # fmt: skip


def listing() -> str:
    lines = ["python -m bench NAME [--quick] [ARGS...]   (results: bench/results/NAME.json)", ""]
    for name, bench in BENCHES.items():
        quick = "--quick" if bench.quick is not None else "       "
        needs = f"  [needs {bench.needs}]" if bench.needs else ""
        lines.append(f"  {name:<13} {quick}  {bench.what}{needs}")
    return "\n".join(lines)


class Tee(io.TextIOBase):
    """Writes go to `out` and are kept: the benchmark's results, printed as they come."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.kept = out, io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


def figures(printed: str) -> dict[str, Any]:
    tables = harness.markdown_tables(printed)
    lines = [line.rstrip() for line in printed.splitlines() if line.strip()]
    return {
        "tables": tables,
        "lines": [line for line in lines if not line.lstrip().startswith("|")],
    }


def params(module: Any, argv: list[str]) -> dict[str, Any]:
    """The options as given, and every option's value where the module parses them in one place."""
    got: dict[str, Any] = {"argv": argv}
    parse = getattr(module, "parse_args", None)
    if callable(parse):
        with contextlib.suppress(Exception, SystemExit):
            got["options"] = {k: v for k, v in vars(parse(argv)).items() if not callable(v)}
    return got


def run(name: str, argv: list[str], quick: bool, folder: Path) -> int:
    bench = BENCHES[name]
    if quick:
        if bench.quick is None:
            print(f"error: {name} has no --quick mode (it needs {bench.needs})", file=sys.stderr)
            return 2
        argv = [*bench.quick, *argv]
    module = importlib.import_module(f"bench.{bench.module}")
    tee = Tee(sys.stdout)
    started = time.perf_counter()
    saved_argv, sys.argv = sys.argv, [f"bench {name}", *argv]  # the commands it prints quote these
    with contextlib.redirect_stdout(tee):  # type: ignore[type-var]
        try:
            code = module.main(argv) or 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            if isinstance(stop.code, str):
                print(stop.code, file=sys.stderr)
        finally:
            sys.argv = saved_argv
    if code != 0 or "--help" in argv or "-h" in argv:
        return int(code)
    command = " ".join(["python -m bench", name, *(["--quick"] if quick else []), *argv[
        len(bench.quick or ()) if quick else 0 :]])  # fmt: skip
    record = harness.result(name, command=command, params=params(module, argv),
                            figures=figures(tee.kept.getvalue()), quick=quick)  # fmt: skip
    record["seconds"] = round(time.perf_counter() - started, 1)
    path = harness.write_result(record, folder)
    print(f"result: {path}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0],
                                     add_help=False)  # fmt: skip
    parser.add_argument("name", nargs="?", choices=list(BENCHES), metavar="NAME")
    parser.add_argument("--quick", action="store_true", help="the small sizes, to check it works")
    parser.add_argument("--results", type=Path, default=harness.RESULTS, help="where results go")
    args, rest = parser.parse_known_args(argv)
    if args.name is None:
        print(listing())
        return 0
    return run(args.name, rest, args.quick, args.results)


if __name__ == "__main__":
    raise SystemExit(main())
