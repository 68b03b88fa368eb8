"""Checks on the JSON records pactl reads back (meta.json of vectors and bundles).

A record comes from disk, so from anyone: each field is checked for its type and range before
it is used, and a bad one is one line naming the file and the field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pactl.errors import PactlError


def read_json_object(path: Path, shown: Path, what: str) -> dict[str, Any]:
    """A JSON object from `path`, or one line naming it as `shown` and saying it is not `what`
    (e.g. "a pactl bundle's meta.json") and why."""
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise PactlError(f"cannot read {shown}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise PactlError(f"{shown} is not {what} (not UTF-8 text)") from None
    except (json.JSONDecodeError, RecursionError) as e:
        raise PactlError(f"{shown} is not {what} (bad JSON: {e})") from None
    if not isinstance(value, dict):
        raise PactlError(f"{shown} is not {what} (a JSON {type(value).__name__}, not an object)")
    return value


def field(
    record: dict[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    where: Path,
    low: float | None = None,
    high: float | None = None,
    optional: bool = False,
) -> Any:
    """`record[key]`, checked: present (unless `optional`, then None when absent), of `kind`
    (bool is not an int here), and for numbers finite and within [low, high]."""
    if key not in record or (optional and record[key] is None):
        if optional:
            return None
        raise PactlError(f"{where} lacks the field {key!r}")
    value = record[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise PactlError(
            f"{where}: field {key!r} should be {names}, not {type(value).__name__} {value!r:.40}"
        )
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise PactlError(f"{where}: field {key!r} is {value}")
        if (low is not None and value < low) or (high is not None and value > high):
            raise PactlError(
                f"{where}: field {key!r} is {value}, outside [{low:g}, {high:g}]"
                if low is not None and high is not None
                else f"{where}: field {key!r} is {value}, out of range"
            )
    return value
