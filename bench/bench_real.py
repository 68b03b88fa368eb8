"""Real images: does pactl's fine-tuning beat an ImageNet-pretrained start?

Two offline retrieval sets (bench/real_sets.py) and EfficientNet-Lite0 ImageNet weights converted
for timm (bench/lite0_weights.py), all under --root:

    python bench/real_sets.py fonts /tmp/pactl-real/fonts
    python bench/real_sets.py fashion /tmp/pactl-real/fashion
    python bench/lite0_weights.py /tmp/pactl-real/lite0.pth
    python -m bench real                         # both sets, steps a-f, 8 epochs
    python -m bench real --quick                 # ~160 images, 2 epochs: a smoke test
    python -m bench real --sets fonts --only a,b,c --epochs 12

Each set is scored on its test classes (disjoint from the train classes) at one image size:

  a. raw pixels: test images resized to --image-size, flattened, L2-normalised;
  b. pretrained, no training: `pactl eval SET --backbone timm:efficientnet_lite0 --weights W`
     (the backbone's pooled features);
  c. pactl fine-tuned from W: `pactl train` with --epochs/--batch-size/--lr, no validation
     classes; the last epoch's test metrics (no choice made on the test split), and epoch 0,
     the evaluation before the first step;
  d. the same from scratch (--weights none);
  e. the same command with pytorch-metric-learning's ProxyAnchorLoss(margin 0.1, alpha 32) in
     place of pactl's loss (this script re-run as `--pml-train -- TRAIN-ARGS`, which swaps the
     loss registry's proxy_anchor entry and runs pactl's CLI: same optimizer groups, proxies at
     lr x 100, same sampling, seeds and evaluation);
  f. pactl's default recipe for a user's folder on this machine: `pactl train SET --weights W`
     and nothing else, then `pactl eval SET --checkpoint runs/NAME/best.pt`; its seconds are
     the training's wall clock.

Targets, per set: c >= b + 0.05 Recall@1; d > a; c >= e; f > b within 900 s. Runs go to a
scratch folder (--work, default ROOT/work) through PACTL_RUNS and PACTL_HOME. The markdown table
and the commands go to stdout, progress to stderr. Exit 1 when a step fails (its last error
line is in the table), 2 when an input is missing.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]

BACKBONE = "timm:efficientnet_lite0"
STEPS = "abcdef"
SETS = ("fonts", "fashion")
FINETUNE_GAIN = 0.05  # c must beat b by this much Recall@1
DEFAULT_BUDGET_S = 900.0  # f must finish within this
PML_MARK = "pml-train: pytorch-metric-learning ProxyAnchorLoss"
QUICK_CLASSES, QUICK_IMAGES = 8, 160  # per split in --quick: f's batch (64) must fit after
# its validation classes are held out
# --quick trains 2 epochs: the first is the warm-up (head and proxies only), the second moves
# the backbone too.
QUICK_EPOCHS, QUICK_BATCH = 2, 16


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Result:
    set_name: str
    step: str  # a..f
    label: str
    recall: float | None = None
    map_r: float | None = None
    seconds: float | None = None
    note: str = ""
    commands: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.recall is not None


# ---------------------------------------------------------------- a. raw pixels


def raw_pixel_vectors(paths: Sequence[Path], size: int) -> np.ndarray:
    """(N, size * size * 3) float32: each image as RGB, resized (bilinear), flattened, unit norm."""
    rows = np.empty((len(paths), size * size * 3), dtype=np.float32)
    for i, path in enumerate(paths):
        with Image.open(path) as image:
            rgb = image.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
        rows[i] = np.asarray(rgb, dtype=np.float32).reshape(-1)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1e-12)


def split_rows(set_dir: Path, split: str) -> tuple[list[Path], np.ndarray]:
    """A split's image paths and labels (its class names mapped to 0..C-1)."""
    with open(set_dir / "manifest.csv", newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["split"] == split]
    names = sorted({r.get("class_name") or r["label"] for r in rows})
    index = {n: i for i, n in enumerate(names)}
    labels = np.array([index[r.get("class_name") or r["label"]] for r in rows], dtype=np.int64)
    return [set_dir / r["path"] for r in rows], labels


