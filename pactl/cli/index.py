"""`pactl index`: a FAISS bundle from vectors or images, and the bundle's upkeep (--add,
--delete, --compact)."""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pactl.cli.engines import Engine, EngineOption, RayAddress, Shards, engine_config
from pactl.cli.options import (
    Backbone,
    BackboneResize,
    BackboneSize,
    BackboneWeights,
    Device,
    FaissDevice,
    FollowLinks,
    OnDisk,
    Quiet,
    check_option,
    check_output,
    check_source,
    choices,
    model_source,
    reporter,
    stdin_names,
    to_stdout,
)
from pactl.config import (
    INDEX_RULES,
    TRAIN_RULES,
    EmbedConfig,
    EngineConfig,
    IndexConfig,
    check,
    option_name,
)
from pactl.console import Reporter, counted, literal, out
from pactl.errors import PactlError, UsageError
from pactl.store.home import runs_dir

if TYPE_CHECKING:  # the members are the declaration's, read when the CLI is built
    Rotation = Enum
else:
    Rotation = choices("Rotation", INDEX_RULES["rotation"].names)

BINARY_HELP = (
    "Index binary codes of the vectors (signs after a rotation chosen by measurement), every "
    "hit rescored by exact cosine on the float vectors, which stay on disk: ~28x less memory "
    "than float vectors at 512 bits (64 bytes and an id a code). Default for the vectors of "
    "`pactl train --bits`. "
    "Prefer product quantisation (--factory IVF4096_HNSW32,PQ64) where recall per byte "
    "matters most: at the same bytes and rescoring it found more true neighbours, faster; "
    "binary codes build faster, need no quantiser trained, and search exactly "
    "(docs/benchmarks.md, Binary codes)."
)


