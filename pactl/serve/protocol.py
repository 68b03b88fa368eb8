"""uvicorn's h11 protocol with what it lacks against slow clients: a deadline for a request's
headers (uvicorn times only the idle wait between requests, so a socket that connects and
trickles its headers, or sends nothing, lives forever) and a cap on connections, in all and
per client address. Everything else (parsing, the 16 KiB bound on headers, keep-alive) is
uvicorn's and h11's own."""

from __future__ import annotations

import asyncio
import resource
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

FILE_HEADROOM = 128  # descriptors kept for the bundle, uploads and the model's files


@dataclass
class Connections:
    """What every connection of one server shares: the limits and the count per client."""

    header_timeout_s: float  # from a connection's first byte (or its opening) to its headers
    most: int  # open connections in all
    per_client: int  # open connections from one address
    open: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.open.values())


def connection_limits(header_timeout_s: float, wanted: int = 4096) -> Connections:
    """Limits that fit the process's descriptors (its soft limit raised to the hard one where
    that is needed), half of them open to one client address."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted + FILE_HEADROOM:
        target = wanted + FILE_HEADROOM
        soft = target if hard == resource.RLIM_INFINITY else min(hard, target)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    most = max(16, min(wanted, soft - FILE_HEADROOM))
    return Connections(header_timeout_s, most, max(8, most // 2))


class BoundedH11(H11Protocol):
    """Closes a connection whose request headers are not in within the header deadline, and
    one past the connection caps at once."""

    def __init__(self, *args: Any, connections: Connections, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shared = connections
        self.deadline: asyncio.TimerHandle | None = None
        self.address = ""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.address = self.client[0] if self.client else ""
        shared = self.shared
        if shared.total >= shared.most or shared.open[self.address] >= shared.per_client:
            self.address = ""  # not counted: closed before it was
            transport.close()
            return
        shared.open[self.address] += 1
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.deadline is None and self._awaiting_headers():
            self._arm()  # a keep-alive connection's next request starts its own deadline
        super().data_received(data)
        if not self._awaiting_headers():
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.address:
            self.shared.open[self.address] -= 1
            if self.shared.open[self.address] <= 0:
                del self.shared.open[self.address]
            self.address = ""
        super().connection_lost(exc)

    def _awaiting_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self.deadline = self.loop.call_later(self.shared.header_timeout_s, self._late)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _late(self) -> None:
        self.deadline = None
        if self._awaiting_headers() and not self.transport.is_closing():
            self.transport.close()
