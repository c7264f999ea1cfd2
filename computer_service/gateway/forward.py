"""One agent's gateway app: check the placeholder, put the real credential in, forward, stream back.

A raw ASGI app (one per agent, served on that agent's port). A request must
carry this agent's placeholder (in a header or the query) or it is refused
with 401 and a log line; its first path segment names the provider, the rest
is appended to the provider's real base URL (`/mcp/<name>/...` is one of the
agent's remote MCP servers instead: `mcp_route`; `/crew-warm-up/...` the prewarm's
canned model, answered here: `warm_up`). The placeholder is replaced by
the login's real credential wherever it appears in a header or the query,
hop-by-hop headers are dropped, the provider's configured headers added, and
the response is sent back chunk by chunk as it arrives (`aiter_raw`: no
buffering, no decoding), while `usage.UsageTap` reads a copy.
"""

from __future__ import annotations

import email.utils
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote

import httpx
import orjson
from starlette.types import Receive, Scope, Send

from computer_service.engine.capabilities import MCP_PREFIX, McpRoute
from computer_service.gateway import mcp_route
from computer_service.gateway.access import PLACEHOLDER_PREFIX
from computer_service.gateway.body import read_body
from computer_service.gateway.headers import HOP_BY_HOP
from computer_service.gateway.logins import Login, LoginFailed
from computer_service.gateway.usage import AgentCounters, UsageTap
from computer_service.gateway.warm_up import TWIN_PROVIDER, WarmUpGate
from computer_service.gateway.warm_up import answer as warm_up_answer

log = logging.getLogger(__name__)

REQUEST_BODY_LIMIT = 64 * 1024 * 1024


@dataclass(frozen=True)
class Route:
    """Where one provider of one agent really is, and what is sent to it."""

    # The provider's real base URL, no trailing slash; None: unknown (its calls get a 502
    # saying how to name it, and the engine's turn fails with that).
    base_url: str | None
    login: Login
    headers: dict[str, str] = field(default_factory=dict)  # the user's configured headers
    # An OAuth login sent as `Authorization: Bearer` with this `anthropic-beta` flag,
    # whatever header the engine put the placeholder in (`oauth.BEARER_BETAS`).
    bearer_beta: str | None = None


