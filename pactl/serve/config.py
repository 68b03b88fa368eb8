"""What `pactl serve` is started with: one frozen dataclass, checked before anything loads."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from pactl.errors import UsageError

UPLOADS = "uploads"  # BUNDLE/uploads: where POST /add keeps the images it adds (default)
PUBLIC_PATHS = ("/", "/static/app.js", "/static/style.css", "/docs", "/openapi.json")
HOST_NAME = re.compile(r"(\*\.)?[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?")  # a DNS name or IPv4


@dataclass(frozen=True)
class ServeConfig:
    bundle: Path  # the bundle folder served (its current generation, followed as it changes)
    host: str = "127.0.0.1"  # the address to bind; any other than loopback needs a token
    port: int = 8000
    token: str | None = None  # every data request must carry `Authorization: Bearer TOKEN`
    device: str = "auto"
    faiss_device: str = "auto"  # where searches run: a Flat index on the GPUs FAISS has, or CPU
    allow_roots: tuple[Path, ...] = ()  # folders whose images POST /query?path=... may read
    allow_hosts: tuple[str, ...] = ()  # Host header names besides loopback's and --host's
    upload_dir: Path | None = None  # where POST /add stores images (default BUNDLE/uploads)
    max_upload_bytes: int = 20 * 1024 * 1024  # one request's body, uploads included
    max_files: int = 128  # images in one request
    max_batch: int = 32  # images in one forward pass (requests gathered together)
    batch_wait_ms: float = 4.0  # how long the first request of a pass waits for others
    thumbnail_size: int = 256  # longest side of GET /items/{id}/thumbnail
    client_timeout_s: float = 10.0  # to send the request's headers, and each part of its body

    @property
    def uploads(self) -> Path:
        return self.upload_dir or self.bundle / UPLOADS


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and `localhost`: reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any address
        return False


def check_config(config: ServeConfig) -> None:
    """Refuse what would be unsafe or cannot work, as a usage error naming the option."""
    if not is_loopback(config.host) and not config.token:
        raise UsageError(
            f"--host {config.host} would let other machines in: give --token SECRET (every "
            "request then needs it), or bind 127.0.0.1"
        )
    if config.token is not None and len(config.token) < 8:
        raise UsageError("--token needs at least 8 characters")
    for root in config.allow_roots:
        if not root.is_dir():
            raise UsageError(f"--allow-root {root} is not a folder")
    for name in config.allow_hosts:
        if not is_host_name(name):
            raise UsageError(
                f"--allow-host takes a host name or address such as pactl.example.org (got "
                f"{name!r:.60})"
            )
    if config.uploads.exists() and not config.uploads.is_dir():
        raise UsageError(f"{config.uploads} is not a folder: give --upload-dir a folder")


def is_host_name(name: str) -> bool:
    """A DNS name (`*.example.org` for its sub-domains), an IPv4 or an IPv6 address."""
    if HOST_NAME.fullmatch(name):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).version == 6
    except ValueError:
        return False
