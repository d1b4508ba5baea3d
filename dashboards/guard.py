"""Host and Origin checks for the dashboard server (DNS rebinding, cross-site pages): an ASGI middleware.

A page on ``evil.example`` whose name is re-pointed at 127.0.0.1 (DNS rebinding) reaches a local server with
``Host: evil.example``; a page on another origin that opens the app's WebSocket or posts an upload sends its
own ``Origin``. Every HTTP and WebSocket request is refused (403 / close 1008) unless its Host names an allowed
host (127.0.0.1, localhost, ::1, the bound address, and hosts given with ``mxperf dash --allow-host``) and an
``Origin``, when sent, is the same host and port. Pure ASGI: no Streamlit import, tested with plain scopes.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from dashboards.settings import ALLOWED_HOSTS_ENV, LOCAL_HOSTS

_WILDCARD_BINDS = ("0.0.0.0", "::", "")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def allowed_hosts(address: str, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """Local names, the bound address (unless a wildcard) and ``extra`` (lower case, no port)."""
    hosts = [*LOCAL_HOSTS]
    if address not in _WILDCARD_BINDS:
        hosts.append(address)
    hosts += [h for h in extra if h]
    return tuple(dict.fromkeys(h.strip().lower().strip("[]") for h in hosts))


def hosts_from_env() -> tuple[str, ...]:
    raw = os.environ.get(ALLOWED_HOSTS_ENV, "")
    return tuple(h for h in raw.split(",") if h) or LOCAL_HOSTS


def _split_host(value: str) -> tuple[str | None, int | None]:
    """``host[:port]`` (IPv6 in brackets) -> (hostname lower case, port); (None, None) when malformed."""
    try:
        parts = urlsplit(f"//{value}")
        port = parts.port
        name = parts.hostname
    except ValueError:
        return None, None
    if not name or parts.username or parts.password or parts.path or parts.query or parts.fragment:
        return None, None
    return name.lower().rstrip("."), port


def check_request(headers: Iterable[tuple[bytes, bytes]], allowed: Iterable[str]) -> str | None:
    """None when the request may proceed, else the reason it is refused."""
    by_name: dict[bytes, str] = {}
    for key, value in headers:
        by_name.setdefault(key.lower(), value.decode("latin-1"))
    host_header = by_name.get(b"host")
    if host_header is None:
        return "no Host header"
    host, port = _split_host(host_header)
    allowed = set(allowed)
    if host is None or host not in allowed:
        return f"Host {host_header!r} is not served here (allowed: {', '.join(sorted(allowed))}; add one with mxperf dash --allow-host)"
    origin = by_name.get(b"origin")
    if origin is not None and origin != "null":
        o = urlsplit(origin)
        o_host, o_port = _split_host(o.netloc)
        if o_port is None and o.scheme in ("http", "https"):
            o_port = 80 if o.scheme == "http" else 443
        ports = {port} if port is not None else {80, 443}  # no port in Host: the scheme's default
        if o_host != host or o_port not in ports:
            return f"Origin {origin!r} is not this dashboard ({host_header})"
    elif origin == "null":
        return "Origin 'null' (a sandboxed or file page) is refused"
    return None


class HostOriginGuard:
    """ASGI middleware: refuses requests :func:`check_request` rejects; ``allowed`` defaults to the
    environment (``MXPERF_DASH_ALLOWED_HOSTS``, set by ``mxperf dash``)."""

    def __init__(self, app: Callable[..., Awaitable[None]], allowed: Iterable[str] | None = None) -> None:
        self.app = app
        self.allowed = tuple(allowed) if allowed is not None else hosts_from_env()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            reason = check_request(scope.get("headers") or [], self.allowed)
            if reason is not None:
                await _refuse(scope, send, reason)
                return
        await self.app(scope, receive, send)


async def _refuse(scope: Scope, send: Send, reason: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008, "reason": reason[:120]})
        return
    body = f"mxperf dash: refused: {reason}\n".encode()
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
