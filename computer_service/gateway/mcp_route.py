"""An agent's remote MCP servers through its gateway: `/mcp/<name>/...` to the real url.

The engine's config points each remote server at `http://127.0.0.1:<agent port>/mcp/<name>`
with the agent's placeholder in `X-Crew-Gateway` (`engine.capabilities`); `AgentApp` has
checked the placeholder before it gets here. The request goes to the server's real url
(the rest of the path and the query appended), the placeholder header dropped, the
server's headers and `secret_headers` set (they win over the engine's), hop-by-hop
headers dropped; the answer (JSON or an SSE stream, `Mcp-Session-Id` included) is relayed
chunk by chunk. So the secret headers never enter the sandbox, and the engine reaches
only the urls its user configured, on no other host.
"""

from __future__ import annotations

import logging

import httpx
from starlette.types import Scope, Send

from computer_service.engine.capabilities import McpRoute
from computer_service.gateway.headers import HOP_BY_HOP

log = logging.getLogger(__name__)

# Request headers never forwarded (besides those holding the placeholder): the gateway's
# hop-by-hop list, and `accept-encoding` (the body is relayed as it comes).
DROPPED = HOP_BY_HOP | {b"accept-encoding"}


def upstream_url(route: McpRoute, rest: str, query: bytes) -> str:
    """The real url of a request whose path below `/mcp/<name>` is `rest`."""
    url = f"{route.url}/{rest}" if rest else route.url
    return f"{url}?{query.decode('latin-1')}" if query else url


def upstream_headers(
    headers: list[tuple[bytes, bytes]], route: McpRoute, token: bytes
) -> list[tuple[bytes, bytes]]:
    """The engine's headers minus hop-by-hop ones and any carrying the placeholder, plus the
    server's own (plain and secret; they replace the engine's of the same name)."""
    drop = set(DROPPED)
    for name, value in headers:
        if name == b"connection":
            drop.update(t.strip().lower() for t in value.split(b","))
    configured = {k.lower().encode(): v.encode() for k, v in route.headers.items()}
    out = [(k, v) for k, v in headers if k not in drop and k not in configured and token not in v]
    out.extend(configured.items())
    out.append((b"accept-encoding", b"identity"))
    return out


async def forward(
    *,
    agent_id: str,
    name: str,
    route: McpRoute,
    rest: str,
    scope: Scope,
    body: bytes,
    token: bytes,
    client: httpx.AsyncClient,
    send: Send,
) -> bool:
    """Forward one request to the server; False when it could not be reached (nothing sent)."""
    request = client.build_request(
        scope["method"],
        upstream_url(route, rest, scope.get("query_string", b"")),
        headers=upstream_headers([(k.lower(), v) for k, v in scope["headers"]], route, token),
        content=body,
    )
    try:
        response = await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        log.warning("gateway: agent %s, MCP server %s unreachable: %s", agent_id, name, exc)
        return False
    try:
        out = [(k, v) for k, v in response.headers.raw if k.lower() not in DROPPED]
        if (length := response.headers.get("content-length")) is not None:
            out.append((b"content-length", length.encode()))
        await send({"type": "http.response.start", "status": response.status_code, "headers": out})
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        await response.aclose()
    return True
