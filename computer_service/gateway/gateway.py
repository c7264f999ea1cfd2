"""`Gateway`: one listener per agent on the host's 127.0.0.1, the routes, the counters.

An agent's listener opens on demand (`access_for`, on an ephemeral port) and
stays for the Computer's life, so a warm server started with its port and
placeholder keeps working; `route` says, before each turn, where the turn's
provider really is and with which login. OAuth logins are one object per
auth file and provider (`oauth_login`), so a refresh is shared by every agent
using it. Each listener is uvicorn on a socket of `crew_common.tcp_listener`
(TCP_NODELAY), driven like the introspection server (startup, shutdown; no
signal handling of its own). `aclose` stops them all.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

import anyio
import httpx
import uvicorn

from computer_service.engine.capabilities import McpRoute
from computer_service.gateway.access import GatewayAccess, new_placeholder
from computer_service.gateway.forward import AgentApp, Route
from computer_service.gateway.oauth import OAuthLogin, token_endpoints
from computer_service.gateway.usage import AgentCounters, TrafficSnapshot
from computer_service.gateway.warm_up import WarmUpGate
from crew_common.tcp_listener import tcp_listener

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
# Open connections per agent: an engine needs a few; a tool opening thousands gets 503s.
CONNECTIONS_PER_AGENT = 64
UPSTREAM_TIMEOUT = httpx.Timeout(connect=30.0, read=600.0, write=60.0, pool=30.0)


class _Listener:
    def __init__(self, access: GatewayAccess, app: AgentApp, server: uvicorn.Server) -> None:
        self.access = access
        self.app = app
        self.server = server
        self.counters = AgentCounters()


class Gateway:
    """The model gateway of one Computer (module doc)."""

    def __init__(
        self,
        *,
        token_endpoint_overrides: Mapping[str, str] | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self._client = client or httpx.AsyncClient(timeout=UPSTREAM_TIMEOUT, follow_redirects=False)
        self._endpoints = token_endpoints(token_endpoint_overrides or {})
        self._listeners: dict[str, _Listener] = {}
        self._counters: dict[str, AgentCounters] = {}
        self._oauth: dict[tuple[Path, str], OAuthLogin] = {}
        self._lock = anyio.Lock()

    async def access_for(self, agent_id: str) -> GatewayAccess:
        """The agent's port and placeholder; its listener is opened the first time."""
        async with self._lock:
            listener = self._listeners.get(agent_id)
            if listener is None:
                listener = await self._open(agent_id)
                self._listeners[agent_id] = listener
            return listener.access

    async def _open(self, agent_id: str) -> _Listener:
        sock = tcp_listener(HOST, 0)
        port = sock.getsockname()[1]
        access = GatewayAccess(port, new_placeholder())
        counters = self._counters.setdefault(agent_id, AgentCounters())
        app = AgentApp(agent_id, access.placeholder, {}, self._client, counters, self.owner_of)
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_level="warning",
            access_log=False,
            limit_concurrency=CONNECTIONS_PER_AGENT,
            timeout_graceful_shutdown=2,
        )
        config.load()
        server = uvicorn.Server(config)
        # As the introspection server: we drive startup and shutdown (no signal handlers).
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        log.info("gateway: agent %s reaches its models on 127.0.0.1:%d", agent_id, port)
        listener = _Listener(access, app, server)
        listener.counters = counters
        return listener

    def route(self, agent_id: str, provider: str, route: Route) -> None:
        """Where `provider` is for this agent's next calls (after `access_for`)."""
        self._listeners[agent_id].app.routes[provider] = route

    def mcp_routes(self, agent_id: str, routes: dict[str, McpRoute]) -> None:
        """The agent's remote MCP servers for its next calls, all of them (after `access_for`)."""
        self._listeners[agent_id].app.mcp_routes = routes

    def warm_up_gate(self, agent_id: str) -> WarmUpGate:
        """When the agent's canned warm-up route answers (after `access_for`)."""
        return self._listeners[agent_id].app.warm_up_gate

    def oauth_login(self, auth_file: Path, provider: str) -> OAuthLogin:
        """The one `OAuthLogin` of `provider` in `auth_file`."""
        key = (auth_file, provider)
        login = self._oauth.get(key)
        if login is None:
            login = OAuthLogin(auth_file, provider, self._endpoints.get(provider), self._client)
            self._oauth[key] = login
        return login

    def owner_of(self, placeholder: str) -> str | None:
        """The agent whose placeholder this is (for the refusal's log line)."""
        for agent_id, listener in self._listeners.items():
            if listener.access.placeholder == placeholder:
                return agent_id
        return None

    def snapshot(self, agent_id: str) -> TrafficSnapshot:
        """The agent's totals now (zeros before its first call)."""
        counters = self._counters.get(agent_id)
        return counters.snapshot() if counters is not None else TrafficSnapshot()

    def totals(self) -> TrafficSnapshot:
        """The sum of every agent's counters."""
        sums = [asdict(c.snapshot()) for c in self._counters.values()]
        fields = {
            k: sum(row[k] for row in sums)
            for k in asdict(TrafficSnapshot())
            if k != "retry_after_s"
        }
        return TrafficSnapshot(**fields)

    def metric_lines(self) -> list[str]:
        """The gateway's counters, in the Prometheus text of `/metrics`."""
        # Over every agent: each agent's counters live as long as the Computer.
        t = self.totals()
        rows = [
            ("crew_gateway_requests_total", "Model calls forwarded by the gateway.", t.requests),
            (
                "crew_gateway_refused_total",
                "Requests refused: no or another agent's credential.",
                t.refused,
            ),
            ("crew_gateway_rate_limited_total", "Provider answers 429 seen.", t.rate_limited),
            (
                "crew_gateway_upstream_errors_total",
                "Calls whose provider could not be reached.",
                t.upstream_errors,
            ),
            ("crew_gateway_bytes_up_total", "Request bytes forwarded to providers.", t.bytes_up),
            ("crew_gateway_bytes_down_total", "Response bytes relayed back.", t.bytes_down),
        ]
        lines: list[str] = []
        for name, text, value in rows:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} counter", f"{name} {value}"]
        gates = [listener.app.warm_up_gate for listener in self._listeners.values()]
        for name, text, value in (
            (
                "crew_gateway_warm_up_answers_total",
                "Warm-up model calls answered by the gateway itself (never forwarded).",
                sum(g.answered for g in gates),
            ),
            (
                "crew_gateway_warm_up_refused_total",
                "Calls to the warm-up route outside a warm-up, refused.",
                sum(g.refused for g in gates),
            ),
        ):
            lines += [f"# HELP {name} {text}", f"# TYPE {name} counter", f"{name} {value}"]
        lines += [
            "# HELP crew_gateway_agents Agents with a gateway listener.",
            "# TYPE crew_gateway_agents gauge",
            f"crew_gateway_agents {len(self._listeners)}",
        ]
        return lines

    async def aclose(self) -> None:
        """Stop every listener at once (open calls end, each within its grace), then the client."""
        listeners, self._listeners = list(self._listeners.values()), {}
        async with anyio.create_task_group() as tasks:
            for listener in listeners:
                tasks.start_soon(_stop, listener)
        await self._client.aclose()


async def _stop(listener: _Listener) -> None:
    listener.server.should_exit = True
    try:
        await listener.server.shutdown()
    except Exception:
        log.exception("gateway: stopping agent %s's listener failed", listener.app.agent_id)
