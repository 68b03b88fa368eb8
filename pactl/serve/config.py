"""What `pactl serve` is started with: one frozen dataclass, checked before anything loads."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from pactl.config import FAISS_DEVICE_NAMES, REQUIRED, check_options, setting
from pactl.errors import UsageError
from pactl.rules import (
    choice,
    device,
    integer,
    number,
    optional,
    path,
    paths,
    text,
    texts,
)

UPLOADS = "uploads"  # BUNDLE/uploads: where POST /add keeps the images it adds (default)
PUBLIC_PATHS = (
    *("/", "/static/app.js", "/static/style.css", "/docs", "/openapi.json"),
    *("/review", "/static/review.js"),
)
HOST_NAME = re.compile(r"(\*\.)?[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?")  # a DNS name or IPv4


@dataclass(frozen=True)
class ServeConfig:
    bundle: Path = setting(
        REQUIRED, path(),
        "The bundle folder served (its current generation, followed as it changes).",
    )  # fmt: skip
    host: str = setting(
        "127.0.0.1", text(), "The address to bind; any other than loopback needs a token."
    )
    port: int = setting(8000, integer(0, 65535), "Port (0: any free one).")
    token: str | None = setting(
        None, optional(text()), "Every data request must carry `Authorization: Bearer TOKEN`."
    )
    device: str = setting("auto", device(), "Where the network runs.")
    faiss_device: str = setting(
        "auto", choice(*FAISS_DEVICE_NAMES),
        "Where searches run: a Flat index on the GPUs FAISS has, or the CPU.",
    )  # fmt: skip
    allow_roots: tuple[Path, ...] = setting(
        (), paths(), "Folders whose images POST /query?path=... may read.", option="--allow-root"
    )
    allow_hosts: tuple[str, ...] = setting(
        (), texts(), "Host header names besides loopback's and --host's.", option="--allow-host"
    )
    upload_dir: Path | None = setting(
        None, optional(path()), "Where POST /add stores images (default BUNDLE/uploads)."
    )
    max_upload_bytes: int = setting(
        20 * 1024 * 1024, integer(1, 4096 * 1024 * 1024),
        "One request's body, uploads included.", option="--max-upload-mb",
    )  # fmt: skip  # the option gives MiB
    max_files: int = setting(128, integer(1), "Images in one request.", cli=False)
    max_batch: int = setting(
        32, integer(1, 1024), "Images in one forward pass (requests gathered together)."
    )
    batch_wait_ms: float = setting(
        4.0, number(0, 1000), "How long the first request of a pass waits for others."
    )
    thumbnail_size: int = setting(
        256, integer(1), "Longest side of GET /items/{id}/thumbnail.", cli=False
    )
    client_timeout_s: float = setting(
        10.0, number(0.1, 3600),
        "Seconds to send the request's headers, and each part of its body.",
        option="--client-timeout",
    )  # fmt: skip
    findings: Path | None = setting(
        None, optional(path()),
        "An audit's findings (pactl audit --findings FILE) to review on the page at /review.",
    )  # fmt: skip  # pactl.serve.review
    decisions: Path | None = setting(
        None, optional(path()),
        "Where the review page appends each keep or reject (JSON Lines, for audit's --relabel).",
    )  # fmt: skip

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
    """Refuse what would be unsafe or cannot work, as a usage error naming the option: what the
    rules cannot say (with the words the options have always had), then every declared rule."""
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
    if (config.findings is None) != (config.decisions is None):
        raise UsageError("--findings and --decisions go together: the review page needs both")
    check_options(config, UsageError)  # the ranges the options' own checks keep on the CLI


def is_host_name(name: str) -> bool:
    """A DNS name (`*.example.org` for its sub-domains), an IPv4 or an IPv6 address."""
    if HOST_NAME.fullmatch(name):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).version == 6
    except ValueError:
        return False
