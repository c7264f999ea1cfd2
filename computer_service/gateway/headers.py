"""Headers the gateway never forwards, either way: hop-by-hop ones, and those it sets
itself (`host`, `content-length`). One list for the provider route (`forward`) and the
remote MCP route (`mcp_route`)."""

from __future__ import annotations

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)
