"""FAISS indexes over L2-normalised vectors: factory choice, build, tuning, bundles on disk.

A bundle is a folder of three files: `index.faiss` (FAISS ids are the item ids), `items.csv`
(`id,path,label`) and `meta.json` (format, version, model fingerprint, factory string, the tuned
search parameters and the Recall@10 they reached). Cosine similarity is the inner product of
L2-normalised vectors, so every index here uses METRIC_INNER_PRODUCT.

Deleted items (delete_items) stay in the index as tombstones listed in `deleted.npy`, which every
search skips, until compact_bundle (or a rebuild) removes them.

An IVF index over more vectors than memory holds is built shard by shard (build_ondisk_index):
its inverted lists go to a fourth file, `index.ivfdata`, which searches read through the page
cache.

A bundle's files change together: each save writes a new generation of the folder and switches
to it in one rename (pactl.store.generations.new_generation), so a reader, or a kill, sees the old
bundle or the new one, never a mix.

Rooms, in reading order: build.py (factory choice, training, adding), mapped.py (vectors read a
block at a time, the parts of an index), exact.py (exact neighbours by brute force), tune.py
(the search setting that meets a recall target), gpus.py (FAISS on GPUs), ondisk.py (an IVF
built shard by shard), bundle.py and reading.py (the bundle written and read), search.py,
upkeep.py (add, delete, compact), verify.py, dedup.py and grouping.py (near duplicates),
sharded.py and sets.py (bundle sets: shard bundles of one trained index answered as one), and
binary/ (binary bundles).
"""

from pactl.index.build import (
    FLAT_MAX_ITEMS,
    add_parts,
    add_vectors,
    build_index,
    build_parts,
    check_factory,
    check_parts,
    choose_factory,
    new_index,
)
from pactl.index.bundle import (
    BUNDLE_FILES,
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    DELETED_FILE,
    INDEX_FILE,
    ITEMS_FILE,
    META_FILE,
    REMOVED_FILE,
    Bundle,
    save_bundle,
    write_bundle,
)
from pactl.index.exact import exact_neighbours
from pactl.index.mapped import Part
from pactl.index.ondisk import (
    IVFDATA_FILE,
    MERGE_DIR,
    ON_DISK_CHOICES,
    PENDING_IVFDATA,
    build_ondisk_index,
    empty_like,
    wants_on_disk,
)
from pactl.index.reading import bundle_count, check_folder, load_bundle, rebuild_facts
from pactl.index.sets import (
    SET_FILES,
    SET_FORMAT,
    build_set,
    is_bundle_set,
    load_bundle_or_set,
    verify_bundle_or_set,
)
from pactl.index.tune import ann_recall, tune_search
from pactl.index.upkeep import add_to_bundle, compact_bundle, delete_items, refuse_set_shard
from pactl.index.verify import UNSEALED, verify_bundle
from pactl.store.item_table import ITEMS_HEADER, ItemTable
from pactl.store.vectors_folder import VECTORS_FORMAT

__all__ = [
    "BUNDLE_FILES",
    "BUNDLE_FORMAT",
    "BUNDLE_VERSION",
    "DELETED_FILE",
    "REMOVED_FILE",
    "FLAT_MAX_ITEMS",
    "INDEX_FILE",
    "ITEMS_FILE",
    "ITEMS_HEADER",
    "IVFDATA_FILE",
    "MERGE_DIR",
    "META_FILE",
    "ON_DISK_CHOICES",
    "PENDING_IVFDATA",
    "VECTORS_FORMAT",
    "Bundle",
    "ItemTable",
    "Part",
    "add_to_bundle",
    "add_parts",
    "add_vectors",
    "build_index",
    "build_parts",
    "check_parts",
    "build_ondisk_index",
    "bundle_count",
    "rebuild_facts",
    "check_factory",
    "check_folder",
    "choose_factory",
    "compact_bundle",
    "delete_items",
    "empty_like",
    "exact_neighbours",
    "load_bundle",
    "load_bundle_or_set",
    "is_bundle_set",
    "build_set",
    "verify_bundle_or_set",
    "refuse_set_shard",
    "SET_FILES",
    "SET_FORMAT",
    "new_index",
    "ann_recall",
    "save_bundle",
    "tune_search",
    "verify_bundle",
    "UNSEALED",
    "wants_on_disk",
    "write_bundle",
]
