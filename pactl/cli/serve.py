"""`pactl serve`: the warm service over a bundle (pactl.serve)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pactl.cli.options import Device, FaissDevice, Quiet, SearchDevice, check_option, reporter
from pactl.config import rules
from pactl.errors import PactlError
from pactl.store.home import runs_dir


def serve(
    bundle: Annotated[
        Path | None,
        typer.Argument(help="Bundle folder to serve (default: the latest run's index)."),
    ] = None,
    host: Annotated[
        str, typer.Option(help="Address to bind; any but loopback needs --token.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free one).")] = 8000,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="PACTL_TOKEN",
            help="Secret every data request must carry (Authorization: Bearer TOKEN); the page "
            "and /openapi.json answer without it.",
        ),
    ] = None,
    allow_root: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="DIR", help="Folder whose images POST /query?path= may read (repeatable)."
        ),
    ] = None,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME",
            help="Another name clients reach the service by, e.g. behind a proxy (repeatable); "
            "a request naming any other Host is refused.",
        ),
    ] = None,
    upload_dir: Annotated[
        Path | None, typer.Option(help="Where POST /add keeps images (default: BUNDLE/uploads).")
    ] = None,
    client_timeout: Annotated[
        float,
        typer.Option(
            min=0.1,
            max=3600,
            help="Seconds a client may take to send its request headers, and each part of a body.",
        ),
    ] = 10.0,
    max_upload_mb: Annotated[
        float, typer.Option(min=0.001, max=4096, help="Largest request body, in MiB.")
    ] = 20.0,
    max_batch: Annotated[
        int, typer.Option(min=1, max=1024, help="Images in one forward pass, at most.")
    ] = 32,
    batch_wait_ms: Annotated[
        float,
        typer.Option(min=0, max=1000, help="How long a pass waits for requests to join it."),
    ] = 4.0,
    findings: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            metavar="FILE",
            help="Review an audit's suspected labels at /review (pactl audit --findings FILE).",
        ),
    ] = None,
    decisions: Annotated[
        Path | None,
        typer.Option(
            dir_okay=False,
            metavar="FILE",
            help="Where the review page appends each keep or reject (for audit's --relabel).",
        ),
    ] = None,
    device: Device = "auto",
    faiss_device: SearchDevice = FaissDevice("auto"),
    quiet: Quiet = False,
) -> None:
    """Load the network and the bundle once and answer queries over HTTP: a JSON API
    (POST /query, GET /items/ID, POST /add, POST /delete, GET /health, OpenAPI at /docs) and a
    web page at /. Requests that arrive together share one forward pass; a new generation of
    the bundle (pactl index --add, a delete) is picked up as it lands.

    Examples:

    \b
      pactl serve                                     # the latest run's index
      pactl serve runs/demo/index                     # http://127.0.0.1:8000/
      pactl serve index --allow-root /data/photos
      pactl serve index --findings found.jsonl --decisions kept.jsonl  # /review
      PACTL_TOKEN=... pactl serve index --host 0.0.0.0 --allow-host box.lan
    """
    import importlib.util

    needed = {"fastapi": "fastapi", "uvicorn": "uvicorn", "python_multipart": "python-multipart"}
    missing = [pkg for module, pkg in needed.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise PactlError(f"pactl serve needs {', '.join(missing)}: pip install 'pactl[serve]'")
    from pactl.index import UNSEALED, check_folder, verify_bundle_or_set
    from pactl.serve.config import ServeConfig
    from pactl.serve.server import serve as run_service
    from pactl.verbs.query import find_bundle

    check_option("--device", device, rules(ServeConfig)["device"])
    log = reporter(quiet)
    if bundle is None:
        bundle = find_bundle(runs_dir(), "name the bundle folder: pactl serve BUNDLE")
        log.log(f"using index {bundle}")
    check_folder(bundle)
    checked = verify_bundle_or_set(bundle, log)  # damage found now, not as wrong answers later
    if checked is None:
        log.log(f"{bundle}: no checksums recorded (an older pactl's bundle): sizes checked")
    elif not checked.meta:
        log.log(f"{bundle}: {UNSEALED}")
    config = ServeConfig(
        bundle=bundle,
        host=host,
        port=port,
        token=token,
        device=device,
        faiss_device=faiss_device.value,
        allow_roots=tuple(allow_root or ()),
        allow_hosts=tuple(allow_host or ()),
        upload_dir=upload_dir,
        client_timeout_s=client_timeout,
        max_upload_bytes=int(max_upload_mb * 1024 * 1024),
        max_batch=max_batch,
        batch_wait_ms=batch_wait_ms,
        findings=findings,
        decisions=decisions,
    )
    run_service(config, log)
