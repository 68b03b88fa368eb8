"""`pactl audit` measured: planted wrong labels found, planted copies across splits found, and an
audit of 1,000,000 items through a bundle's FAISS index.

    python -m bench audit labels RUN [RUN ...]
    python -m bench audit copies RUN --set /tmp/pactl-real/fonts28 --work /tmp/copies
    python -m bench audit scale --work /tmp/audit-1m [--n 1000000 --dim 512]
    python -m bench audit copies-scale --set /tmp/pactl-real/fashion [--n 1000000]
    python -m bench audit descriptor --work /tmp/copies [--vectors EMBED_FOLDER]
    python -m bench audit lookalikes --work /tmp/copies
    python -m bench audit photos --n 2000 --work /tmp/pactl-audit-photos

photos: the label-free audit of --n photo-sized JPEGs, stage by stage (bench_audit_photos).

labels: each RUN trained with --label-noise (noise.csv lists the changed rows) is audited on the
labels it trained with; among its training rows, every score's ranking of the changed labels:
AUROC and precision among the top K (K = the number changed), for the classes' witness
(proxies, or class means without the item), the neighbours' (k = 10), and their blends; beside
them cleanlab 2.x on the same vectors: out-of-sample predicted probabilities from a 10-nearest-
neighbour classifier (scikit-learn, cosine, 5 folds), ranked by get_label_quality_scores
(self-confidence), and how many labels find_label_issues flags.

copies: copies of --copies training images of --set, each resized (0.5 to 0.8 or 1.25 to 2 of the
side), cropped (80 to 95% of each side), saved as JPEG (quality 30 to 70) or all three, written to
--work and added to the test split (half under their own label, half under a test class's: leaks
that also carry two labels); `pactl audit RUN --source planted.csv` at its calibrated threshold.
Recall: the planted pairs reported as leaks. A reported pair is false when it is not planted and
its two images differ (pixels compared at the smaller one's size: more than 8 of 255 anywhere).

retrain: each RUN's K most doubted training rows (K: as many as its noise changed, the rate
PRISM's drop share is set to; `pactl audit --drop-top K`) left out of a manifest (audit
--write-manifest's, the test rows all kept) and the run's recipe trained on it again: its last
Recall@1 beside the noisy run's.

lookalikes: on the set a `copies` run planted in --work, audit's copy search in process, and the
aligned pairs within one split (distinct images, not leaks) that reach the likeness 98% of
the copies audit makes reach: how many, and whether their pixels differ.

descriptor: for the copies a `copies` run planted in --work, where each original ranks among its
copy's nearest by audit's descriptor (or by the vectors of --vectors, an embed folder of
planted.csv), and how many unplanted pairs across splits reach the copies' cosines. The copies
mode prints the same for audit's descriptor.

copies-scale: the copy search at --n items: thumbnails read per second from --set's images, and
--n random unit descriptors indexed by FAISS and searched in batches (wall time, peak memory).

scale: --n unit vectors of bench_index's clustered mixture (n/50 classes) with 10% of the labels
moved to another class, a bundle built by `pactl index` (its default index), then `pactl audit
BUNDLE --no-copies --top 100` in a fresh process under /usr/bin/time: wall time, peak memory
(max RSS) and the ranking's AUROC and precision among the top K of the moved labels.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench import harness
from pactl.audit import doubt
from pactl.console import Reporter
from pactl.verbs.audit import AuditConfig, choose_centres, score_rows
from pactl.verbs.audit_inputs import Labelled, read_run, row_neighbours

VARIANTS = (  # name, --score, --centres
    ("classes: proxies", "classes", "proxies"),
    ("classes: class means", "classes", "means"),
    ("neighbours (k=10)", "neighbours", "means"),
    ("blend: proxies + neighbours", "blend", "proxies"),
    ("blend: means + neighbours", "blend", "means"),
)


def ranking_figures(doubt_of: np.ndarray, planted: np.ndarray) -> tuple[float, float]:
    k = int(planted.sum())
    top = np.lexsort((np.arange(len(doubt_of)), -doubt_of))[:k]
    return doubt.auroc(doubt_of, planted), float(planted[top].mean())


def cleanlab_doubt(vectors: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, int]:
    """(1 - cleanlab's label quality, how many find_label_issues flags) from out-of-sample
    10-NN probabilities on the same vectors."""
    from cleanlab.filter import find_label_issues
    from cleanlab.rank import get_label_quality_scores
    from sklearn.model_selection import cross_val_predict
    from sklearn.neighbors import KNeighborsClassifier

    labels = np.unique(labels, return_inverse=True)[1]  # cleanlab wants codes 0..K-1
    knn = KNeighborsClassifier(n_neighbors=10, metric="cosine")
    probs = cross_val_predict(knn, vectors, labels, cv=5, method="predict_proba")
    quality = get_label_quality_scores(labels, probs)
    return 1.0 - quality, int(find_label_issues(labels, probs).sum())


def labels_mode(runs: list[Path]) -> None:
    log = Reporter(quiet=True)
    print("| run | changed | score | AUROC | precision@K |")
    print("| --- | ---: | --- | ---: | ---: |")
    for run in runs:
        data = read_run(run, None, "cpu", log)
        if data.planted is None:
            print(f"| {run.name} | - | (no noise.csv) | | |")
            continue
        train = np.array([s == "train" for s in data.splits])
        planted = data.planted[train]
        for name, score, centres in VARIANTS:
            if centres == "proxies" and data.proxies is None:
                continue
            config = AuditConfig(score=score, centres=centres, copies=False)
            scores, _, _ = score_rows(data, choose_centres(data, config)[0], config, log)
            auc, prec = ranking_figures(scores.doubt[train], planted)
            print(f"| {run.name} | {int(planted.sum())} | {name} | {auc:.4f} | {prec:.4f} |")
        vectors = data.vectors(np.flatnonzero(train))
        alone = train_rows_only(data, train)  # what cleanlab sees: the training rows alone
        config = AuditConfig(copies=False)
        scores, _, _ = score_rows(alone, choose_centres(alone, config)[0], config, log)
        auc, prec = ranking_figures(scores.doubt, planted)
        print(f"| {run.name} | {int(planted.sum())} | blend, training rows only | {auc:.4f} | "
              f"{prec:.4f} |")  # fmt: skip
        theirs, flagged = cleanlab_doubt(vectors, data.codes[train])
        auc, prec = ranking_figures(theirs, planted)
        print(
            f"| {run.name} | {int(planted.sum())} | cleanlab (10-NN, 5 folds; flags "
            f"{flagged}) | {auc:.4f} | {prec:.4f} |",
            flush=True,
        )


def train_rows_only(data: Labelled, train: np.ndarray) -> Labelled:
    """The audited set cut down to its training rows (their own neighbours and class means)."""
    rows = np.flatnonzero(train)
    vectors = data.vectors(rows)
    return Labelled(
        paths=[data.paths[i] for i in rows.tolist()],
        codes=data.codes[rows],
        names=data.names,
        splits=["train"] * len(rows),
        vectors=lambda r: vectors[r],
        neighbours=row_neighbours(vectors),
        proxies=None,
    )


def retrain_mode(runs: list[Path], work: Path) -> None:
    """Each noisy run's K most doubted training rows (K: as many as its noise changed, the rate
    PRISM's drop share is set to) left out of a clean manifest (the test rows all kept), and the
    run's recipe trained again on it."""
    from pactl.verbs.audit import AuditResult, write_clean_manifest

    log = Reporter(quiet=True)
    work.mkdir(parents=True, exist_ok=True)
    print(
        "| run | dropped | of them planted | planted left | Recall@1 noisy | Recall@1 retrained |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for run in runs:
        data = read_run(run, None, "cpu", log)
        config = AuditConfig(copies=False)
        scores, found, sims = score_rows(data, choose_centres(data, config)[0], config, log)
        train = np.array([s == "train" for s in data.splits])
        planted = data.planted if data.planted is not None else np.zeros(len(data), bool)
        ranked = np.flatnonzero(train)[np.argsort(-scores.doubt[train], kind="stable")]
        drop = np.sort(ranked[: int(planted.sum())])
        result = AuditResult(data, scores, [], None, "", found, sims)
        manifest = work / f"{run.name}-clean.csv"
        write_clean_manifest(result, drop, manifest)
        again = retrain(run, manifest, work / f"{run.name}-clean")
        print(
            f"| {run.name} | {len(drop)} | {int(planted[drop].sum())} | "
            f"{int(planted.sum() - planted[drop].sum())} | {last_recall(run):.4f} | "
            f"{last_recall(again):.4f} |",
            flush=True,
        )


def retrain(run: Path, manifest: Path, out: Path) -> Path:
    """The run's recipe (its config.json) trained on `manifest` into `out`."""
    info = json.loads((run / "config.json").read_text())
    model, train = info["model_config"], info["train_config"]
    args = [
        "--weights", model["weights"], "--backbone", model["backbone"],
        "--image-size", str(model["image_size"]), "--resize-size", str(model["resize_size"]),
        "--dim", str(model["embedding_dim"]), "--epochs", str(train["epochs"]),
        "--batch-size", str(train["batch_size"]), "--lr", str(train["lr"]),
        "--sampler", train["sampler"], "--m", str(train["m_per_class"]),
        "--augment", train["augment"], "--loss", train["loss"], "--seed", str(train["seed"]),
        "--val-classes", "0", "--lr-decay-step", str(train["lr_decay_step"]),
        "--warmup-epochs", str(train["warmup_epochs"]),
    ]  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "pactl", "train", str(manifest), *args, "--name", out.name,
         "--overwrite", "--quiet"],
        check=True, env={**os.environ, "PACTL_RUNS": str(out.parent)},
    )  # fmt: skip
    return out


