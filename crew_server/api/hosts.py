"""The `Host` allow-list: crew-server answers only requests addressed to one of its own names.

A page on another site can make a browser send requests to loopback under a
name that resolves there (DNS rebinding); the name reaches the server in
`Host`. Requests naming anything else get 400 before a handler runs. The
names are the bind host, localhost and the loopback addresses, the host of
the configured public URL, and any the operator adds (`--allowed-host`).
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
# A wildcard bind host names no machine: it allows nothing by itself.
_WILDCARDS = ("0.0.0.0", "::", "")


def allowed_hosts(bind_host: str, public_url: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The host names (no port, lower case, IPv6 without brackets) requests may carry."""
    names = {bind_host, *LOOPBACK_NAMES, urlsplit(public_url).hostname or "", *extra}
    return frozenset(normal(name) for name in names if normal(name) not in _WILDCARDS)


def normal(name: str) -> str:
    """A host name as compared: lower case, no brackets, no trailing dot."""
    return name.strip().lower().removeprefix("[").removesuffix("]").rstrip(".")


def host_of(header: str) -> str | None:
    """The name in a `Host` header (`name`, `name:port`, `[v6]:port`); None when malformed."""
    value = header.strip()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return normal(name)
    name, colon, port = value.partition(":")
    if colon and not port.isdigit():
        return None
    return normal(name) or None


class HostAllowList:
    """ASGI middleware: 400 for an HTTP request whose `Host` is not one of `allowed`."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = next((v for k, v in scope["headers"] if k == b"host"), b"")
            name = host_of(header.decode("latin-1"))
            if name not in self.allowed:
                await self._refuse(header.decode("latin-1"), send)
                return
        await self.app(scope, receive, send)

    async def _refuse(self, header: str, send: Send) -> None:
        shown = header[:100] or "(none)"
        message = (
            f"the Host header {shown!r} is not a name of this server "
            f"({', '.join(sorted(self.allowed))}); use one of those, or start crew-server "
            f"with --public-url or --allowed-host for this name"
        )
        body = orjson.dumps({"error": {"code": "invalid_host", "message": message}})
        await send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
