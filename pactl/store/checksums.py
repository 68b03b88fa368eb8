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
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pactl.errors import PactlError

ALGORITHM = "blake2b-256"  # in hashlib everywhere, fast in pure CPython, no extra to install
CHUNK = 1 << 20  # bytes hashed per read


def file_digest(path: Path, advance: Callable[[int], None] | None = None) -> str:
    """The hex blake2b-256 digest of the file; `advance(n)` after each n bytes hashed."""
    digest = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
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


@dataclass(frozen=True)
class Checked:
    """What a full check found: the files whose content was compared, and their bytes."""

    files: tuple[str, ...]
    size: int


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
