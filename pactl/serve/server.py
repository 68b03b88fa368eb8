"""Start the service: bind first (a taken port is one line, before seconds of loading), load
the model and bundle once, then serve with uvicorn until SIGINT or SIGTERM."""

from __future__ import annotations

import socket

from pactl.console import Reporter, counted
from pactl.errors import PactlError
from pactl.serve.config import ServeConfig, check_config

MAX_CONNECTIONS = 256  # concurrent connections; past this a client gets 503 at once


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
    import uvicorn

    from pactl.serve.app import create_app
    from pactl.serve.engine import Engine

    check_config(config)
    sock = bind(config.host, config.port)
    engine = Engine(config)
    app = create_app(config, engine)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    items = engine.snapshot.bundle.live_count
    reporter.log(f"serving {config.bundle} ({counted(items, 'item')}) on http://{shown}:{port}/")
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            limit_concurrency=MAX_CONNECTIONS,
            timeout_keep_alive=5,
            server_header=False,
        )
    )
    server.run(sockets=[sock])
