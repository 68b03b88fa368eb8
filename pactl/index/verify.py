"""`pactl index --verify` and `pactl serve`'s start: a bundle's files and meta.json's own
fields against the content checksums its meta.json records (pactl.store.checksums), after the
cheap checks every open makes; and no file of it shared with a file outside it (a hard link)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pactl.console import QUIET, Reporter
from pactl.errors import PactlError
from pactl.index.reading import load_bundle, read_meta
from pactl.store import checksums
from pactl.store.generations import read_current

FIX = "rebuild the bundle with `pactl index`"
UNSEALED = (  # what a check of a bundle from before meta.json's own digest cannot vouch for
    "meta.json's own fields (its settings) carry no checksum (an older pactl's bundle) and "
    "were not verified: rebuild it with `pactl index` to cover them"
)


def verify_bundle(path: Path, reporter: Reporter | None = None) -> checksums.Checked | None:
    """Open the bundle (sizes, headers, counts, label codes: what every open checks), refuse a
    file that is a hard link to one outside it, check meta.json's fields against the digest it
    records of them, then hash each file its meta.json has a checksum for, with a progress bar
    over the bytes. Returns what was checked (`meta`: whether meta.json's fields were), or None
    for a bundle written before checksums (nothing to compare). PactlError naming the first
    damaged or shared file."""
    load_bundle(path)
    log = reporter or QUIET

    def read(gen: Path) -> checksums.Checked | None:
        _refuse_shared(path, gen)
        meta = read_meta(path, gen)
        covered = checksums.check_meta(meta, path / "meta.json", FIX)  # a sealed one needs it
        digests = checksums.recorded(meta)
        if digests is None:
            return None
        total = sum((gen / name).stat().st_size for name in digests if (gen / name).is_file())
        with log.bar(f"verifying {path}", total) as advance:
            checked = checksums.check(gen, digests, path, FIX, advance)
        return dataclasses.replace(checked, meta=covered)

    return read_current(path, read)


def _refuse_shared(path: Path, gen: Path) -> None:
    """One line when a file of the bundle is also a file outside it: writing that one (a
    vectors folder's vectors.npy, which an older pactl linked as floats.npy) would change the
    bundle's answers without a write to the bundle."""
    shared = checksums.shared_outside(path, gen)
    if shared:
        raise PactlError(
            f"{path / shared[0]} is a hard link to a file outside the bundle (a vectors folder's "
            f"file, linked by an older pactl): a write there changes this bundle's answers; {FIX}"
            " to give it a copy of its own"
        )
