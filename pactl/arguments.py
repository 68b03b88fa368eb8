"""The Python API's arguments checked as the command line checks its options, by one decorator.

`pactl train --name 123` cannot give a number where a name is wanted, and `--k abc` never reaches
the search: Typer and the config rules refuse it first. A Python caller can pass anything, and a
wrong type then failed deep inside as a TypeError. `@checked()` on each public function and
class of the API (pactl.api, pactl.losses) checks every argument given against the rule its
name declares in ARGUMENTS, one rule per name wherever it appears, and refuses a wrong one with
one UsageError line naming the function, the argument, what it must be and what it got. An
argument whose default is None may be None. A name without a rule is a mistake in pactl found
as the module is imported, so no public argument goes unchecked.

What a value means (an existing file, a known preset, a device that is there) is the verb's
own check, as for the CLI; these rules only make sure it gets a value of the right kind.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
from collections.abc import Callable, Sequence
from numbers import Integral, Real
from typing import Any, ParamSpec, TypeVar

import numpy as np

from pactl.errors import UsageError
from pactl.rules import Rule, device, flag, shown

P = ParamSpec("P")
R = TypeVar("R")


def _whole(value: Any) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _real(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def whole(low: int) -> Rule:
    """An integer (numpy's too) of at least `low`."""
    return Rule(f"an integer of at least {low:,}", lambda v: _whole(v) and v >= low)


def real(low: float = -math.inf, above: bool = False) -> Rule:
    """A finite number (numpy's too) of at least `low`, or above it when `above`."""
    if low == -math.inf:
        return Rule("a finite number", _real)
    words = f"a finite number {'above' if above else 'of at least'} {low:g}"
    return Rule(words, lambda v: _real(v) and (v > low if above else v >= low))


def _path(value: Any) -> bool:
    if not isinstance(value, str | os.PathLike):
        return False
    text = os.fspath(value)
    return isinstance(text, str) and text != "" and "\0" not in text


PATH = Rule("a path (a str or os.PathLike)", _path)
TEXT = Rule("a non-empty string", lambda v: isinstance(v, str) and v != "" and "\0" not in v)


def _model(value: Any) -> bool:
    from pactl.config import ModelConfig

    return _path(value) or isinstance(value, ModelConfig)


def _many(item: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """A list or tuple (any sequence but a string) whose every item passes `item`."""
    return lambda v: (
        isinstance(v, Sequence) and not isinstance(v, str | bytes) and all(map(item, v))
    )


def _array(value: Any) -> bool:
    """Numbers in one or two dimensions: a numpy array, or lists of numbers."""
    try:
        x = np.asarray(value)
    except (TypeError, ValueError):
        return False
    return x.ndim in (1, 2) and x.size > 0 and (np.issubdtype(x.dtype, np.number))


ANY = Rule("anything", lambda v: True)  # checked by the function itself (images, generators)
MODEL = Rule("a checkpoint's path or a ModelConfig", _model)
ARRAY = Rule("a (N, D) or (D,) array of numbers", _array)
ARGUMENTS: dict[str, Rule] = {  # every argument of the public API, by name
    "path": PATH,
    "folder": PATH,
    "source": PATH,
    "out": PATH,
    "vectors": PATH,
    "resume": PATH,
    "checkpoint": MODEL,
    "model": MODEL,
    "name": TEXT,
    "preset": TEXT,
    "split": TEXT,
    "factory": TEXT,
    "rotation": TEXT,
    "device": device(),
    "faiss_device": Rule("one of auto, cpu, gpu", lambda v: v in ("auto", "cpu", "gpu")),
    "k": whole(1),
    "rescore": whole(0),
    "bits": whole(0),
    "workers": whole(0),
    "batch_size": whole(1),
    "ks": Rule("a list of integers", _many(_whole)),
    "ids": Rule("a list of integers", _many(_whole)),
    "paths": Rule("a list of paths", _many(_path)),
    "names": Rule("a list of strings", _many(lambda v: isinstance(v, str))),
    "target_recall": Rule("a number above 0 and at most 1", lambda v: _real(v) and 0 < v <= 1),
    "progress": flag(),
    "overwrite": flag(),
    "exclude_self": flag(),
    "binary": flag(),
    "images": ANY,
    "image": ANY,
    # the losses' settings (pytorch-metric-learning's names): a NaN would train on NaN
    "num_classes": whole(1),
    "embedding_size": whole(1),
    "alpha": real(0, above=True),
    "beta": real(0, above=True),
    "softmax_scale": real(0, above=True),
    "margin": real(),
    "pos_margin": real(),
    "neg_margin": real(),
    "base": real(),
    "epsilon": real(0),
    "generator": ANY,
    "loss": ANY,
    "lr": real(0, above=True),
    "proxy_lr_mult": real(0, above=True),
}
ALWAYS = frozenset({"self"})  # bound, never given by a caller


def checked(**overrides: Rule) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Check each argument a call gives against ARGUMENTS (or `overrides`, for a name that means
    something else here); a wrong one, a missing or an unknown one is one UsageError line."""

    def wrap(function: Callable[P, R]) -> Callable[P, R]:
        signature = inspect.signature(function)
        who = function.__qualname__.removesuffix(".__init__")
        rules = _rules_of(signature, who, overrides)

        @functools.wraps(function)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as e:
                raise UsageError(f"{who}: {e}") from None
            given = bound.arguments
            for name, rule in rules.items():
                if name in given and not rule.ok(given[name]):
                    value = given[name]
                    raise UsageError(
                        f"{who}: {name} must be {rule.wants}, not {shown(value)} "
                        f"({type(value).__name__})"
                    )
                if isinstance(given.get(name), np.generic):  # FAISS and torch take Python's
                    given[name] = given[name].item()
            return function(*bound.args, **bound.kwargs)

        return call

    return wrap


def _rules_of(
    signature: inspect.Signature, who: str, overrides: dict[str, Rule]
) -> dict[str, Rule]:
    """The rule of each named parameter (None allowed where it is the default)."""
    rules = {}
    for name, parameter in signature.parameters.items():
        if name in ALWAYS or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        rule = overrides.get(name) or ARGUMENTS.get(name)
        if rule is None:
            raise RuntimeError(f"{who}: no rule for its argument {name!r} in pactl.arguments")
        rules[name] = _or_none(rule) if parameter.default is None else rule
    return rules


def _or_none(rule: Rule) -> Rule:
    return Rule(f"{rule.wants}, or None", lambda v: v is None or rule.ok(v))


def unit_queries(vectors: Any, dimension: int) -> np.ndarray:
    """Query vectors as (N, dimension) float32 unit rows: each row scaled to length 1 (a
    cosine is a matter of direction, so a row of another length asks the same question); a
    row that holds NaN or Inf, or is all zeros (no direction), is one UsageError line."""
    x = np.atleast_2d(np.asarray(vectors, dtype=np.float64))
    if x.ndim != 2 or x.shape[1] != dimension:
        raise UsageError(f"query vectors must be (N, {dimension}), not {x.shape}")
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        raise UsageError(f"query vector {int(np.argmax(bad))} holds NaN or Inf")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if (norms == 0).any():
        raise UsageError(f"query vector {int(np.argmax(norms[:, 0] == 0))} is all zeros")
    return (x / norms).astype(np.float32)
