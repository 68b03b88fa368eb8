"""Start the service: bind first (a taken port is one line, before seconds of loading), load
the model and bundle once, then serve with uvicorn until SIGINT or SIGTERM."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from pactl.console import Reporter, counted
from pactl.errors import PactlError
from pactl.serve.config import ServeConfig, check_config

IN_FLIGHT = 256  # requests answered at once; past this a client gets 503 at once
KEEP_ALIVE_S = 5  # an idle connection between requests is closed after this


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise PactlError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def serve(config: ServeConfig, reporter: Reporter) -> None:
    import secrets
    from functools import partial

    import uvicorn

    from pactl.serve.app import create_app
    from pactl.serve.engine import Engine
    from pactl.serve.guard import Limits, guarded
    from pactl.serve.protocol import BoundedH11, connection_limits
    from pactl.serve.uploads import sweep_uploads

    check_config(config)
    sock = bind(config.host, config.port)
    try:
        engine = Engine(config)
    except BaseException:
        sock.close()  # a bundle that cannot be served leaves no socket behind
        raise
    swept = sweep_uploads(config.uploads, engine.snapshot.lookup)
    if swept:
        reporter.log(f"removed {counted(swept, 'unfinished upload')} from {config.uploads}")
    secret = secrets.token_urlsafe(32)  # the page's, for this process only
    limits = Limits(config.max_upload_bytes, config.client_timeout_s, IN_FLIGHT)
    app = guarded(create_app(config, engine, secret), config, secret, limits)
    connections = connection_limits(config.client_timeout_s)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    items = engine.snapshot.bundle.live_count
    line = f"serving {config.bundle} ({counted(items, 'item')}) on http://{shown}:{port}/"
    uvicorn_config = uvicorn.Config(
        app,
        http=partial(BoundedH11, connections=connections),  # type: ignore[arg-type]
        log_level="warning",
        access_log=False,
        limit_concurrency=None,  # guard.InFlight counts requests; slow sockets are not requests
        timeout_keep_alive=KEEP_ALIVE_S,
        server_header=False,
    )
    announcing(uvicorn_config, lambda: reporter.log(line)).run(sockets=[sock])


def announcing(config: Any, accepting: Callable[[], None]) -> Any:
    """uvicorn's Server that calls `accepting` once its socket accepts (after the app's
    startup), so a script that waits for the "serving on" line can connect at once."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                accepting()

    return Server(config)