def index(
    source: Annotated[
        str | None,
        typer.Argument(
            help="An embed output folder, or images with --checkpoint (default: the "
            "latest run's test images)."
        ),
    ] = None,
    checkpoint: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="Embed images with this.")
    ] = None,
    backbone: Backbone = None,
    weights: BackboneWeights = None,
    image_size: BackboneSize = None,
    resize_size: BackboneResize = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Bundle folder (default: runs/<run>/index for a run's checkpoint, else ./index).",
        ),
    ] = None,
    factory: Annotated[
        str | None,
        typer.Option(help="FAISS factory string, e.g. Flat (default: chosen by the set's size)."),
    ] = None,
    target_recall: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="Recall@10 against exact search a tuned index needs."),
    ] = 0.95,
    memory_budget: Annotated[
        float,
        typer.Option(
            metavar="GB",
            help="The default index must fit in this much memory (it chooses the factory).",
        ),
    ] = 8.0,
    query_budget_ms: Annotated[
        float,
        typer.Option(
            metavar="MS",
            help="Milliseconds a query may take (batched) at the tuned setting; tuning stops "
            "there and says so when the target needs more.",
        ),
    ] = 10.0,
    split: Annotated[str | None, typer.Option(help="Only this split of a manifest.")] = None,
    add: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            file_okay=False,
            help="Append SOURCE's new images to this bundle, and replace those whose file "
            "changed (size or mtime); images gone from SOURCE stay (see --delete), and "
            "deleted ones stay out while unchanged.",
        ),
    ] = None,
    delete: Annotated[
        list[str] | None,
        typer.Option(
            "--delete",
            metavar="ID_OR_PATH",
            help="Delete an item (its id, or its image's path) from the bundle SOURCE; "
            "repeatable; '-' reads one a line from stdin. Searches skip it at once.",
        ),
    ] = None,
    compact: Annotated[
        bool,
        typer.Option(
            "--compact", help="Remove the deleted items from the bundle SOURCE's index for real."
        ),
    ] = False,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Check the bundle SOURCE's files against the checksums its meta.json records "
            "(every byte read); exit 1 naming a damaged file.",
        ),
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Rebuild a bundle even if the new input lacks some of its items (those added "
            "with --add, or other images), which it then drops.",
        ),
    ] = False,
    on_disk: Annotated[
        OnDisk,
        typer.Option(
            "--on-disk",
            help="Index shards one at a time and merge their IVF lists into index.ivfdata, "
            "read from disk at query time (for sets larger than memory). auto: when the shards' "
            "vectors exceed the memory budget and the factory is IVF.",
        ),
    ] = OnDisk("auto"),
    faiss_device: Annotated[
        FaissDevice,
        typer.Option(
            help="Where FAISS trains IVF lists, assigns vectors to them and searches exactly: "
            "auto takes the GPUs when FAISS has them (the gpu extra), else the CPU.",
        ),
    ] = FaissDevice("auto"),
    binary: Annotated[bool | None, typer.Option("--binary/--no-binary", help=BINARY_HELP)] = None,
    bits: Annotated[
        int | None,
        typer.Option(
            min=8,
            help="With --binary: bits per code, a multiple of 8, at most the dimension unless "
            "--rotation lsh (default: the dimension, or the network's --bits).",
        ),
    ] = None,
    rotation: Annotated[
        Rotation,
        typer.Option(
            help="With --binary: the map before the signs: none (the vectors' own signs), itq "
            "(PCA to the bits, then ITQ's rotation), lsh (a random projection, any bits); auto "
            "measures them on a sample and keeps the best.",
        ),
    ] = "auto",  # type: ignore[assignment]
    rescore: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=10_000,
            help="Candidates per hit rescored by exact cosine on a copy of the float vectors "
            "kept in the bundle, for lossy codes (--binary, or a float factory such as "
            "IVF...,PQ); 0: the codes' order, no copy; default: the fewest that reach "
            "--target-recall, measured.",
        ),
    ] = None,
    keep_shards: Annotated[
        bool,
        typer.Option(
            "--keep-shards",
            help="Build a bundle set: one bundle per shard of the embed folder (OUT/shards/), "
            "all filled from one index trained once, tuned once on their union; query, serve "
            "and the API answer it as one bundle.",
        ),
    ] = False,
    shard_items: Annotated[
        int | None,
        typer.Option(
            min=1,
            metavar="N",
            help="A bundle set (as --keep-shards) whose shard bundles hold at most N items "
            "each: a vectors shard is cut into pieces.",
        ),
    ] = None,
    device: Device = "auto",
    follow_links: FollowLinks = False,
    engine: EngineOption = Engine("local"),
    ray_address: RayAddress = None,
    shards: Shards = 0,
    quiet: Quiet = False,
) -> None:
    """Build a FAISS inner-product index bundle (index.faiss, items.csv, meta.json).

    An embed folder with shards/ (from `pactl embed --shard i/n`) is merged in shard order;
    so are the shards of the Parquet layout (embeddings/*.npy beside metadata/*.parquet, from
    `pactl export --to parquet` or clip-retrieval).

    With --on-disk, shards are indexed one at a time into an IVF whose lists stay on disk.

    With --keep-shards (or --shard-items N), each shard becomes a bundle of its own under
    OUT/shards/, all filled from one IVF or Flat index trained once and tuned once on their
    union: a bundle set, which query, serve and the API answer as one bundle would.

    With --engine ray (an IVF or Flat float index, from an embed folder), the index is trained
    here, each shard is filled by one Ray task, and the lists are merged and tuned here: the
    same index as without it, for the same vectors.

    --delete marks items deleted (searches skip them at once, and a rebuild of the bundle
    keeps them deleted); --compact removes them from the index for good. An integer names
    an id: give a file named like one as ./123.

    Examples:

    \b
      pactl index                          # right after `pactl train NAME`
      pactl index vectors/ --out my_index/
      pactl index vectors-parquet/ --out my_index/    # the clip-retrieval layout
      pactl index photos/ --checkpoint runs/<run>/best.pt --factory Flat
      pactl index photos/ --backbone resnet50 --out baseline/   # no training
      pactl index vectors/ --on-disk yes --factory IVF4096,Flat
      pactl index vectors/ --engine ray --ray-address head:6379
      pactl index vectors/ --keep-shards --out my_set/   # a bundle set
      pactl index vectors/ --shard-items 1000000 --out my_set/
      pactl index vectors/ --binary --out codes/        # 512-d: 512-bit codes
      pactl index vectors/ --binary --bits 128 --rescore 8
      pactl index new_photos/ --add runs/<run>/index      # no rebuild
      pactl index my_index/ --delete 42 --delete photos/old.jpg
      find gone/ -name '*.jpg' | pactl index my_index/ --delete -
      pactl index my_index/ --compact      # drop deleted items from the index
      pactl index --verify my_index/       # check every file's checksum
    """
    from pactl.verbs.index import index_images, index_latest_run, index_vectors

    cluster = engine_config(engine, ray_address, shards)  # fails fast: Ray, the address
    if cluster.engine == "ray" and (source is None or verify or delete or compact or add):
        raise UsageError(RAY_INDEXES)
    log = reporter(quiet)
    budgets = (memory_budget, query_budget_ms)
    config = index_config(factory, target_recall, on_disk, faiss_device, budgets)
    config = binary_options(config, binary, bits, Rotation(rotation).value, rescore)
    embedding = EmbedConfig(device=device, follow_links=follow_links)
    check_option("--device", device, TRAIN_RULES["device"])
    if out_dir is not None:
        check_output(out_dir, "--out", folder=True)
    if source is not None:
        check_source(source)
    if keep_shards or shard_items is not None:
        apart = {"--add": add is not None, "--delete": bool(delete), "--compact": compact}
        apart |= {
            "--verify": verify,
            "--overwrite": overwrite,
            "--engine ray": cluster.engine == "ray",
        }
        apart |= {"--checkpoint": checkpoint is not None, "--backbone": backbone is not None}
        return index_set_only(source, out_dir, config, log, shard_items, apart)
    if verify:
        return verify_only(source, bool(delete or compact or add), log)
    if delete or compact:
        return keep_bundle(source, delete or [], compact, add, log)
    if add is not None:
        if backbone is not None:
            raise UsageError("--add embeds with the bundle's own network: drop --backbone")
        return add_to(source, add, split, embedding, log, checkpoint)
    if source is None:
        bundle, meta = index_latest_run(runs_dir(), config, embedding, log, overwrite=overwrite)
    elif is_vectors_folder(Path(source)):
        images_only = {"--follow-links": follow_links, "--checkpoint": checkpoint is not None}
        images_only |= {"--backbone": backbone is not None, "--split": split is not None}
        refuse_image_options(source, images_only)
        if out_dir is not None:
            check_apart(Path(source), out_dir)
        build = ray_build(cluster)
        bundle, meta = index_vectors(Path(source), out_dir, config, log, overwrite, build)
    elif cluster.engine == "ray":
        raise UsageError(RAY_INDEXES)
    elif checkpoint is None and backbone is None:
        raise UsageError(
            f"{source} is not an embed output folder; to index images pass --checkpoint "
            "or --backbone"
        )
    else:
        model_from = model_source(checkpoint, backbone, weights, image_size, resize_size)
        bundle, meta = index_images(
            source, model_from, out_dir, split, config, embedding, log, overwrite=overwrite
        )
    with to_stdout():
        factory = meta.get("factory", "?")
        if "binary" in meta:
            factory += f", {meta['binary']['bits']}-bit codes"
        out.print(literal(f"indexed {counted(meta['count'], 'item')} ({factory}) in {bundle}"))