def retry_after_s(value: str | None) -> float | None:
    """A `Retry-After` header in seconds (delta-seconds or an HTTP date), None if absent."""
    if not value:
        return None
    try:
        return max(float(value.strip()), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


class AgentApp:
    """The gateway as one agent sees it (module doc)."""

    def __init__(
        self,
        agent_id: str,
        placeholder: str,
        routes: dict[str, Route],
        client: httpx.AsyncClient,
        counters: AgentCounters,
        owner_of: Callable[[str], str | None],
    ) -> None:
        self.agent_id = agent_id
        self.placeholder = placeholder
        self._token = placeholder.encode()
        self.routes = routes
        # The agent's remote MCP servers by name (`mcp_route`), set before each turn.
        self.mcp_routes: dict[str, McpRoute] = {}
        # The warm-up's twin provider, answered here, never forwarded (`warm_up`).
        self.warm_up_gate = WarmUpGate()
        self._client = client
        self._counters = counters
        self._owner_of = owner_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers: list[tuple[bytes, bytes]] = [(k.lower(), v) for k, v in scope["headers"]]
        query: bytes = scope.get("query_string", b"")
        if not (self._token in query or any(self._token in v for _, v in headers)):
            await self._refuse(headers, query, send)
            return
        provider, _, rest = scope["path"].lstrip("/").partition("/")
        if provider == MCP_PREFIX:
            await self._mcp(scope, receive, send, rest)
            return
        if provider == TWIN_PROVIDER:
            await warm_up_answer(
                self.warm_up_gate, scope["method"], rest, receive, send, self.agent_id
            )
            return
        route = self.routes.get(provider)
        if route is None:
            await _json_error(send, 404, f"this agent has no provider {provider!r} here")
            return
        if route.base_url is None:
            await _json_error(
                send,
                502,
                f"the crew model gateway does not know where the provider {provider} is: set "
                f'its "options": {{"baseURL": "https://…"}} in your OpenCode config',
            )
            return
        body = await read_body(receive, REQUEST_BODY_LIMIT)
        if body is None:
            await _json_error(send, 413, "the request body is over 64 MiB")
            return
        try:
            secret = await route.login.secret()
        except LoginFailed as exc:
            log.warning("gateway: agent %s, provider %s: %s", self.agent_id, provider, exc)
            await _json_error(send, 401, str(exc))
            return
        self._counters.add(requests=1, bytes_up=len(body))
        upstream = self._client.build_request(
            scope["method"],
            self._url(route, rest, query, secret),
            headers=self._headers(headers, route, secret),
            content=body,
        )
        try:
            response = await self._client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            self._counters.add(upstream_errors=1)
            log.warning("gateway: agent %s, %s unreachable: %s", self.agent_id, provider, exc)
            await _json_error(send, 502, f"the provider {provider} cannot be reached: {exc}")
            return
        try:
            await self._relay(response, send)
        finally:
            await response.aclose()

    async def _mcp(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        """`/mcp/<name>/...`: one of the agent's remote MCP servers (`mcp_route`)."""
        name, _, rest = path.partition("/")
        if any(part in (".", "..") for part in rest.split("/")):
            # Only below the url its user configured: never a dot segment out of it.
            await _json_error(send, 400, "a dot segment in an MCP server's path is refused")
            return
        route = self.mcp_routes.get(name)
        if route is None:
            await _json_error(send, 404, f"this agent has no remote MCP server {name!r}")
            return
        body = await read_body(receive, REQUEST_BODY_LIMIT)
        if body is None:
            await _json_error(send, 413, "the request body is over 64 MiB")
            return
        forwarded = await mcp_route.forward(
            agent_id=self.agent_id,
            name=name,
            route=route,
            rest=rest,
            scope=scope,
            body=body,
            token=self._token,
            client=self._client,
            send=send,
        )
        if not forwarded:
            await _json_error(send, 502, f"the MCP server {name} cannot be reached")

    async def _relay(self, response: httpx.Response, send: Send) -> None:
        if response.status_code == 429:
            self._counters.rate_limited(retry_after_s(response.headers.get("retry-after")))
        tap = UsageTap(response.headers.get("content-type", ""))
        out = [(k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP]
        if (length := response.headers.get("content-length")) is not None:
            out.append((b"content-length", length.encode()))
        await send({"type": "http.response.start", "status": response.status_code, "headers": out})
        down = 0
        try:
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                down += len(chunk)
                tap.feed(chunk)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self._counters.add(bytes_down=down)
            self._counters.used(tap.close())

    def _url(self, route: Route, rest: str, query: bytes, secret: str | None) -> str:
        url = f"{route.base_url}/{rest}" if rest else str(route.base_url)
        if query:
            text = query.decode("latin-1")
            text = text.replace(self.placeholder, quote(secret or "", safe=""))
            url += "?" + text
        return url

    def _headers(
        self, headers: list[tuple[bytes, bytes]], route: Route, secret: str | None
    ) -> list[tuple[bytes, bytes]]:
        drop = set(HOP_BY_HOP)
        for name, value in headers:
            if name == b"connection":
                drop.update(t.strip().lower() for t in value.split(b","))
        out: list[tuple[bytes, bytes]] = []
        real = (secret or "").encode()
        for name, value in headers:
            if name in drop or name == b"accept-encoding":
                continue
            if self._token in value:
                if secret is None:
                    continue  # a provider that needs no key gets none
                value = value.replace(self._token, real)
            out.append((name, value))
        if route.bearer_beta is not None and secret is not None:
            out = [(k, v) for k, v in out if k not in (b"x-api-key", b"authorization")]
            out.append((b"authorization", b"Bearer " + real))
            betas = [v for k, v in out if k == b"anthropic-beta"]
            out = [(k, v) for k, v in out if k != b"anthropic-beta"]
            out.append((b"anthropic-beta", b",".join([*betas, route.bearer_beta.encode()])))
        configured = {k.lower().encode(): v.encode() for k, v in route.headers.items()}
        out = [(k, v) for k, v in out if k not in configured]
        out.extend(configured.items())
        # Plain bytes back, so the usage in them can be read (and nothing is decoded twice).
        out.append((b"accept-encoding", b"identity"))
        return out

    async def _refuse(self, headers: list[tuple[bytes, bytes]], query: bytes, send: Send) -> None:
        self._counters.add(refused=1)
        other = _other_placeholder(headers, query)
        owner = self._owner_of(other) if other else None
        if other:
            why = "it carries another agent's gateway credential"
            log.warning(
                "gateway: refused a request on agent %s's port carrying the credential of %s",
                self.agent_id,
                owner or "no agent of this Computer",
            )
        else:
            why = "it carries no gateway credential"
            log.warning(
                "gateway: refused a request on agent %s's port: no credential", self.agent_id
            )
        await _json_error(
            send,
            401,
            f"refused by the crew model gateway: {why}. Each agent reaches its models only "
            "through its own port with its own credential.",
        )


def _other_placeholder(headers: list[tuple[bytes, bytes]], query: bytes) -> str | None:
    prefix = PLACEHOLDER_PREFIX.encode()
    for value in [query, *(v for _, v in headers)]:
        at = value.find(prefix)
        if at >= 0:
            return value[at : at + len(prefix) + 32].decode("latin-1")
    return None


async def _json_error(send: Send, status: int, message: str) -> None:
    body = orjson.dumps({"error": {"type": "crew_gateway", "message": message}})
    headers: list[tuple[bytes, bytes]] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
