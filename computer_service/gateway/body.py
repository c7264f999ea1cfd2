"""A request's body as the gateway's routes read it: whole, up to a limit."""

from __future__ import annotations

from starlette.types import Receive


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The request's body; None when it is over `limit` bytes. A client that went away
    mid-body leaves what it sent (the route's answer then goes nowhere)."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(parts)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)