def index_set_only(
    source: str | None,
    out_dir: Path | None,
    config: IndexConfig,
    log: Reporter,
    shard_items: int | None,
    apart: dict[str, bool],
) -> None:
    """--keep-shards: a bundle set from an embed folder (pactl.index.sets)."""
    from pactl.verbs.index import index_set

    for flag in [flag for flag, on in apart.items() if on]:
        why = f": {SET_APART[flag]}" if flag in SET_APART else ""
        raise UsageError(f"{flag} does not go with --keep-shards, which builds a bundle set{why}")
    if source is None or not is_vectors_folder(Path(source)):
        raise UsageError(
            "--keep-shards makes a bundle set of an embed folder's shards: embed the images "
            "first (`pactl embed IMAGES --shard i/n --out VECTORS`), then `pactl index VECTORS "
            "--keep-shards --out SET`"
        )
    if out_dir is not None:
        check_apart(Path(source), out_dir)
    folder, meta = index_set(Path(source), out_dir, config, log, shard_items)
    shards = counted(len(meta["shards"]), "shard bundle")
    line = f"indexed {counted(meta['count'], 'item')} ({meta['factory']}) in {folder}: {shards}"
    with to_stdout():
        out.print(literal(line))


SET_APART = {  # why an option does not go with --keep-shards, where its name does not say
    "--engine ray": "Ray's index tasks fill the lists of one bundle, merged here, and none "
    "writes a shard bundle; build the set here from the Ray-embedded shards: drop --engine ray",
}
RAY_INDEXES = (
    "--engine ray builds a bundle from an embed folder: embed the images first (`pactl embed "
    "IMAGES --engine ray --out VECTORS`), then `pactl index VECTORS --engine ray`"
)


