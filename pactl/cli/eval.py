"""`pactl eval`: Recall@K, MAP@R, R-precision and NMI of a network, written as a report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pactl.cli.options import (
    Backbone,
    BackboneResize,
    BackboneSize,
    BackboneWeights,
    Device,
    FollowLinks,
    Quiet,
    Workers,
    check_new_file,
    check_option,
    check_output,
    check_source,
    describe_backbone,
    model_source,
    parse_ks,
    reporter,
    to_stdout,
    writing,
)
from pactl.config import TRAIN_RULES, IndexConfig, ModelConfig, QdrantConfig, check, option_name
from pactl.console import Reporter, out
from pactl.errors import UsageError
from pactl.store.home import runs_dir


def eval_(
    source: Annotated[
        str | None,
        typer.Argument(help="Dataset name, folder or CSV (default: the run's own dataset)."),
    ] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option(exists=True, dir_okay=False, help="Default: the latest run's best.pt."),
    ] = None,
    backbone: Backbone = None,
    weights: BackboneWeights = None,
    image_size: BackboneSize = None,
    resize_size: BackboneResize = None,
    ks: Annotated[str | None, typer.Option(help="Recall@K list, e.g. 1,2,4,8.")] = None,
    report: Annotated[
        Path | None,
        typer.Option(
            help="CSV to write the metrics to (default: eval.csv in the checkpoint's run "
            "folder, else in the current folder)."
        ),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace the report if it exists.")
    ] = False,
    calibrate: Annotated[
        bool,
        typer.Option(
            "--calibrate",
            help="Instead of the metrics: measure the same-item threshold on the held-out "
            "classes (val split, else test) and store it in the checkpoint.",
        ),
    ] = False,
    precision: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="With --calibrate: the precision to reach."),
    ] = 0.99,
    binary: Annotated[
        bool,
        typer.Option(
            "--binary",
            help="Also the metrics of the vectors' binary codes (codes_*: Hamming order, ties "
            "broken by id) and of those codes rescored by cosine (rescored_*), made as `pactl "
            "index --binary` makes them of the evaluated vectors.",
        ),
    ] = False,
    bits: Annotated[
        int | None, typer.Option(min=8, help="With --binary: bits per code (as pactl index).")
    ] = None,
    rotation: Annotated[
        str | None,
        typer.Option(help="With --binary: auto, none, itq or lsh (as pactl index)."),
    ] = None,
    rescore: Annotated[
        int | None,
        typer.Option(
            min=0, max=10_000, help="With --binary: candidates per hit rescored (as pactl index)."
        ),
    ] = None,
    index_dir: Annotated[
        Path | None,
        typer.Option(
            "--index",
            exists=True,
            file_okay=False,
            help="The codes of this binary bundle (its rotation and rescoring depth) and, "
            "unless given, its network: implies --binary.",
        ),
    ] = None,
    qdrant: Annotated[
        str | None,
        typer.Option(
            metavar="URL|PATH",
            help="Also the recall@10 of this Qdrant server's or local-mode folder's search "
            "(`pactl export --to qdrant`, as tuned there) against exact search over the "
            "vectors it holds, and its ms a query (qdrant_*).",
        ),
    ] = None,
    collection: Annotated[
        str, typer.Option(help="With --qdrant: the collection.")
    ] = QdrantConfig.collection,
    workers: Workers = 0,
    device: Device = "auto",
    follow_links: FollowLinks = False,
    quiet: Quiet = False,
) -> None:
    """Recall@K, MAP@R, R-precision and NMI of a checkpoint (or of a backbone with no training)
    on a test split; the metrics go to stdout and to a CSV report.

    Examples:

    \b
      pactl eval                             # latest run, its dataset
      pactl eval cars196 --checkpoint runs/<run>/best.pt --report cars.csv
      pactl eval my_photos/ --backbone resnet50   # the ImageNet start
      pactl eval --calibrate --precision 0.995   # same-item threshold
      pactl eval fonts --binary --bits 64        # + 64-bit codes, and rescored
      pactl eval fonts --index runs/<run>/codes  # a binary bundle's codes
      pactl eval fonts --qdrant qdrant-local/    # + the Qdrant search's recall
    """
    from pactl.runs import latest_run, resumed_configs
    from pactl.verbs.evaluate import default_ks, eval_checkpoint, eval_qdrant

    if source is not None:
        check_source(source)
    codes = codes_config(binary or index_dir is not None, bits, rotation, rescore)
    if qdrant is None and collection != QdrantConfig.collection:
        raise UsageError("--collection goes with --qdrant")
    if index_dir is not None and checkpoint is None and backbone is None:
        from pactl.verbs.evaluate import bundle_network

        checkpoint = bundle_network(index_dir)
    if backbone is None and (checkpoint is None or source is None):
        run = run_folder(checkpoint) if checkpoint else latest_run(runs_dir())
        if run is None:
            raise UsageError("give the dataset, folder or CSV to evaluate --checkpoint on")
        checkpoint = checkpoint or run / "best.pt"
        if source is None:
            source, _, run_cfg = resumed_configs(run)
            follow_links = follow_links or run_cfg.follow_links
    if source is None:
        raise UsageError("give the dataset, folder or CSV to evaluate on")
    check_option("--device", device, TRAIN_RULES["device"])
    if calibrate:
        if report is not None or ks is not None or codes is not None or qdrant is not None:
            raise UsageError(
                "--calibrate writes no metrics: leave out --report, --ks, --binary, --qdrant"
            )
        check_option("--precision", precision, TRAIN_RULES["precision"])
        model_from = model_source(checkpoint, backbone, weights, image_size, resize_size)
        calibrate_to_stdout(source, model_from, precision, device, workers, quiet, follow_links)
        return
    report = report or default_report(checkpoint if backbone is None else None)
    check_output(report, "--report", folder=False)
    k_list = parse_ks(ks) if ks else default_ks(source)
    inputs = [Path(p) for p in (source, checkpoint, index_dir) if p is not None]
    check_new_file(report, overwrite, "--report", inputs)  # after the usage errors: named first
    model_from = model_source(checkpoint, backbone, weights, image_size, resize_size)
    log = reporter(quiet)
    # first: a missing collection is said before the network runs
    searched = eval_qdrant(qdrant, collection, log) if qdrant is not None else {}
    if codes is not None:
        from pactl.verbs.evaluate import eval_codes

        metrics, network = eval_codes(
            source, model_from, k_list, device, workers, log, codes, index_dir, follow_links
        )
    else:
        metrics, network = eval_checkpoint(
            source, model_from, k_list, device, workers, log, follow_links
        )
    metrics |= searched
    with writing(report):
        write_report(report, source, model_from, metrics)
    print_metrics(source, network, metrics, log)
    log.log(f"wrote {report}")


def print_metrics(
    source: str, network: ModelConfig, metrics: dict[str, float], log: Reporter
) -> None:
    """One row a metric on stdout, with the published figures of the same setting beside it
    (their sources named on stderr)."""
    from pactl.research.published import SOURCES, published_cells, published_for

    found = published_for(source, network.backbone, network.embedding_dim, network.image_size)
    for p in dict.fromkeys(p.source for p in found):
        log.log(f"published ({p}): {SOURCES[p]}")
    width = max(12, *map(len, metrics))  # 12: the float metrics' column
    with to_stdout():
        for key, value in metrics.items():
            out.print("  ".join([f"{key:{width}s} {value:.4f}", *published_cells(key, found)]))


def calibrate_to_stdout(
    source: str,
    model_from: Path | ModelConfig,
    precision: float,
    device: str,
    workers: int,
    quiet: bool,
    follow_links: bool,
) -> None:
    """`--calibrate`: the threshold, the precision it reaches and the recall kept, on stdout."""
    from pactl.verbs.evaluate import calibrate_source

    log = reporter(quiet)
    cal = calibrate_source(source, model_from, precision, device, workers, log, follow_links)
    with to_stdout():
        threshold = "none" if cal.threshold is None else f"{cal.threshold:.4f}"
        out.print(f"threshold    {threshold}")
        out.print(f"precision    {cal.measured:.4f}")
        out.print(f"recall       {cal.recall:.4f}")
        out.print(f"pairs        {cal.pairs}")
    if isinstance(model_from, Path):
        log.log(f"stored in {model_from}; curve in {model_from.parent / 'calibration.png'}")
    else:
        log.log("not stored (a backbone has no checkpoint): give dedup --threshold")


def codes_config(
    binary: bool, bits: int | None, rotation: str | None, rescore: int | None
) -> IndexConfig | None:
    """The codes --binary evaluates (None: none), their options checked as pactl index's."""
    if not binary:
        given = {"--bits": bits, "--rotation": rotation, "--rescore": rescore}
        for option in (option for option, value in given.items() if value is not None):
            raise UsageError(f"{option} goes with --binary (or --index BUNDLE)")
        return None
    if bits is not None and bits % 8:
        raise UsageError(f"--bits {bits}: codes are whole bytes; give a multiple of 8 (64, 128)")
    config = IndexConfig(binary=True, bits=bits or 0, rotation=rotation or "auto", rescore=rescore)
    return check(config, option_name, UsageError)


def run_folder(checkpoint: Path | None) -> Path | None:
    """The run folder a checkpoint lies in (it holds config.json), if any."""
    if checkpoint is None or not (checkpoint.parent / "config.json").is_file():
        return None
    return checkpoint.parent


def default_report(checkpoint: Path | None) -> Path:
    """eval.csv beside the run's metrics.csv, or in the current folder for a checkpoint that
    is in no run folder (and for a backbone)."""
    run = run_folder(checkpoint)
    return run / "eval.csv" if run is not None else Path("eval.csv")


def write_report(
    path: Path, source: str, model_from: Path | ModelConfig, metrics: dict[str, float]
) -> None:
    from pactl.store.csv_cells import csv_text
    from pactl.store.generations import atomic_write_text

    what = str(model_from) if isinstance(model_from, Path) else describe_backbone(model_from)
    row = [source, what, *(f"{v:.6g}" for v in metrics.values())]
    atomic_write_text(path, csv_text(["dataset", "checkpoint", *metrics], [row]))
