"""The service's cross-cutting rules: one ASGI layer each, in one place, run for every route
before any handler (outermost first, as `guarded` stacks them):

- the Host header (DNS rebinding): Starlette's TrustedHostMiddleware, 400 for any other name;
- the token (`--token`): 401 without `Authorization: Bearer TOKEN` on every data route;
- the origin (cross-site request forgery): `Sites`, 403 for what a browser marks as another
  site's, and for a browser's write that lacks the page's per-process secret;
- requests in flight: `InFlight`, 503 past a bound, at once;
- the body: `Body`, 413 past the size limit (declared or counted), 408 for a body that stalls.

The page (`/`, its script and style) and the OpenAPI pages hold no data: they pass the token
and origin layers, never the Host check.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pactl.serve.config import PUBLIC_PATHS, ServeConfig, is_loopback

PAGE_HEADER = "x-pactl-page"  # the page's per-process secret, sent with its every request
READ_METHODS = frozenset({"GET", "HEAD"})
OWN_SITE = frozenset({"same-origin", "none"})  # Sec-Fetch-Site of this page, or a typed URL
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


class TooLarge(Exception):
    """The request body went past the upload limit while it was being read."""


class SlowBody(Exception):
    """The client sent no part of the body for longer than the client timeout."""


@dataclass(frozen=True)
class Limits:
    max_bytes: int  # one request's body
    body_idle_s: float  # longest wait for the next part of a body
    in_flight: int  # requests being answered at once; past this, 503 at once


def host_names(config: ServeConfig) -> list[str]:
    """The names a Host header may carry: loopback's, --host's and every --allow-host
    (TrustedHostMiddleware compares the name; the port is the socket's own)."""
    names = [*LOOPBACK_NAMES, config.host, *config.allow_hosts]
    return sorted({f"[{n.strip('[]')}]" if ":" in n else n for n in names})


def guarded(app: ASGIApp, config: ServeConfig, secret: str, limits: Limits) -> ASGIApp:
    """`app` behind every layer, outermost first: hosts, token, sites, in flight, body."""
    inner: ASGIApp = Body(app, limits)
    inner = InFlight(inner, limits.in_flight)
    inner = Sites(inner, secret, token_set=config.token is not None)
    inner = Token(inner, config.token)
    return TrustedHostMiddleware(inner, allowed_hosts=host_names(config), www_redirect=False)


class Token:
    """`Authorization: Bearer TOKEN` on every data route when the service has a token,
    compared in constant time."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token and scope["type"] == "http" and scope["path"] not in PUBLIC_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.token):
                detail = "a valid token is needed (header Authorization: Bearer TOKEN)"
                return await reply(send, 401, detail)
        await self.app(scope, receive, send)


class Sites:
    """No request of another site reaches a data route, and a browser writes only through the
    page. A browser sends a cross-site form or a `text/plain` or multipart fetch without
    asking first, but marks it (Origin, Sec-Fetch-Site), and it can neither read the page (so
    not its secret) nor set a header of its own without asking (which this service never
    allows). A script sends neither mark: from loopback, or with the token, it writes."""

    def __init__(self, app: ASGIApp, secret: str, token_set: bool) -> None:
        self.app, self.secret, self.token_set = app, secret.encode(), token_set

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        refused = self.refusal(scope, headers)
        if refused:
            return await reply(send, 403, refused)
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope, headers: Headers) -> str | None:
        """Why the request is refused, or None."""
        site, origin = headers.get("sec-fetch-site"), headers.get("origin")
        if site is not None and site.lower() not in OWN_SITE:
            return f"a request from another site (Sec-Fetch-Site: {site:.20}) is refused"
        if origin is not None and not same_origin(origin, headers.get("host", "")):
            return f"a request from {origin:.80} is refused: only this service's page may call it"
        if scope["method"] in READ_METHODS or self.token_set:  # the token was checked already
            return None
        page = headers.get(PAGE_HEADER, "").encode()
        if page and hmac.compare_digest(page, self.secret):
            return None
        client = (scope.get("client") or ("", 0))[0]
        if site is None and origin is None and is_loopback(client):
            return None  # a script on this machine (curl, pactl query --server)
        return "a write needs this service's page, or a script on this machine, or --token"


def same_origin(origin: str, host: str) -> bool:
    """`origin` is this service's own: http or https (a TLS proxy in front) at the very
    host and port the request was sent to."""
    parts = urlsplit(origin.lower())
    return parts.scheme in ("http", "https") and bool(host) and parts.netloc == host.lower()


class InFlight:
    """At most `most` requests answered at once; the next gets 503 at once. Connections that
    are still sending their headers do not count (pactl.serve.protocol bounds those)."""

    def __init__(self, app: ASGIApp, most: int) -> None:
        self.app, self.most, self.now = app, most, 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.now >= self.most:
            return await reply(send, 503, f"the service is answering {self.most} requests")
        self.now += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.now -= 1


class Body:
    """The body's size (declared, then counted as it arrives) and pace (each part within
    `body_idle_s` of the last), before any of it is parsed."""

    def __init__(self, app: ASGIApp, limits: Limits) -> None:
        self.app, self.limits = app, limits

    def too_large(self) -> str:
        return f"the request is over the upload limit of {self.limits.max_bytes:,} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit():
            return await reply(send, 400, "Content-Length is not a number")
        if int(declared) > self.limits.max_bytes:
            return await reply(send, 413, self.too_large())
        await self.app(scope, self._paced(receive), send)

    def _paced(self, receive: Receive) -> Receive:
        seen, done = 0, False

        async def paced() -> Message:
            nonlocal seen, done
            if done:  # after the body: waiting for a disconnect is not bounded
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.limits.body_idle_s)
            except TimeoutError:
                raise SlowBody(
                    f"no part of the body came for {self.limits.body_idle_s:g} s: closed"
                ) from None
            seen += len(message.get("body", b""))
            done = not message.get("more_body", False)
            if seen > self.limits.max_bytes:
                raise TooLarge(self.too_large())
            return message

        return paced


async def reply(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