def raw_pixel_scores(set_dir: Path, size: int) -> dict[str, float]:
    from pactl.metrics import score_vectors

    paths, labels = split_rows(set_dir, "test")
    return score_vectors(raw_pixel_vectors(paths, size), labels, ks=(1,))


# ---------------------------------------------------------------- running pactl


@dataclass(frozen=True)
class Env:
    work: Path  # scratch folder: runs/, home/, reports
    weights: Path  # converted lite0 state_dict
    size: int
    epochs: int
    batch_size: int
    lr: float
    quick: bool

    @property
    def runs(self) -> Path:
        return self.work / "runs"


def pactl_argv() -> list[str]:
    script = Path(sys.executable).parent / "pactl"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "pactl"]


def shown(argv: Sequence[str], env: Env) -> str:
    """The command as a shell line: PACTL_RUNS set, the pactl script shown as `pactl`."""
    words = list(argv)
    if words[0].endswith("/pactl"):
        words[0] = "pactl"
    elif words[0] == sys.executable:
        words[0] = "python"
    return f"PACTL_RUNS={shlex.quote(str(env.runs))} {shlex.join(words)}"


def run(argv: Sequence[str], env: Env) -> tuple[int, str, float]:
    """Run a command with the scratch PACTL_RUNS/PACTL_HOME: (exit code, stderr, seconds)."""
    log(f"$ {shown(argv, env)}")
    environ = {**os.environ, "PACTL_RUNS": str(env.runs), "PACTL_HOME": str(env.work / "home")}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH")]))
    start = time.perf_counter()
    done = subprocess.run(argv, env=environ, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        log((done.stdout + done.stderr).strip()[-2000:])
    return done.returncode, done.stderr, seconds


def last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1][:160] if lines else "no message"


def read_report(path: Path) -> dict[str, float]:
    """`pactl eval --report` CSV: a header row and a value row, dataset and checkpoint first.

    The metrics are read from the right, so a comma in an unquoted dataset or model
    description cannot shift them.
    """
    with open(path, newline="", encoding="utf-8") as f:
        header, values = list(csv.reader(f))[:2]
    names = header[2:]
    if len(values) != len(header):
        log(f"{path}: {len(values)} values under {len(header)} columns (an unquoted comma)")
    return {k: float(v) for k, v in zip(names, values[len(values) - len(names) :], strict=True)}


def read_metrics(path: Path) -> list[dict[str, float]]:
    """metrics.csv rows as floats (empty cells, epochs without evaluation, as NaN)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [{k: float(v) if v else float("nan") for k, v in r.items()} for r in rows]


def train_args(set_dir: Path, env: Env, weights: str, name: str) -> list[str]:
    """The recipe shared by c, d and e."""
    return [
        "train", str(set_dir), "--backbone", BACKBONE, "--weights", weights,
        "--image-size", str(env.size), "--resize-size", str(env.size),
        "--epochs", str(env.epochs), "--batch-size", str(env.batch_size), "--lr", str(env.lr),
        "--val-classes", "0", "--workers", "0", "--name", name, "--overwrite", "--quiet",
    ]  # fmt: skip


# ---------------------------------------------------------------- the steps


def step_pretrained(
    set_name: str, set_dir: Path, env: Env, step: str = "b", size: int = 0, resize: int = 0
) -> Result:
    """b (and f0): the pretrained network's pooled features, no training, at `size` px (default:
    the bench's image size)."""
    size, resize = size or env.size, resize or env.size
    what = "no training (pooled features)" if step == "b" else f"at the default's {size} px"
    result = Result(set_name, step, f"pretrained lite0, {what}")
    report = env.work / f"{set_name}-pretrained-{size}.csv"
    argv = [
        *pactl_argv(), "eval", str(set_dir), "--backbone", BACKBONE, "--weights", str(env.weights),
        "--image-size", str(size), "--resize-size", str(resize),
        "--report", str(report), "--workers", "0", "--quiet",
    ]  # fmt: skip
    result.commands.append(shown(argv, env))
    code, stderr, result.seconds = run(argv, env)
    if code != 0:
        result.note = f"failed: {last_error(stderr)}"
        return result
    scores = read_report(report)
    result.recall, result.map_r = scores["recall@1"], scores["map@r"]
    return result


