"""`pactl index --add`: the images a bundle lacks, or holds from before their file changed,
embedded with the bundle's own network and appended in one new generation.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pactl.config import EmbedConfig, ModelConfig, read_config
from pactl.console import Reporter, counted
from pactl.errors import PactlError
from pactl.verbs.embed import embed_source_files
from pactl.verbs.lineage import bundle_checkpoint, no_network, records_network
from pactl.verbs.sources import source_items
from pactl.verbs.vector_sources import gather_vectors

if TYPE_CHECKING:
    from pactl.checkpoint import ModelSource

# What adds to a bundle of another tool's vectors: that tool, and a rebuild.
ADD_INSTEAD = (
    "embed the new images with the tool that made its vectors, into its folder, and rebuild "
    "the bundle with `pactl index FOLDER --out BUNDLE`"
)


def add_to_index(
    source: str,
    bundle_dir: Path,
    split: str | None,
    config: EmbedConfig,
    reporter: Reporter,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    """Embed the images of `source` that the bundle lacks, or holds from before their file
    changed (size or mtime), with its own model and append them; a changed file's old item is
    deleted in the same new generation. Files gone from `source` are not deleted.

    `checkpoint`: the bundle's checkpoint where it lies now (its recorded place may be gone);
    one with other weights than the bundle's is refused before any work."""
    from pactl.index import check_folder, load_bundle, refuse_set_shard
    from pactl.store.generations import remove_stale, writer_lock

    check_folder(bundle_dir)
    with writer_lock(bundle_dir):  # one writer at a time; queries go on reading
        remove_stale(bundle_dir)  # a .add left by a killed --add
        bundle = load_bundle(bundle_dir, mmap=False)  # handed over: freed before the add
        refuse_set_shard(bundle_dir, bundle.meta)  # before any image is embedded
        if not records_network(bundle.meta):
            raise no_network(bundle_dir, "an add (`--add`, Index.add)", ADD_INSTEAD)
        if checkpoint is not None:
            check_own_checkpoint(checkpoint, bundle.meta, bundle_dir)
        files, labels = source_items(source, split, reporter, config.follow_links)
        return _add_locked(files, labels, source, bundle, bundle_dir, config, reporter, checkpoint)


def check_own_checkpoint(checkpoint: Path, meta: dict[str, Any], bundle_dir: Path) -> None:
    """Refuse a checkpoint whose weights are not those that made the bundle (fingerprints)."""
    from pactl import checkpoint as ckpt

    theirs = ckpt.fingerprint(ckpt.load(checkpoint)["model"])
    mine = meta.get("fingerprint")
    if theirs != mine:
        raise PactlError(
            f"{checkpoint} is not the network of {bundle_dir} (weights fingerprint "
            f"{theirs[:12]}, the bundle's {str(mine)[:12]}): --add embeds with the bundle's own "
            "network; give its checkpoint, or none, or build a new bundle"
        )


def _add_locked(
    files: list[Path],
    labels: list[str],
    source: str,
    bundle: Any,
    bundle_dir: Path,
    config: EmbedConfig,
    reporter: Reporter,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    from pactl.index import add_to_bundle, bundle_count

    new, changed, kept_out = _to_embed(files, labels, bundle)
    if kept_out:
        reporter.log(
            f"{counted(kept_out, 'image')} of {source} deleted from {bundle_dir} and unchanged "
            "since: left out (a changed file, e.g. touched, is added again)"
        )
    if not new:
        some = "every other image" if kept_out else "every image"
        reporter.log(f"{some} of {source} is already in {bundle_dir}, unchanged")
        return {"added": 0, "replaced": 0, "count": bundle.live_count}
    if changed:
        reporter.log(f"replacing {counted(len(changed), 'changed image')}")
    scratch = bundle_dir / ".add"
    first = bundle.next_id
    ids = np.arange(first, first + len(new), dtype=np.int64)
    recorded = checkpoint or bundle_checkpoint(bundle.meta, bundle_dir)
    model_from: ModelSource = recorded or read_config(
        ModelConfig, bundle.meta.get("model_config"), f"{bundle_dir / 'meta.json'}: model_config"
    )
    del bundle  # release the index file before it is rewritten
    try:
        embed_source_files(
            [f for f, _ in new],
            [lab for _, lab in new],
            ids,
            model_from,
            scratch,
            config,
            reporter,
            scratch=True,
        )
        vectors, items, meta = gather_vectors(scratch)
        # Only a changed file that was embedded again loses its old vector (one unreadable now
        # keeps it); old and new change places in one generation.
        replaces = [changed[k] for k in map(os.path.abspath, items.paths) if k in changed]
        add_to_bundle(
            bundle_dir, np.ascontiguousarray(vectors), items, meta, reporter, replaces=replaces
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    added = len(items) - len(replaces)
    return {"added": added, "replaced": len(replaces), "count": bundle_count(bundle_dir)}


def _to_embed(
    files: list[Path], labels: list[str], bundle: Any
) -> tuple[list[tuple[Path, str]], dict[str, int], int]:
    """The (file, label) pairs an --add embeds: those the bundle lacks, and those whose size or
    mtime_ns differs from what it recorded (unknown in older bundles: taken as unchanged); for
    the changed ones, their path -> the id of the live item they replace; and how many files
    were left out because they were deleted from the bundle (or compacted away) and are
    unchanged since (a sweep of the source folder does not bring back what was deleted; a
    changed file is new content and is added). Files gone from the source stay in the bundle."""
    items, removed = bundle.items, bundle.removed
    dead = bundle.is_deleted(items.ids).tolist()
    known: dict[str, int] = {}
    # path -> (size, mtime_ns) of a deleted item: compacted away, or a tombstone (newer)
    stats = zip(removed.sizes.tolist(), removed.mtimes.tolist(), strict=True)
    deleted = dict(zip(removed.paths, stats, strict=True))
    for at, (p, d) in enumerate(zip(items.paths, dead, strict=True)):
        if d:
            deleted[p] = (int(items.sizes[at]), int(items.mtimes[at]))
        else:
            known[p] = at
    new: list[tuple[Path, str]] = []
    changed: dict[str, int] = {}
    kept_out = 0
    for f, label in zip(files, labels, strict=True):
        key = os.path.abspath(f)
        row, gone = known.get(key), deleted.get(key)
        if row is None and gone is not None:
            if _changed(f, *gone):
                new.append((f, label))
            else:
                kept_out += 1
        elif row is None:
            new.append((f, label))
        elif _changed(f, int(items.sizes[row]), int(items.mtimes[row])):
            new.append((f, label))
            changed[key] = int(items.ids[row])
    return new, changed, kept_out


def _changed(file: Path, size: int, mtime_ns: int) -> bool:
    """Whether a file's size or mtime differs from the recorded one (-1: not recorded)."""
    try:
        now = os.stat(file)
    except OSError:
        return False  # gone or unreadable: its indexed vector stays
    return (size >= 0 and now.st_size != size) or (mtime_ns >= 0 and now.st_mtime_ns != mtime_ns)