def ray_build(cluster: EngineConfig) -> Any:
    """index_vectors' `build` for --engine ray, or None to build here."""
    if cluster.engine != "ray":
        return None
    from pactl.engines.indexing import ray_builder

    return ray_builder(cluster)


def is_vectors_folder(path: Path) -> bool:
    """An embed output folder (vectors.npy, or shards/), or vectors in the Parquet layout
    (embeddings/ and metadata/, from `pactl export --to parquet` or clip-retrieval)."""
    parquet = (path / "embeddings").is_dir() and (path / "metadata").is_dir()
    return (path / "vectors.npy").is_file() or (path / "shards").is_dir() or parquet


def index_config(
    factory: str | None,
    target_recall: float,
    on_disk: OnDisk,
    faiss_device: FaissDevice,
    budgets: tuple[float, float] = (8.0, 10.0),
) -> IndexConfig:
    """The options as an IndexConfig, checked before any embedding: a factory FAISS cannot
    parse, or --faiss-device gpu on a machine without one, is said at once."""
    config = IndexConfig(
        factory=factory,
        target_recall=target_recall,
        on_disk=on_disk.value,
        faiss_device=faiss_device.value,
        memory_budget_gb=budgets[0],
        query_budget_ms=budgets[1],
    )
    check(config, option_name, UsageError)
    if factory is not None:
        from pactl.index.build import check_factory_parses

        try:
            check_factory_parses(factory)
        except PactlError as e:
            raise UsageError(f"--factory: {e}") from None
    if faiss_device.value == "gpu":
        from pactl.index.gpus import faiss_gpus

        faiss_gpus(config.faiss_device)
    return config


def binary_options(
    config: IndexConfig, binary: bool | None, bits: int | None, rotation: str, rescore: int | None
) -> IndexConfig:
    """--binary and its settings in the config, whole bytes checked before any work (the
    vectors' dimension, and so the most bits, is checked when they are read)."""
    import dataclasses

    if bits is not None and bits % 8:
        raise UsageError(f"--bits {bits}: codes are whole bytes; give a multiple of 8 (64, 128)")
    config = dataclasses.replace(
        config, binary=binary, bits=bits or 0, rotation=rotation, rescore=rescore
    )
    return check(config, option_name, UsageError)