def step_train(
    set_name: str, set_dir: Path, env: Env, step: str, weights: str, pml: bool
) -> list[Result]:
    """c, d or e: train, then the last epoch's test metrics (and epoch 0's for c and d)."""
    labels = {
        "c": "pactl fine-tuned from lite0",
        "d": "pactl from scratch",
        "e": "pytorch-metric-learning ProxyAnchorLoss, same loop",
    }
    name = f"{set_name}-{step}"
    args = train_args(set_dir, env, weights, name)
    if pml:
        argv = [sys.executable, "-m", "bench.bench_real", "--pml-train", "--", *args]
    else:
        argv = [*pactl_argv(), *args]
    last = Result(set_name, step, f"{labels[step]}, epoch {env.epochs}")
    last.commands.append(shown(argv, env))
    code, stderr, last.seconds = run(argv, env)
    if code == 0 and pml and PML_MARK not in stderr:
        code, stderr = 1, "the loss swap did not happen"
    if code != 0:
        last.note = f"failed: {last_error(stderr)}"
        return [last]
    rows = read_metrics(env.runs / name / "metrics.csv")
    last.recall, last.map_r = rows[-1]["recall@1"], rows[-1]["map@r"]
    if step == "e":
        return [last]
    start = Result(set_name, step, f"{labels[step]}, epoch 0 (before training)")
    start.recall, start.map_r = rows[0]["recall@1"], rows[0]["map@r"]
    start.note = f"epoch {int(rows[0]['epoch'])} row of metrics.csv"
    return [start, last]


def step_default(set_name: str, set_dir: Path, env: Env) -> list[Result]:
    """f: the CPU default recipe (best.pt on the test classes), and f0: its start, the
    pretrained network's pooled features at the recipe's image size."""
    result = Result(set_name, "f", "pactl CPU default recipe from lite0 (best.pt)")
    name = f"{set_name}-f"
    argv = [*pactl_argv(), "train", str(set_dir), "--weights", str(env.weights)]
    if env.quick:  # the recipe's epochs take minutes; a smoke test needs two
        argv += ["--epochs", str(QUICK_EPOCHS)]
    argv += ["--name", name, "--overwrite", "--quiet"]
    result.commands.append(shown(argv, env))
    code, stderr, result.seconds = run(argv, env)
    if code != 0:
        result.note = f"failed: {last_error(stderr)}"
        return [result]
    report = env.work / f"{set_name}-default.csv"
    best = env.runs / name / "best.pt"
    argv = [*pactl_argv(), "eval", str(set_dir), "--checkpoint", str(best)]
    argv += ["--report", str(report), "--workers", "0", "--quiet"]
    result.commands.append(shown(argv, env))
    code, stderr, _ = run(argv, env)
    if code != 0:
        result.note = f"eval failed: {last_error(stderr)}"
        return [result]
    scores = read_report(report)
    result.recall, result.map_r = scores["recall@1"], scores["map@r"]
    result.note = "seconds: training only" + (" (--quick: fewer epochs)" if env.quick else "")
    # Its start at its own image size: the pretrained network's pooled features there.
    model = json.loads((env.runs / name / "config.json").read_text())["model_config"]
    start = step_pretrained(set_name, set_dir, env, "f0", model["image_size"], model["resize_size"])
    return [result, start]


def step_raw(set_name: str, set_dir: Path, env: Env) -> Result:
    result = Result(set_name, "a", f"raw pixels at {env.size} px, L2-normalised")
    result.commands.append(
        f"python -m bench real --sets {set_name} --only a --image-size {env.size}"
    )
    start = time.perf_counter()
    scores = raw_pixel_scores(set_dir, env.size)
    result.seconds = time.perf_counter() - start
    result.recall, result.map_r = scores["recall@1"], scores["map@r"]
    return result


