"""A bundle's lineage: the checkpoint that made it (where it was recorded, or beside the
bundle) and that checkpoint's same-item calibration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pactl.console import Reporter
from pactl.errors import PactlError


def checkpoint_calibration(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The same-item calibration of the checkpoint that made the vectors of `meta`, while it
    holds the same weights; None for a backbone's vectors or a checkpoint never calibrated."""
    recorded = meta.get("checkpoint")
    if not recorded or not Path(recorded).is_file():
        return None
    from pactl.checkpoint import load  # torch: only when there is a checkpoint to read

    payload = load(Path(recorded))
    if payload.get("fingerprint") != meta.get("fingerprint"):
        return None
    calibration = payload.get("calibration")
    return calibration if isinstance(calibration, dict) else None


def calibration_to_copy(meta: dict[str, Any], reporter: Reporter) -> dict[str, Any] | None:
    """What a new bundle records of its checkpoint's calibration; a checkpoint that cannot be
    read now (the vectors need only its record) leaves the bundle without one, said once."""
    try:
        return checkpoint_calibration(meta)
    except PactlError as e:
        reporter.warn(f"the bundle records no same-item calibration: {e}")
        return None


def calibration_of(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The same-item calibration recorded in a bundle's meta.json, else its checkpoint's (one
    calibrated after the bundle was built), else None."""
    recorded = meta.get("calibration")
    if isinstance(recorded, dict):
        return recorded
    return checkpoint_calibration(meta)


def bundle_checkpoint(meta: dict[str, Any], bundle_dir: Path) -> Path | None:
    """The checkpoint that made a bundle: where it was recorded, else where it lies relative to
    the bundle (the two moved together); None for a backbone's bundle."""
    recorded = meta.get("checkpoint")
    if not recorded:
        return None
    relative = meta.get("checkpoint_relative")
    for candidate in (Path(recorded), bundle_dir / relative if relative else None):
        if candidate is not None and candidate.is_file():
            return candidate
    raise PactlError(
        f"the checkpoint that made {bundle_dir} is not at {recorded} any more"
        + (f" nor at {bundle_dir / relative}" if relative else "")
        + ": pass the same checkpoint with --checkpoint PATH"
    )


def records_network(meta: dict[str, Any]) -> bool:
    """Whether a bundle names the network that made its vectors (a checkpoint, or a backbone's
    model_config); one built from another tool's vectors folder names none."""
    return bool(meta.get("checkpoint")) or isinstance(meta.get("model_config"), dict)


def no_network(bundle_dir: Path, who: str, instead: str) -> PactlError:
    """The one line of a command that would embed images for a bundle that records no network:
    why it cannot, and `instead`, what can."""
    return PactlError(
        f"{bundle_dir} records no network (its vectors came from another tool's folder, without "
        f"pactl's meta.json), so {who} cannot embed images for it: {instead}"
    )
