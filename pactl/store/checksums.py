"""Content checksums of a generation's files, recorded in its meta.json and checked against it.

meta.json's sizes catch a truncated file or one from another write; a same-size change (bytes
flipped in place) needs the content. A writer records, as it finishes a generation,

    "checksums": {"algorithm": "blake2b-256", "generation": NAME, "files": {name: hex}}

hashing each file right after it was written (from the page cache, before the generation is
switched in), except files hard-linked unchanged from the previous generation, whose recorded
digest is carried over. "generation" ties the record to the files it was made for: a pactl from
before checksums that rewrites the folder keeps unknown meta.json fields as they are, and a
record for another generation is then ignored (as "no checksums recorded"), never taken for
damage. Readers check sizes on every open (cheap) and the digests only when asked
(`pactl index --verify`, `pactl serve` at start): hashing costs a pass over every byte.

meta.json steers every answer (the rotation, the rescoring depth, search_params, thresholds,
the model's preprocessing), so the record also holds "meta": the digest of meta.json's own
fields as canonical JSON (keys sorted, no spaces), the record's "meta" itself left out. A
record without it (written before it) vouches for the files only, and the check says so.

A writer that seals also writes "sealed": the name of the generation it sealed, a top-level
field outside the record and inside the digest. It tells a bundle from before the digest apart
from one whose record was deleted or edited: while "sealed" names the meta.json's own
generation, a missing record, a record for another generation or a record without "meta" is
damage, never "not verified". (An older pactl that rewrites the folder keeps the field with
the old generation's name: that meta.json is then taken as the older writer's, as its record
is.) The digest has no key: it finds damage and edits, not a forger who rewrites it.

A bundle must be whole in itself: a file of its generation that is also a hard link to a file
outside the folder's generations (an older pactl linked a binary bundle's floats.npy to the
vectors file) changes when that file is written, with no write to the bundle; shared_outside
finds them (more links than the folder's generations hold).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pactl.errors import PactlError

ALGORITHM = "blake2b-256"  # in hashlib everywhere, fast in pure CPython, no extra to install
BLOCK_BYTES = 1 << 20  # bytes read at a time (hashed, copied)
META_KEY = "meta"  # the record's digest of meta.json's own fields
SEALED_KEY = "sealed"  # top level: the generation whose writer sealed meta.json
GENERATION_PREFIX = ".pactl-gen-"  # pactl.store.generations' folders (a sibling: no import)


def file_digest(path: Path, advance: Callable[[int], None] | None = None) -> str:
    """The hex blake2b-256 digest of the file; `advance(n)` after each n bytes hashed."""
    digest = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as f:
        while chunk := f.read(BLOCK_BYTES):
            digest.update(chunk)
            if advance is not None:
                advance(len(chunk))
    return digest.hexdigest()


def record(gen: Path, names: Iterable[str], known: dict[str, str] | None = None) -> dict[str, Any]:
    """The "checksums" record of the files `names` of generation folder `gen`; `known` gives
    digests already recorded for files linked unchanged from an earlier generation."""
    carried = known or {}
    files = {name: carried.get(name) or file_digest(gen / name) for name in sorted(names)}
    return {"algorithm": ALGORITHM, "generation": gen.name, "files": files}


def recorded(meta: dict[str, Any]) -> dict[str, str] | None:
    """The digests meta.json records for its own generation, by file name; None when it has
    none (written before checksums, or a record left by a writer of another generation)."""
    found = meta.get("checksums")
    if not isinstance(found, dict) or found.get("generation") != meta.get("generation"):
        return None
    files = found.get("files")
    if found.get("algorithm") != ALGORITHM or not isinstance(files, dict):
        return None
    return {str(k): v for k, v in files.items() if isinstance(v, str)}


def meta_digest(meta: dict[str, Any]) -> str:
    """The hex blake2b-256 of meta.json's fields as canonical JSON, less the record's "meta"."""
    fields = dict(meta)
    found = meta.get("checksums")
    if isinstance(found, dict):
        fields["checksums"] = {k: v for k, v in found.items() if k != META_KEY}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.blake2b(text.encode("ascii"), digest_size=32).hexdigest()


def seal(meta: dict[str, Any]) -> dict[str, Any]:
    """`meta` (with its "checksums" record) plus the digest of its own fields, computed on the
    JSON as it will be read back (a tuple is a list there, an int key a string)."""
    written: dict[str, Any] = json.loads(json.dumps(meta))
    written[SEALED_KEY] = written["generation"]  # before the digest, which covers it
    written["checksums"] = {**written["checksums"], META_KEY: meta_digest(written)}
    return written


def sealed(meta: dict[str, Any]) -> bool:
    """Whether meta.json says its own generation's writer sealed it (so it must hold a record
    of that generation with the digest of its fields)."""
    generation = meta.get("generation")
    return isinstance(generation, str) and meta.get(SEALED_KEY) == generation


def check_meta(meta: dict[str, Any], shown: Path, fix: str) -> bool:
    """Whether meta.json's fields match the digest its record holds of them: True when they
    do, False when it records none (a bundle written before the digest); one line when they
    differ (a field edited or damaged) or when a sealed meta.json lacks the record or its
    digest (deleted, or the record's generation edited)."""
    found = meta.get("checksums")
    if recorded(meta) is None or not isinstance(found, dict) or META_KEY not in found:
        if sealed(meta):
            raise PactlError(
                f"{shown} is damaged or was edited: it was sealed with a {ALGORITHM} checksum "
                f"of its fields, and its checksum record or that checksum is missing: {fix}"
            )
        return False
    if found[META_KEY] != meta_digest(meta):
        raise PactlError(
            f"{shown} is damaged or was edited: its fields do not match the {ALGORITHM} "
            f"checksum it records of them: {fix}"
        )
    return True


def shared_outside(folder: Path, gen: Path) -> list[str]:
    """The files of generation `gen` of `folder` that are hard links to a file outside the
    folder's generations (more links than those hold: an unchanged file linked from the
    previous generation counts as the folder's own)."""
    inside: Counter[tuple[int, int]] = Counter()
    folders = {gen, *(p for p in folder.iterdir() if p.name.startswith(GENERATION_PREFIX))}
    mine: dict[str, os.stat_result] = {}
    for where in folders:
        if not where.is_dir() or (where != gen and where.is_symlink()):
            continue
        for entry in os.scandir(where):
            if entry.is_file(follow_symlinks=False):
                facts = entry.stat(follow_symlinks=False)
                inside[(facts.st_dev, facts.st_ino)] += 1
                if where == gen:
                    mine[entry.name] = facts
    return sorted(name for name, f in mine.items() if f.st_nlink > inside[(f.st_dev, f.st_ino)])


@dataclass(frozen=True)
class Checked:
    """What a full check found: the files whose content was compared, and their bytes;
    `meta`: whether meta.json's own fields were checked too (a record with their digest)."""

    files: tuple[str, ...]
    size: int
    meta: bool = False


def check(
    gen: Path, digests: dict[str, str], shown: Path, fix: str, advance: Callable[[int], None]
) -> Checked:
    """Hash every file `digests` names in `gen` and compare; the first that differs is one
    line naming it (as `shown / name`) and what to do (`fix`)."""
    total = 0
    for name, expected in sorted(digests.items()):
        try:
            actual = file_digest(gen / name, advance)
            total += (gen / name).stat().st_size
        except OSError as e:
            raise PactlError(f"cannot read {shown / name}: {e.strerror or e}") from None
        if actual != expected:
            raise PactlError(
                f"{shown / name} is damaged: its content does not match the {ALGORITHM} "
                f"checksum meta.json records: {fix}"
            )
    return Checked(tuple(sorted(digests)), total)
