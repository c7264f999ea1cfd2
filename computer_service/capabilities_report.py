"""`CapabilitiesReport`: what the server (and so the user) hears of an agent's MCP servers.

After each turn the runner hands over what the engine knows (`/agents`' `mcp_servers`,
from the warm server's `GET /mcp`: `engine.capabilities.mcp_states`); it goes to
`PUT /computer/agents/{id}/capabilities/state` with the `capabilities_version` it is of,
only when it changed since the last report. A cold run has no server to ask: nothing is
reported for an agent with MCP servers until a warm turn says how they are. A report
that fails is logged and tried again after the next turn.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import orjson

from computer_service.upstream import AgentRecord, UpstreamError, UpstreamRejected

log = logging.getLogger(__name__)


class StateSink(Protocol):
    """What the report needs of the upstream (`Upstream` satisfies it)."""

    async def put_capabilities_state(
        self, agent_id: str, version: str, servers: list[dict[str, Any]]
    ) -> None: ...


class CapabilitiesReport:
    """The last state reported for one agent (module doc)."""

    def __init__(self) -> None:
        self._sent: tuple[str, bytes] | None = None

    async def after_turn(
        self, upstream: StateSink, agent: AgentRecord, engine_status: Mapping[str, object]
    ) -> None:
        """Report the agent's MCP servers' state if it changed; never raises (logged)."""
        version = agent.capabilities_version
        if version is None:
            return  # a server without capabilities has no place for the report
        servers = engine_status.get("mcp_servers")
        if not isinstance(servers, list):
            if agent.capabilities.mcp_servers:
                return  # not known yet (no warm turn)
            servers = []
        key = (version, orjson.dumps(servers))
        if key == self._sent:
            return
        try:
            await upstream.put_capabilities_state(agent.id, version, servers)
        except UpstreamRejected as exc:
            # Said once: an older server (or a version it no longer has) keeps refusing.
            log.warning("agent %s: the server refused its MCP servers' state: %s", agent.id, exc)
        except UpstreamError as exc:
            log.warning("agent %s: reporting its MCP servers' state failed: %s", agent.id, exc)
            return
        self._sent = key