def last_recall(run: Path) -> float:
    with open(run / "metrics.csv", newline="") as f:
        return float(list(csv.DictReader(f))[-1]["recall@1"])


def plant_copies(source: str, work: Path, count: int, seed: int) -> Path:
    """planted.csv in `work`: the set's manifest (absolute paths) with copies of `count` train
    images added to the test split; copies.csv: (copy, original)."""
    from PIL import Image

    from pactl.audit.copies import CHANGES, changed_copy
    from pactl.console import QUIET
    from pactl.datasets import load_source

    m = load_source(source, QUIET)
    rng = np.random.default_rng(seed)
    train = [i for i, s in enumerate(m.splits) if s == "train"]
    test_names = sorted({m.class_names[i] for i, s in enumerate(m.splits) if s != "train"})
    rows = [
        (str(m.root / p), n, s, n) for p, n, s in zip(m.paths, m.class_names, m.splits, strict=True)
    ]
    pairs = []
    (work / "copies").mkdir(parents=True, exist_ok=True)
    for n, i in enumerate(rng.choice(train, size=count, replace=False).tolist()):
        copy, suffix = changed_copy(Image.open(m.root / m.paths[i]), CHANGES[n % 4], rng)
        out = work / "copies" / f"{n:05d}{suffix}"
        copy.save(out, quality=int(rng.integers(30, 71))) if suffix == ".jpg" else copy.save(out)
        label = m.class_names[i] if n % 2 == 0 else test_names[int(rng.integers(len(test_names)))]
        rows.append((str(out), label, "test", label))
        pairs.append((str(out), str(m.root / m.paths[i])))
    with open(work / "planted.csv", "w", newline="") as f:
        csv.writer(f).writerows([("path", "label", "split", "class_name"), *rows])
    with open(work / "copies.csv", "w", newline="") as f:
        csv.writer(f).writerows([("copy", "original"), *pairs])
    return work / "planted.csv"


