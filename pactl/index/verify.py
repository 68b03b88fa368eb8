"""`pactl index --verify` and `pactl serve`'s start: a bundle's files against the content
checksums its meta.json records (pactl.store.checksums), after the cheap checks every open makes."""

from __future__ import annotations

from pathlib import Path

from pactl.console import QUIET, Reporter
from pactl.index.reading import load_bundle, read_meta
from pactl.store import checksums
from pactl.store.generations import read_current

FIX = "rebuild the bundle with `pactl index`"


def verify_bundle(path: Path, reporter: Reporter | None = None) -> checksums.Checked | None:
    """Open the bundle (sizes, headers, counts, label codes: what every open checks), then hash
    each file its meta.json has a checksum for, with a progress bar over the bytes. Returns
    what was checked, or None for a bundle written before checksums (nothing to compare).
    PactlError naming the first damaged file."""
    load_bundle(path)
    log = reporter or QUIET

    def read(gen: Path) -> checksums.Checked | None:
        digests = checksums.recorded(read_meta(path, gen))
        if digests is None:
            return None
        total = sum((gen / name).stat().st_size for name in digests if (gen / name).is_file())
        with log.bar(f"verifying {path}", total) as advance:
            return checksums.check(gen, digests, path, FIX, advance)

    return read_current(path, read)
