"""pactl.audit.processes.in_chunks: chunks in order, progress counted, processes only
where asked."""

from __future__ import annotations

import pytest

from pactl.audit.processes import in_chunks


def test_chunks_come_back_in_order_from_processes() -> None:
    """sum over chunks of 3 of 0..10 in 2 processes: [3, 12, 21, 19], and 11 items advanced."""
    advanced: list[int] = []
    got = in_chunks(sum, list(range(11)), 3, 2, advanced.append, least=1)
    assert got == [3, 12, 21, 19] and sorted(advanced) == [2, 3, 3, 3]


def test_few_items_stay_in_this_process() -> None:
    """A lambda cannot be sent to another process: below `least` it runs here, at `least` the
    pool refuses it."""
    advanced: list[int] = []
    assert in_chunks(lambda c: len(c), list(range(5)), 2, 2, advanced.append, least=6) == [2, 2, 1]
    assert advanced == [2, 2, 1]
    with pytest.raises(Exception, match="pickle|Pickl"):
        in_chunks(lambda c: len(c), list(range(6)), 2, 2, advanced.append, least=6)
