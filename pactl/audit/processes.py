"""Work shared among processes: a list cut into chunks, each handed to a function in one of
`workers` fresh processes (started by spawn, never forked: a parent holding torch's threads
forks badly), the results put back in the list's order; in this process where there is little.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

Result = TypeVar("Result")


def in_chunks(
    work: Callable[[Sequence[Any]], Result],
    items: Sequence[Any],
    chunk: int,
    workers: int,
    advance: Callable[[int], Any],
    least: int,
) -> list[Result]:
    """[work(items[0:chunk]), work(items[chunk:2 chunk]), ...], by `workers` processes where
    there are `least` items or more (in this one otherwise); `advance(n)` as each chunk of n
    items is done. `work` must be importable by name (a module's function, or a partial of one)."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    starts = range(0, len(items), chunk)
    if workers <= 1 or len(items) < least:
        results = []
        for start in starts:
            results.append(work(items[start : start + chunk]))
            advance(len(items[start : start + chunk]))
        return results
    done: dict[int, Result] = {}
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(work, items[s : s + chunk]): s for s in starts}
        for future in as_completed(futures):
            start = futures[future]
            done[start] = future.result()
            advance(len(items[start : start + chunk]))
    return [done[start] for start in starts]
