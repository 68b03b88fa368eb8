"""What a setting may hold: rules with their words, and the limits they use.

Every config is checked field by field before it is used, whether it comes from the command
line, a run's config.json or a checkpoint: a value out of range fails late (a seed of -1 in
the sampler, a NaN learning rate after an epoch) or costs a lot before it fails (an image side
of 20000 asks for gigabytes per batch). A config field declares its rule once
(pactl.config.setting); the checks, the messages and the CLI's choices are read from it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

MIN_IMAGE_SIZE = 8  # the smallest crop side; a backbone may need more (pactl.model checks it)
MAX_IMAGE_SIZE = 4096  # a batch of 4096 px crops already takes gigabytes
MAX_RESIZE_SIZE = 2 * MAX_IMAGE_SIZE
MAX_EMBEDDING_DIM = 8192
MAX_BITS = MAX_EMBEDDING_DIM  # a --bits network's head is its embedding
MAX_DIMENSION = 65536  # pooled features of any backbone
MAX_EPOCHS = 100_000
MAX_BATCH_SIZE = 65_536
COMMIT_EVERY = 4096  # images between progress commits of an embed (a kill loses at most these)
MAX_COMMIT_EVERY = 10_000_000
MAX_WORKERS = 256
MAX_SEED = 2**32 - 1  # seeds are mixed with epochs and ranks and must stay within 64 bits
MAX_K = 1_000_000  # Recall@K: K neighbours per query
INTERPOLATIONS = ("nearest", "nearest-exact", "bilinear", "bicubic", "box", "hamming", "lanczos")
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d{1,4})?")


@dataclass(frozen=True)
class Rule:
    """What a field must hold, in words for the message, and the test; `names` for a choice
    (the CLI's choices are these)."""

    wants: str
    ok: Callable[[Any], bool]
    names: tuple[str, ...] = ()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


def integer(low: int, high: int | None = None) -> Rule:
    """An integer in [low, high], or of at least `low` where no `high` is given."""
    if high is None:
        return Rule(f"an integer of at least {low:,}", lambda v: _is_int(v) and low <= v)
    return Rule(f"an integer from {low:,} to {high:,}", lambda v: _is_int(v) and low <= v <= high)


def number(low: float, high: float, above: bool = False, below: bool = False) -> Rule:
    """A finite number in [low, high], in (low, high] when `above`, in [low, high) when
    `below`."""
    start = "a number above" if above else "a number from"
    end = "and below" if below else "and at most" if above else "to"
    return Rule(
        f"{start} {low:g} {end} {high:g}",
        lambda v: (
            _is_number(v)
            and (low < v if above else low <= v)
            and (v < high if below else v <= high)
        ),
    )


def cosine() -> Rule:
    return Rule("a cosine from -1 to 1", number(-1, 1).ok)


def choice(*names: str) -> Rule:
    return Rule(
        f"one of {', '.join(names)}", lambda v: isinstance(v, str) and v in names, names=names
    )


def text() -> Rule:
    return Rule("a non-empty string", lambda v: isinstance(v, str) and v != "" and "\0" not in v)


def code_bits(high: int) -> Rule:
    """0 (float vectors) or a multiple of 8 from 8 to `high`: binary codes are whole bytes."""
    return Rule(
        f"0 (float vectors) or a multiple of 8 from 8 to {high:,}",
        lambda v: _is_int(v) and (v == 0 or (8 <= v <= high and v % 8 == 0)),
    )


def path() -> Rule:
    return Rule("a path", lambda v: isinstance(v, PurePath))


def paths() -> Rule:
    return Rule("a tuple of paths", lambda v: isinstance(v, tuple) and all(map(path().ok, v)))


def texts() -> Rule:
    """A tuple of non-empty strings (names, each checked by its own rule where it has one)."""
    return Rule(
        "a tuple of non-empty strings", lambda v: isinstance(v, tuple) and all(map(text().ok, v))
    )


def flag() -> Rule:
    return Rule("true or false", lambda v: isinstance(v, bool))


def optional(rule: Rule) -> Rule:
    return Rule(f"{rule.wants}, or null", lambda v: v is None or rule.ok(v), names=rule.names)


def numbers(count: int, item: Rule) -> Rule:
    return Rule(
        f"{count} numbers, each {item.wants}",
        lambda v: isinstance(v, tuple) and len(v) == count and all(item.ok(x) for x in v),
    )


def integers(most: int, low: int, high: int) -> Rule:
    """A tuple of 1 to `most` integers, each from `low` to `high`."""
    item = integer(low, high)
    return Rule(
        f"1 to {most} integers from {low:,} to {high:,}",
        lambda v: isinstance(v, tuple) and 0 < len(v) <= most and all(item.ok(k) for k in v),
    )


def device() -> Rule:
    return Rule(
        "auto, cpu, mps, cuda or cuda:N",
        lambda v: isinstance(v, str) and DEVICE_PATTERN.fullmatch(v) is not None,
    )


NOISE_KINDS = ("symmetric", "small_cluster")  # --label-noise RATE[:KIND] (pactl.training.noise)


def label_noise_parts(value: Any) -> tuple[float, str] | None:
    """`0.2` or `0.5:small_cluster` as (rate, kind), the kind symmetric when left out; None when
    `value` is no such text or its rate is outside [0, 1)."""
    if not isinstance(value, str):
        return None
    rate_text, _, kind = value.strip().partition(":")
    kind = kind.strip() or NOISE_KINDS[0]
    try:
        rate = float(rate_text)
    except ValueError:
        return None
    if kind not in NOISE_KINDS or not (math.isfinite(rate) and 0 <= rate < 1):
        return None
    return rate, kind


def label_noise() -> Rule:
    return Rule(
        f"RATE or RATE:KIND, RATE a number from 0 and below 1, KIND {' or '.join(NOISE_KINDS)}",
        lambda v: label_noise_parts(v) is not None,
    )


AUTO = "auto"  # --drop-noisy auto: the share each class's estimated noise rate says


def share_or_auto() -> Rule:
    """A share from 0 and below 1, or auto (--drop-noisy)."""
    share = number(0, 1, below=True)
    return Rule(f"{share.wants}, or {AUTO}", lambda v: v == AUTO or share.ok(v))


def number_or_text(text: str) -> float | str:
    """The number `text` spells, else `text` itself (a setting that takes a number or a word,
    whose rule then names what it wants)."""
    try:
        return float(text)
    except ValueError:
        return text


def shown(value: Any) -> str:
    """A value as a message quotes it: its repr, cut at 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