def add_to(
    source: str | None,
    add: Path,
    split: str | None,
    embedding: EmbedConfig,
    log: Reporter,
    checkpoint: Path | None = None,
) -> None:
    """--add: embed `source` with the bundle's own network and add it, without a rebuild
    (`checkpoint`: that network's file, where the recorded one moved; another is refused)."""
    from pactl.verbs.add import add_to_index

    if source is None:
        raise UsageError("--add needs the images to add: pactl index IMAGES --add BUNDLE")
    done = add_to_index(source, add, split, embedding, log, checkpoint=checkpoint)
    replaced = done["replaced"]
    also = f" and replaced {counted(replaced, 'changed one')}" if replaced else ""
    added = counted(done["added"], "item")
    with to_stdout():
        out.print(literal(f"added {added}{also} to {add} ({done['count']:,} in all)"))


def refuse_image_options(source: str, given: dict[str, bool]) -> None:
    for flag in [flag for flag, on in given.items() if on]:
        raise UsageError(
            f"{flag} is for indexing images; {source} holds vectors already embedded "
            "(`pactl embed` takes it)"
        )


def keep_bundle(
    bundle: str | None, delete: list[str], compact: bool, add: Path | None, log: Reporter
) -> None:
    """`pactl index BUNDLE --delete ID_OR_PATH... [--compact]`: tombstones, then compaction."""
    from pactl.index import bundle_count, compact_bundle, delete_items

    if bundle is None:
        raise UsageError("--delete and --compact need the bundle: pactl index BUNDLE --delete ID")
    if add is not None:
        raise UsageError("--add does not go with --delete or --compact: run them one after another")
    names = [given for name in delete for given in (stdin_names() if name == "-" else [name])]
    if delete and not names:
        raise PactlError("--delete - read no ids or paths from standard input")
    ids = [int(name) for name in names if re.fullmatch(r"[0-9]+", name)]
    paths = [name for name in names if not re.fullmatch(r"[0-9]+", name)]
    lines = []
    if names:
        n = delete_items(Path(bundle), ids, paths, log)
        lines.append(
            f"deleted {counted(n, 'item')} from {bundle} ({bundle_count(Path(bundle)):,} left)"
        )
    if compact:
        done = compact_bundle(Path(bundle), log)
        lines.append(
            f"compacted {bundle}: removed {counted(done['removed'], 'deleted item')} "
            f"({done['count']:,} in all)"
        )
    with to_stdout():
        for line in lines:
            out.print(literal(line))


def verify_only(bundle: str | None, other_work: bool, log: Reporter) -> None:
    """`pactl index --verify BUNDLE`: the bundle's files against their recorded checksums."""
    from pactl.index import UNSEALED, verify_bundle_or_set

    if bundle is None:
        raise UsageError("--verify needs the bundle: pactl index --verify BUNDLE")
    if other_work:
        raise UsageError("--verify goes alone: run --add, --delete or --compact apart from it")
    checked = verify_bundle_or_set(Path(bundle), log)
    if checked is None:
        line = (
            f"{bundle}: no checksums recorded (written by an older pactl): sizes, headers and "
            "label codes checked; rebuild it with `pactl index` to record them"
        )
    else:
        files = counted(len(checked.files), "file")
        line = f"verified {bundle}: {files} ({checked.size:,} bytes) match their checksums"
        line += " and so do meta.json's fields" if checked.meta else f"; {UNSEALED}"
    with to_stdout():
        out.print(literal(line))


def check_apart(vectors: Path, bundle: Path) -> None:
    """A bundle is never written into the vectors folder it is built from (or a folder inside
    it): its items.csv and meta.json would replace the vectors' own."""
    source, target = vectors.resolve(), bundle.resolve()
    if target == source or source in target.parents:
        raise UsageError(
            f"--out {bundle} is the vectors folder {vectors} or inside it: the bundle would "
            "overwrite its own input; give another folder"
        )
