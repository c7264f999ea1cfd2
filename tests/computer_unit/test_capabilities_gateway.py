"""Remote MCP servers through the agent's gateway (issue 27): the secret header is added there.

Real sockets on loopback: the gateway's listener and `crew_testkit.mcp_remote`, which
refuses any request without its secret header, so a call that works proves the gateway
put it in; what the server saw proves the placeholder did not go on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from computer_service.engine.capabilities import GATEWAY_HEADER, McpRoute, mcp_routes, mcp_url
from computer_service.gateway.gateway import Gateway
from crew_common.capabilities import parse
from crew_testkit.mcp_remote import RemoteMCPServer

pytestmark = pytest.mark.anyio

SECRET = "Bearer mcp-secret-7781"


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    gw = Gateway()
    try:
        yield gw
    finally:
        await gw.aclose()


def _rpc(msg_id: int, method: str, params: dict | None = None) -> dict:
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params or {}}


async def test_the_gateway_adds_the_secret_header_and_drops_the_placeholder(
    gateway: Gateway,
) -> None:
    access = await gateway.access_for("agent-1")
    with RemoteMCPServer(secret_header=("Authorization", SECRET)) as server:
        caps = parse(
            {
                "mcp_servers": [
                    {
                        "type": "remote",
                        "name": "notes",
                        "url": server.url,
                        "headers": {"X-Org": "acme"},
                        "secret_headers": {"Authorization": SECRET},
                    }
                ]
            }
        )
        gateway.mcp_routes("agent-1", mcp_routes(caps))
        url = mcp_url(access.port, "notes")
        async with httpx.AsyncClient() as client:
            sent = {GATEWAY_HEADER: access.placeholder, "X-Org": "acme"}
            init = await client.post(url, json=_rpc(1, "initialize"), headers=sent)
            assert init.status_code == 200, init.text
            assert init.headers["mcp-session-id"]  # relayed back to the engine
            call = _rpc(2, "tools/call", {"name": "echo_note", "arguments": {"note": "n"}})
            answer = await client.post(url, json=call, headers=sent)
            assert answer.json()["result"]["content"][0]["text"] == "MCP-REMOTE-MARKER-c41d n"
            # The engine's own Authorization (it could set one) is replaced, never passed on.
            forged = await client.post(
                url, json=call, headers={**sent, "Authorization": "Bearer forged"}
            )
            assert forged.status_code == 200
        assert server.rejected == 0
        seen = [r["headers"] for r in server.requests]
        assert all(h["authorization"] == SECRET and h["x-org"] == "acme" for h in seen)
        assert not any(access.placeholder in v for h in seen for v in h.values())
        assert not any(GATEWAY_HEADER.lower() in h for h in seen)


async def test_without_the_placeholder_or_for_an_unknown_server_nothing_is_forwarded(
    gateway: Gateway,
) -> None:
    access = await gateway.access_for("agent-1")
    other = await gateway.access_for("agent-2")
    with RemoteMCPServer(secret_header=("X-Api-Key", "k")) as server:
        gateway.mcp_routes("agent-1", {"notes": McpRoute(server.url, {"X-Api-Key": "k"})})
        async with httpx.AsyncClient() as client:
            url = mcp_url(access.port, "notes")
            bare = await client.post(url, json=_rpc(1, "initialize"))
            assert bare.status_code == 401
            # Another agent's placeholder on this agent's port: refused as well.
            stolen = await client.post(
                url, json=_rpc(1, "initialize"), headers={GATEWAY_HEADER: other.placeholder}
            )
            assert stolen.status_code == 401
            unknown = await client.post(
                mcp_url(access.port, "other"),
                json=_rpc(1, "initialize"),
                headers={GATEWAY_HEADER: access.placeholder},
            )
            assert unknown.status_code == 404 and "other" in unknown.text
            # Agent 2 has no such route on its own port.
            elsewhere = await client.post(
                mcp_url(other.port, "notes"),
                json=_rpc(1, "initialize"),
                headers={GATEWAY_HEADER: other.placeholder},
            )
            assert elsewhere.status_code == 404
        assert server.requests == []


async def test_an_unreachable_server_is_a_clear_502(gateway: Gateway) -> None:
    access = await gateway.access_for("agent-1")
    server = RemoteMCPServer()
    dead = server.url
    server.stop()  # never started: the port is closed now
    gateway.mcp_routes("agent-1", {"gone": McpRoute(dead)})
    async with httpx.AsyncClient() as client:
        answer = await client.post(
            mcp_url(access.port, "gone"),
            json=_rpc(1, "initialize"),
            headers={GATEWAY_HEADER: access.placeholder},
        )
    assert answer.status_code == 502 and "gone" in answer.text


async def test_a_dot_segment_cannot_leave_the_configured_url(gateway: Gateway) -> None:
    access = await gateway.access_for("agent-1")
    with RemoteMCPServer() as server:
        gateway.mcp_routes("agent-1", {"notes": McpRoute(server.url)})
        async with httpx.AsyncClient() as client:
            url = mcp_url(access.port, "notes") + "/%2e%2e/admin"
            answer = await client.post(
                url, json=_rpc(1, "initialize"), headers={GATEWAY_HEADER: access.placeholder}
            )
        assert answer.status_code == 400
        assert server.requests == []
