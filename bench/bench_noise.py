"""The label-noise study's tables: each loss's Recall@1 and MAP@R at each noise setting over its
seeds, the share of its clean score it keeps, and what --drop-noisy recovers.

    python -m bench noise runs/noise-fonts28 [runs/robust-fonts28 ...]

Reads the run folders of `pactl sweep` (points/<point>-s<seed>/: config.json for the loss, the
noise and --drop-noisy; metrics.csv's last row for the test metrics: the study trains with
`selection=last`). For every (loss, noise, drop) it prints mean ± sample std over the seeds; the
ratio to the same loss's clean score is taken seed by seed (seed s noisy over seed s clean: the
same initialisation) and averaged. Then, for each noise setting, Proxy-Anchor's kept share
against every other loss's (difference and Welch's t over the seeds' ratios), and the share of the
Recall@1 the noise cost Proxy-Anchor that --drop-noisy wins back, (dropped - noisy) / (clean -
noisy), per seed. Markdown on stdout.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

Key = tuple[str, str, float]  # loss, label noise, drop share
METRICS = ("recall@1", "map@r")
NAMES = {
    "proxy_anchor": "Proxy-Anchor",
    "proxy_nca": "Proxy-NCA",
    "multi_similarity": "Multi-Similarity",
    "contrastive": "contrastive",
    "triplet": "triplet",
}


def noise_words(text: str) -> str:
    rate, _, kind = text.partition(":")
    if float(rate) == 0:
        return "clean"
    return f"{float(rate):.0%} {kind or 'symmetric'}".replace("_", " ")


def read_points(folders: list[Path]) -> dict[Key, dict[int, dict[str, float]]]:
    """(loss, noise, drop) -> seed -> the last epoch's test metrics."""
    found: dict[Key, dict[int, dict[str, float]]] = defaultdict(dict)
    for folder in folders:
        for run in sorted((folder / "points").glob("*-s*")):
            try:
                train = json.loads((run / "config.json").read_text())["train_config"]
                with open(run / "metrics.csv", newline="") as f:
                    last = list(csv.DictReader(f))[-1]
            except (OSError, KeyError, IndexError, ValueError):
                continue
            if int(last["epoch"]) != int(train["epochs"]):
                continue  # unfinished
            noise = str(train.get("label_noise", "0"))
            key = (train["loss"], "0" if float(noise.partition(":")[0]) == 0 else noise,
                   float(train.get("drop_noisy", 0.0)))  # fmt: skip
            found[key][int(train["seed"])] = {m: float(last[m]) for m in METRICS}
    return found


def mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}"


def welch(a: list[float], b: list[float]) -> float:
    if len(a) < 2 or len(b) < 2:
        return float("nan")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    return (statistics.fmean(a) - statistics.fmean(b)) / math.sqrt(va + vb) if va + vb else 0.0


def ratios(points: dict, key: Key, metric: str) -> list[float]:
    clean = points.get((key[0], "0", 0.0), {})
    return [
        got[metric] / clean[s][metric]
        for s, got in sorted(points.get(key, {}).items())
        if s in clean and clean[s][metric] > 0
    ]


def study_table(points: dict) -> list[str]:
    lines = [
        "| loss | noise | drop | seeds | Recall@1 | MAP@R | Recall@1 / clean | MAP@R / clean |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    order = sorted(points, key=lambda k: (list(NAMES).index(k[0]) if k[0] in NAMES else 9, k[2],
                                          k[1] != "0", "small" in k[1], k[1]))  # fmt: skip
    for key in order:
        seeds = points[key]
        cells = [mean_std([v[m] for v in seeds.values()]) for m in METRICS]
        kept = [mean_std(ratios(points, key, m)) if key[1] != "0" else "1" for m in METRICS]
        drop = f"{key[2]:g}" if key[2] else "-"
        lines.append(
            f"| {NAMES.get(key[0], key[0])} | {noise_words(key[1])} | {drop} | {len(seeds)} | "
            + " | ".join(cells + kept)
            + " |"
        )
    return lines


def claim_table(points: dict) -> list[str]:
    """Proxy-Anchor's kept share of Recall@1 and MAP@R against each other loss, per noise."""
    lines = [
        "| noise | metric | Proxy-Anchor keeps | other loss | it keeps | difference | Welch's t |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: |",
    ]
    noises = sorted({k[1] for k in points if k[1] != "0" and k[2] == 0})
    for noise in noises:
        for metric in METRICS:
            pa = ratios(points, ("proxy_anchor", noise, 0.0), metric)
            for loss in NAMES:
                if loss == "proxy_anchor" or (loss, noise, 0.0) not in points:
                    continue
                other = ratios(points, (loss, noise, 0.0), metric)
                if not pa or not other:
                    continue
                diff = statistics.fmean(pa) - statistics.fmean(other)
                lines.append(
                    f"| {noise_words(noise)} | {metric} | {statistics.fmean(pa):.3f} | "
                    f"{NAMES[loss]} | {statistics.fmean(other):.3f} | {diff:+.3f} | "
                    f"{welch(pa, other):+.1f} |"
                )
    return lines


def recovery_table(points: dict) -> list[str]:
    """The share of the Recall@1 noise cost Proxy-Anchor that each --drop-noisy wins back."""
    lines = [
        "| noise | drop | clean | noisy | with drop | recovered (per seed) | mean |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    clean = points.get(("proxy_anchor", "0", 0.0), {})
    for key in sorted(k for k in points if k[0] == "proxy_anchor" and k[2] > 0):
        noisy = points.get(("proxy_anchor", key[1], 0.0), {})
        seeds = sorted(set(points[key]) & set(noisy) & set(clean))
        shares = []
        for s in seeds:
            lost = clean[s]["recall@1"] - noisy[s]["recall@1"]
            won = points[key][s]["recall@1"] - noisy[s]["recall@1"]
            shares.append(won / lost if lost > 0 else float("nan"))
        r = [[p[s]["recall@1"] for s in seeds] for p in (clean, noisy, points[key])]
        lines.append(
            f"| {noise_words(key[1])} | {key[2]:g} | {mean_std(r[0])} | {mean_std(r[1])} | "
            f"{mean_std(r[2])} | {', '.join(f'{x:.2f}' for x in shares)} | "
            f"{statistics.fmean(shares) if shares else float('nan'):.2f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweeps", nargs="+", type=Path, help="sweep folders (pactl sweep --name)")
    args = p.parse_args(argv)
    points = read_points(args.sweeps)
    if not points:
        print("no finished points", file=sys.stderr)
        return 1
    out = [f"command: python -m bench noise {' '.join(map(str, args.sweeps))}", ""]
    out += study_table(points) + [""] + claim_table(points) + [""] + recovery_table(points)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