def is_copy(path: str) -> int:
    """Sort key that puts a planted copy (under copies/) first."""
    return 0 if "/copies/" in path else 1


def same_pixels(a: str, b: str) -> bool:
    from PIL import Image

    x, y = Image.open(a).convert("L"), Image.open(b).convert("L")
    size = min(x.size, y.size)
    xa = np.asarray(x.resize(size), dtype=np.int16)
    ya = np.asarray(y.resize(size), dtype=np.int16)
    return bool(np.abs(xa - ya).max() <= 8)


def copies_mode(
    run: Path, source: str, work: Path, count: int, seed: int, threshold: float | None
) -> None:
    from pactl.audit.copies import CHANGES

    planted_csv = plant_copies(source, work, count, seed)
    with open(work / "copies.csv", newline="") as f:
        truth = {tuple(sorted(r)) for r in csv.reader(f)} - {("copy", "original")}
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pactl", "audit", str(run), "--source", str(planted_csv),
         "--top", "0", "-f", "csv",
         *(["--copy-threshold", str(threshold)] if threshold is not None else [])],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    seconds = time.perf_counter() - began
    leaks = [r for r in csv.DictReader(done.stdout.splitlines()) if r["kind"] == "leak"]
    found = {tuple(sorted((r["path"], r["other"]))) for r in leaks}
    false = [p for p in found - truth if not same_pixels(*p)]
    print(done.stderr.strip())
    print(f"planted copies: {len(truth)}; leak pairs reported: {len(found)}")
    print(f"recall of the planted pairs: {len(found & truth) / len(truth):.4f}")
    for n, change in enumerate(CHANGES):  # copy i was made by CHANGES[i % 4]
        kind = {p for p in truth if int(Path(min(p, key=is_copy)).stem) % len(CHANGES) == n}
        print(f"  {change}: {len(found & kind) / max(len(kind), 1):.4f} of {len(kind)}")
    print(f"reported pairs not planted: {len(found - truth)}, of which pixels differ: {len(false)}")
    print(f"false share of the reported pairs: {len(false) / max(len(found), 1):.4f}")
    print(f"audit wall time: {seconds:.1f} s")
    original_ranks(planted_csv, work / "copies.csv")