def run_set(set_name: str, set_dir: Path, env: Env, only: str) -> list[Result]:
    results: list[Result] = []
    for step in only:
        log(f"[{set_name}] step {step}")
        if step == "a":
            results.append(step_raw(set_name, set_dir, env))
        elif step == "b":
            results.append(step_pretrained(set_name, set_dir, env))
        elif step in "cde":
            weights = "none" if step == "d" else str(env.weights)
            results += step_train(set_name, set_dir, env, step, weights, pml=step == "e")
        else:
            results += step_default(set_name, set_dir, env)
    return results


# ---------------------------------------------------------------- --quick subsets


def quick_subset(set_dir: Path, out: Path, classes: int, images: int, seed: int) -> Path:
    """A copy of up to `classes` seeded classes of each split, about `images` images per split
    (the first of each class in manifest order), with its own manifest."""
    from pactl.datasets.manifest import write_manifest

    with open(set_dir / "manifest.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    rng = random.Random(seed)
    keep: list[tuple[str, int, str, str]] = []
    for split in ("train", "test"):
        names = sorted({r["class_name"] for r in rows if r["split"] == split})
        chosen = sorted(rng.sample(names, min(classes, len(names))))
        per_class = -(-images // max(len(chosen), 1))
        for name in chosen:
            members = [r for r in rows if r["class_name"] == name][:per_class]
            keep += [(r["path"], int(r["label"]), split, name) for r in members]
    if out.exists():
        shutil.rmtree(out)
    for rel, *_ in keep:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(set_dir / rel, out / rel)
    write_manifest(out / "manifest.csv", keep)
    return out


# ---------------------------------------------------------------- report


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def table(results: Sequence[Result], header: str) -> str:
    lines = [
        header,
        "",
        "| set | step | Recall@1 | MAP@R | seconds | note |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        seconds = "-" if r.seconds is None else f"{r.seconds:.0f}"
        lines.append(
            f"| {r.set_name} | {r.step}. {r.label} | {fmt(r.recall)} | {fmt(r.map_r)} | "
            f"{seconds} | {r.note} |"
        )
    return "\n".join(lines)


def pick(results: Sequence[Result], set_name: str, step: str) -> Result | None:
    """The step's final row (for c and d, the last epoch's, listed after epoch 0)."""
    rows = [r for r in results if r.set_name == set_name and r.step == step and r.ok]
    return rows[-1] if rows else None


def targets(results: Sequence[Result], set_name: str, budget: float, quick: bool) -> list[str]:
    """One line per target: the two figures and met / MISSED / not measured."""
    a, b, c, d, e, f = (pick(results, set_name, s) for s in STEPS)
    f0 = pick(results, set_name, "f0")

    def line(text: str, left: Result | None, right: Result | None, met: bool) -> str:
        if left is None or right is None or left.recall is None or right.recall is None:
            verdict = "not measured"
        elif quick:
            verdict = "not judged (--quick)"
        else:
            verdict = "met" if met else "MISSED"
        return f"- {set_name}: {text}: {verdict}"

    def r1(x: Result | None) -> float:
        return x.recall if x is not None and x.recall is not None else float("nan")

    f_seconds = f.seconds if f is not None and f.seconds is not None else float("inf")
    return [
        line(f"fine-tuned {r1(c):.4f} >= pretrained {r1(b):.4f} + {FINETUNE_GAIN}", c, b,
             r1(c) >= r1(b) + FINETUNE_GAIN),
        line(f"scratch {r1(d):.4f} > raw pixels {r1(a):.4f}", d, a, r1(d) > r1(a)),
        line(f"pactl {r1(c):.4f} >= pytorch-metric-learning {r1(e):.4f}", c, e, r1(c) >= r1(e)),
        line(f"CPU default {r1(f):.4f} > pretrained at its size {r1(f0):.4f} within "
             f"{budget:.0f} s ({f_seconds:.0f} s)", f, f0, r1(f) > r1(f0) and f_seconds <= budget),
    ]  # fmt: skip


# ---------------------------------------------------------------- --pml-train


def pml_train(args: Sequence[str]) -> None:
    """pactl's CLI with pytorch-metric-learning's ProxyAnchorLoss as the proxy_anchor loss."""
    from pytorch_metric_learning.losses import ProxyAnchorLoss
    from torch import Tensor, nn

    import pactl.losses
    from pactl.cli import main as pactl_main

    class PmlProxyAnchor(nn.Module):
        def __init__(self, num_classes: int, dim: int, alpha: float, delta: float) -> None:
            super().__init__()
            self.loss = ProxyAnchorLoss(num_classes, dim, margin=delta, alpha=alpha)
            log(f"{PML_MARK}({num_classes}, {dim}, margin={delta}, alpha={alpha})")

        def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
            return self.loss(embeddings, labels)

    pactl.losses.LOSSES["proxy_anchor"] = PmlProxyAnchor
    sys.argv = ["pactl", *args]
    pactl_main()


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/tmp/pactl-real"),
                        help="folder holding fonts/, fashion/ and lite0.pth")  # fmt: skip
    parser.add_argument("--weights", type=Path, default=None, help="default: ROOT/lite0.pth")
    parser.add_argument("--work", type=Path, default=None, help="scratch (default: ROOT/work)")
    parser.add_argument("--sets", default=",".join(SETS), help="comma-separated: fonts,fashion")
    parser.add_argument("--only", default=",".join(STEPS), help="steps to run, e.g. a,b,c")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds for f")
    parser.add_argument("--quick", action="store_true", help="a few images, 2 epochs")
    parser.add_argument("--seed", type=int, default=0, help="seeds the --quick subsets")
    parser.add_argument("--pml-train", action="store_true", help="internal: see step e")
    parser.add_argument("train_args", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.train_args and not args.pml_train:
        parser.error(f"unexpected arguments: {' '.join(args.train_args)}")
    return args


def choose(text: str, allowed: Sequence[str], what: str) -> list[str]:
    chosen = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in chosen if x not in allowed]
    if unknown or not chosen:
        raise SystemExit(f"--{what}: choose from {','.join(allowed)} (got {text!r})")
    return chosen


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.pml_train:
        pml_train(args.train_args)
        return 0
    sets = choose(args.sets, SETS, "sets")
    only = "".join(choose(args.only, list(STEPS), "only"))
    weights = (args.weights or args.root / "lite0.pth").resolve()
    missing = [p for p in [weights, *(args.root / s / "manifest.csv" for s in sets)]
               if not p.is_file() and (p != weights or set(only) & set("bcef"))]  # fmt: skip
    if missing:
        log(f"missing {', '.join(map(str, missing))}; build them first (see the docstring)")
        return 2
    epochs, batch = (QUICK_EPOCHS, QUICK_BATCH) if args.quick else (args.epochs, args.batch_size)
    work = (args.work or args.root / "work").resolve()
    env = Env(work, weights, args.image_size, epochs, batch, args.lr, args.quick)
    results: list[Result] = []
    for name in sets:
        set_dir = (args.root / name).resolve()
        if args.quick:
            set_dir = quick_subset(set_dir, work / f"quick-{name}", QUICK_CLASSES,
                                   QUICK_IMAGES, args.seed)  # fmt: skip
        results += run_set(name, set_dir, env, only)
    header = (
        f"Test-class retrieval at {args.image_size} px, {BACKBONE} ImageNet weights from "
        f"{weights.name}; training: {epochs} epochs, batch {batch}, lr {args.lr}"
        + (" (--quick: a few images per set)" if args.quick else "")
    )
    print(table(results, header))
    print()
    for name in sets:
        print("\n".join(targets(results, name, args.budget, args.quick)))
    print("\nCommands:\n")
    for r in results:
        for command in r.commands:
            print(f"    # {r.set_name} {r.step}\n    {command}")
    return 1 if any(not r.ok for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