def original_ranks(planted_csv: Path, copies_csv: Path, vectors: Path | None = None) -> None:
    """How a descriptor sees each planted copy: where its original ranks among the copy's
    nearest (every image of the set searched exactly: a rank far down the list is a copy that
    no check of the descriptor's few nearest could find), and how many pairs across splits
    that are not planted reach the cosines 98%, 95%, 90% and 80% of the copies reach with their
    originals. The descriptor: audit's (the set's whitened thumbnails, each candidate original
    at its best crop box: the cosine audit proposes pairs by), or the vectors of an
    embed folder of planted.csv (`vectors`, e.g. ImageNet features: `pactl embed planted.csv
    --backbone timm:efficientnet_lite0`)."""
    from pactl.audit.copies import CHANGES

    with open(planted_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    paths, splits = [r["path"] for r in rows], np.array([r["split"] for r in rows])
    at = {p: i for i, p in enumerate(paths)}
    with open(copies_csv, newline="") as f:
        pairs = [(at[r["copy"]], at[r["original"]], r["copy"]) for r in csv.DictReader(f)]
    if vectors is None:
        sims = thumbnail_similarities(paths)
    else:
        x = embedded(vectors, at)
        sims = x @ x.T
    np.fill_diagonal(sims, -np.inf)
    print(
        f"descriptor: {vectors or 'whitened thumbnails, the best of 225 boxes'}; rank of the "
        f"original among its copy's nearest (0: nearest; of {len(paths):,} images):"
    )
    kinds = np.array([int(Path(name).stem) % len(CHANGES) for _, _, name in pairs])
    ranks = np.array([np.count_nonzero(sims[c] > sims[c, o]) for c, o, _ in pairs])
    for n, change in enumerate(CHANGES):
        r = ranks[kinds == n]
        print(
            f"  {change}: median {np.median(r):.0f}, 90th percentile {np.quantile(r, 0.9):.0f}, "
            f"worst {r.max()}; among the 10 nearest: {np.mean(r < 10):.2f}"
        )
    copy_cos = np.array([sims[c, o] for c, o, _ in pairs])
    planted = np.zeros(sims.shape, dtype=bool)
    for c, o, _ in pairs:
        planted[c, o] = planted[o, c] = True
    upper = np.triu_indices(len(paths), 1)
    either = np.maximum(sims, sims.T)  # a pair by its likelier direction
    cos, made, across = either[upper], planted[upper], (splits[:, None] != splits[None])[upper]
    for share in (0.98, 0.95, 0.90, 0.80):
        cut = np.quantile(copy_cos, 1 - share)
        reported = (cos >= cut) & across
        print(
            f"  at {cut:.4f} ({share:.0%} of the copies): {reported.sum():,} pairs across "
            f"splits, {np.count_nonzero(reported & ~made):,} of them not planted"
        )


def lookalikes_mode(planted_csv: Path, seed: int) -> None:
    """Audit's two copy steps on planted.csv, in process: how many aligned pairs within one
    split reach the likeness 98% of the copies audit makes reach (pairs that are not the same
    picture: they cannot be planted leaks), and of 300 of them drawn, how many differ by more
    than 8 of 255 at some pixel and how many share a label."""
    from pactl.audit import copies
    from pactl.console import QUIET
    from pactl.verbs.audit_inputs import encode

    with open(planted_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    codes, names = encode([r["label"] for r in rows])
    data = Labelled(
        paths=[r["path"] for r in rows], codes=codes, names=names,
        splits=[r["split"] for r in rows], vectors=None, neighbours=None, proxies=None,
        what=str(planted_csv),
    )  # fmt: skip
    workers = min(os.cpu_count() or 1, 8)
    proposals = copies.propose(data, copies.CANDIDATES, 4096, QUIET, workers)
    assert proposals is not None
    made = copies.made_copies(data, proposals, seed=0)
    floor = copies.proposal_floor(made, crops=proposals.bases is not None)
    low, high, score = copies.aligned_pairs(data, proposals.candidates, floor, QUIET, workers)
    reach = float(np.quantile(made.likeness, 1 - copies.COPY_RECALL, method="lower"))
    within = np.array([data.splits[a] == data.splits[b] for a, b in zip(low, high, strict=True)])
    chosen = np.flatnonzero(within & (score >= reach) & (score < copies.IDENTICAL))
    drawn = np.random.default_rng(seed).choice(chosen, min(300, len(chosen)), replace=False)
    differ = np.mean([not same_pixels(data.paths[low[i]], data.paths[high[i]]) for i in drawn])
    same = np.mean([codes[low[i]] == codes[high[i]] for i in drawn])
    print(
        f"{within.sum():,} aligned pairs within a split; {len(chosen):,} of them (not identical) "
        f"at or above {reach:.4f}, the likeness 98% of the copies made reach; of {len(drawn)} "
        f"drawn: {differ:.2f} differ by more than 8 of 255 at some pixel, {same:.2f} share a label"
    )


def thumbnail_similarities(paths: list[str]) -> np.ndarray:
    """(N, N) float32: row c, column o, the best cosine of image c's whole descriptor to the
    descriptor of one of audit's boxes of image o (the whole image among them), whitened on
    these images as audit does: how audit proposes o as c's original."""
    from pactl.audit.thumbnails import (
        BOXES,
        DIMS,
        box_thumbnails,
        fit_whitening,
        integral,
        read_pictures,
    )

    pictures = read_pictures(paths, keep_bases=True)
    assert pictures.bases is not None
    describe = fit_whitening(pictures.thumbs, np.random.default_rng(0), pictures.read, DIMS)
    whole = describe(pictures.thumbs)
    total = integral(pictures.bases)
    sims = np.full((len(paths), len(paths)), -np.inf, dtype=np.float32)
    for box in BOXES:
        np.maximum(sims, whole @ describe(box_thumbnails(pictures.bases, box, total)).T, out=sims)
    return sims


def embedded(folder: Path, at: dict[str, int]) -> np.ndarray:
    """An embed folder's unit vectors in planted.csv's row order."""
    from pactl.verbs.vector_sources import gather_vectors

    vectors, items, _ = gather_vectors(folder)
    x = np.empty((len(at), vectors.shape[1]), dtype=np.float32)
    x[[at[str(p)] for p in items.paths]] = vectors
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def copies_scale_mode(source: str, n: int, seed: int) -> None:
    """The copy search's costs at n items: thumbnails read per second and pairs aligned per
    second on the set's images, and a FAISS index of n unit descriptors searched in batches for
    each one's nearest, made into candidate pairs as audit does (copies.likeliest)."""
    from pactl.audit.alignment import likeness, working
    from pactl.audit.copies import ALIGN_MOST, CANDIDATES, likeliest
    from pactl.audit.thumbnails import DIMS, WHOLE, read_pictures
    from pactl.console import QUIET
    from pactl.datasets import load_source
    from pactl.images import load_image
    from pactl.index.exact import cosine_index

    files = load_source(source, QUIET).files()
    files = (files * (16000 // len(files) + 1))[:16000]  # enough for the processes to share
    workers = min(os.cpu_count() or 1, 8)  # as audit's --workers 0
    began = time.perf_counter()
    read_pictures(files, workers=workers)
    rate = len(files) / (time.perf_counter() - began)
    print(f"thumbnails: {rate:,.0f} images/s on {len(files):,} of {source} ({workers} processes)")
    rng = np.random.default_rng(seed)
    images = [working(load_image(f)) for f in files[:600]]  # one process
    began = time.perf_counter()
    for a, b in zip(images[:300], images[300:], strict=True):
        likeness(a, b, WHOLE)
    per_pair = (time.perf_counter() - began) / 300
    print(f"alignment: {per_pair * 1000:.2f} ms a pair (300 pairs of {source}, one process)")
    x = rng.standard_normal((n, DIMS), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    began = time.perf_counter()
    nearest = cosine_index(x)
    built = time.perf_counter() - began
    found = []
    for start in range(0, n, 4096):
        rows = np.arange(start, min(start + 4096, n))
        sims, hits = nearest(x[rows], CANDIDATES + 1)
        found.append(
            (hits, np.broadcast_to(rows[:, None], hits.shape), sims, np.zeros(hits.shape, np.int16))
        )
    searched = time.perf_counter() - began - built
    candidates = likeliest(found, np.zeros(n, dtype=bool), CANDIDATES)
    paired = time.perf_counter() - began - built - searched
    peak = harness.own_peak_bytes() / 2**30  # VmHWM of this process
    print(
        f"{n:,} descriptors of {DIMS} floats: index built in {built:.1f} s, searched for "
        f"{CANDIDATES} nearest each in {searched:.1f} s, {len(candidates.copy):,} candidate pairs "
        f"in {paired:.1f} s; peak memory {peak:.2f} GiB; thumbnails of {n:,} images at the rate "
        f"above: {n / rate / 60:.1f} min; aligning at most {ALIGN_MOST:,} pairs: "
        f"{ALIGN_MOST * per_pair / 60:.1f} min in one process, {workers} share it"
    )


def scale_mode(work: Path, n: int, dim: int, seed: int) -> None:
    from bench.data import Mixture

    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    vectors, classes = Mixture(n, dim, rng).draw(n, rng)
    moved = rng.random(n) < 0.10
    labels = classes.copy()
    shift = rng.integers(1, classes.max() + 1, size=int(moved.sum()))
    labels[moved] = (classes[moved] + shift) % (classes.max() + 1)
    folder = work / "vectors"
    folder.mkdir(exist_ok=True)
    np.save(folder / "vectors.npy", vectors)
    del vectors
    write_items(folder / "items.csv", [f"c{c}" for c in labels.tolist()])
    meta = {
        "format": "pactl.vectors", "version": 1, "dimension": dim, "count": n, "metric": "ip",
        "checkpoint": None, "fingerprint": "0" * 64, "model_config": {},
    }  # fmt: skip
    (folder / "meta.json").write_text(json.dumps(meta))
    np.save(work / "moved.npy", moved)
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pactl", "index", str(folder), "--out", str(work / "b"),
                    "--overwrite", "-q"], check=True)  # fmt: skip
    print(f"bundle built in {time.perf_counter() - began:.1f} s")
    with open(work / "audit.csv", "w") as out:
        timed = subprocess.run(
            ["/usr/bin/time", "-v", sys.executable, "-m", "pactl", "audit", str(work / "b"),
             "--no-copies", "--top", "0", "-f", "csv"],
            stdout=out, stderr=subprocess.PIPE, text=True, check=True,
        )  # fmt: skip
    report_scale(timed.stderr, work, moved)


def write_items(path: Path, names: list[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("id", "path", "label", "size", "mtime_ns"))
        w.writerows((i, f"/items/{i}.jpg", name, 0, 0) for i, name in enumerate(names))


def report_scale(stderr: str, work: Path, moved: np.ndarray) -> None:
    """/usr/bin/time's lines, and the ranking of the moved labels read back from audit.csv."""
    wanted = ("Elapsed (wall clock)", "Maximum resident set size", "User time", "System time")
    for line in stderr.splitlines():
        if any(w in line for w in wanted) or "labelled item" in line:
            print(line.strip())
    score = np.full(len(moved), np.nan)
    with open(work / "audit.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["kind"] == "label":
                score[int(row["path"].rsplit("/", 1)[1].split(".")[0])] = float(row["score"])
    auc, prec = ranking_figures(score, moved)
    print(
        f"moved labels: {int(moved.sum()):,}; AUROC {auc:.4f}; precision among the top K {prec:.4f}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "mode",
        choices=(
            "labels",
            "copies",
            "copies-scale",
            "scale",
            "retrain",
            "descriptor",
            "lookalikes",
            "photos",
        ),
    )
    p.add_argument("runs", nargs="*", type=Path)
    p.add_argument("--set", dest="source", default="/tmp/pactl-real/fonts28")
    p.add_argument("--work", type=Path, default=Path("/tmp/pactl-audit-bench"))
    p.add_argument("--copies", type=int, default=200)
    p.add_argument("--copy-threshold", type=float, default=None, help="copies: not calibrated")
    p.add_argument("--n", type=int, default=None, help="items (photos: 2,000; else 1,000,000)")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vectors", type=Path, default=None, help="descriptor: an embed folder")
    args = p.parse_args(argv)
    print(f"command: python -m bench audit {' '.join(sys.argv[1:])}")
    if args.mode == "labels":
        labels_mode(args.runs)
    elif args.mode == "retrain":
        retrain_mode(args.runs, args.work)
    elif args.mode == "copies":
        copies_mode(
            args.runs[0], args.source, args.work, args.copies, args.seed, args.copy_threshold
        )
    elif args.mode == "copies-scale":
        copies_scale_mode(args.source, args.n or 1_000_000, args.seed)
    elif args.mode == "descriptor":
        original_ranks(args.work / "planted.csv", args.work / "copies.csv", args.vectors)
    elif args.mode == "lookalikes":
        lookalikes_mode(args.work / "planted.csv", args.seed)
    elif args.mode == "photos":
        from bench.bench_audit_photos import photos_mode

        photos_mode(args.work, args.n or 2000, args.seed)
    else:
        scale_mode(args.work, args.n or 1_000_000, args.dim, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
