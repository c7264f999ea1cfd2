"""The model gateway in-process (issue 23): placeholders, routes, streaming, usage, 429s.

Real sockets on loopback: the gateway's own listeners, the scripted model
(which requires the real key, so a call that works proves the gateway put it
in) and small upstream apps served by uvicorn on this event loop.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import orjson
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from computer_service.engine.base import Failure, FailureClass, TurnResult
from computer_service.engine.pipeline import gateway_rate_limit
from computer_service.gateway.forward import Route, retry_after_s
from computer_service.gateway.gateway import Gateway
from computer_service.gateway.logins import KeyLogin
from crew_common.tcp_listener import tcp_listener
from crew_harness.scripted_model import ScriptedModel

pytestmark = pytest.mark.anyio

REAL_KEY = "sk-real-user-key-0123456789"
App = Callable[[Scope, Receive, Send], Any]


@contextlib.asynccontextmanager
async def serving(app: App) -> AsyncIterator[str]:
    """`app` served on a loopback port of this event loop; its base URL."""
    sock = tcp_listener("127.0.0.1", 0)
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[sock])
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await server.shutdown()


class Echo:
    """An upstream that records each request and answers with `status` and `headers`."""

    def __init__(self, status: int = 200, headers: list[tuple[bytes, bytes]] | None = None):
        self.seen: list[dict[str, Any]] = []
        self.status = status
        self.headers = headers or []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.seen.append(
            {
                "path": scope["path"],
                "query": scope["query_string"].decode(),
                "headers": {k.decode(): v.decode() for k, v in scope["headers"]},
                "body": body,
            }
        )
        reply = orjson.dumps({"usage": {"prompt_tokens": 5, "completion_tokens": 2}})
        await send(
            {
                "type": "http.response.start",
                "status": self.status,
                "headers": [(b"content-type", b"application/json"), *self.headers],
            }
        )
        await send({"type": "http.response.body", "body": reply})


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    gw = Gateway()
    try:
        yield gw
    finally:
        await gw.aclose()


async def test_the_real_key_replaces_the_placeholder_and_the_path_maps(gateway: Gateway) -> None:
    with ScriptedModel(required_key=REAL_KEY) as model:
        access = await gateway.access_for("a")
        gateway.route("a", "local", Route(model.base_url, KeyLogin(REAL_KEY)))
        body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
        async with httpx.AsyncClient() as client:
            answer = await client.post(
                f"{access.base_url('local')}/chat/completions",
                json={**body, "stream": True, "stream_options": {"include_usage": True}},
                headers={"Authorization": f"Bearer {access.placeholder}"},
            )
            assert answer.status_code == 200, answer.text
            assert "data: [DONE]" in answer.text
            # Without the gateway the placeholder is worth nothing at the provider.
            direct = await client.post(
                f"{model.base_url}/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {access.placeholder}"},
            )
            assert direct.status_code == 401
        [forwarded, _refused] = model.requests()
        assert forwarded.authorization == f"Bearer {REAL_KEY}"
    traffic = gateway.snapshot("a")
    # The scripted model's usage chunk: 109 in (10 of them cached), 20 out.
    assert (traffic.requests, traffic.input_tokens, traffic.output_tokens) == (1, 109, 20)
    assert traffic.cache_read == 10 and traffic.bytes_down > 0


async def test_no_credential_or_another_agents_is_refused_and_logged(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    echo = Echo()
    async with serving(echo) as upstream, httpx.AsyncClient() as client:
        mine = await gateway.access_for("a")
        theirs = await gateway.access_for("b")
        assert mine.port != theirs.port and mine.placeholder != theirs.placeholder
        gateway.route("a", "p", Route(upstream, KeyLogin(REAL_KEY)))
        gateway.route("b", "p", Route(upstream, KeyLogin(REAL_KEY)))
        url = f"{mine.base_url('p')}/chat/completions"
        with caplog.at_level(logging.WARNING, "computer_service.gateway"):
            none = await client.post(url, json={})
            other = await client.post(
                url, json={}, headers={"Authorization": f"Bearer {theirs.placeholder}"}
            )
            in_query = await client.post(url, json={}, params={"key": theirs.placeholder})
        for answer in (none, other, in_query):
            assert answer.status_code == 401
            assert "crew model gateway" in answer.json()["error"]["message"]
        assert "another agent's" in other.json()["error"]["message"]
        assert echo.seen == []  # nothing reached the provider
        assert "credential of b" in caplog.text and "no credential" in caplog.text
        # Its own placeholder on its own port works.
        ok = await client.post(
            f"{theirs.base_url('p')}/x", json={}, headers={"x-api-key": theirs.placeholder}
        )
        assert ok.status_code == 200 and len(echo.seen) == 1
    assert gateway.snapshot("a").refused == 3 and gateway.snapshot("b").refused == 0
    assert "crew_gateway_refused_total 3" in gateway.metric_lines()


async def test_headers_and_query_carry_the_real_key_and_no_hop_by_hop(gateway: Gateway) -> None:
    echo = Echo()
    async with serving(echo) as upstream, httpx.AsyncClient() as client:
        access = await gateway.access_for("a")
        route = Route(f"{upstream}/v1beta", KeyLogin(REAL_KEY), {"X-Org": "org-from-config"})
        gateway.route("a", "google", route)
        answer = await client.post(
            f"{access.base_url('google')}/models/m:generate",
            params={"key": access.placeholder, "alt": "sse"},
            content=b'{"q": 1}',
            headers={
                "x-goog-api-key": access.placeholder,
                "api-key": f"prefix {access.placeholder}",
                "Connection": "keep-alive, x-private",
                "x-private": "hop",
                "Proxy-Authorization": "Basic abc",
                "x-org": "from-the-engine",
            },
        )
    assert answer.status_code == 200
    [seen] = echo.seen
    assert seen["path"] == "/v1beta/models/m:generate"
    assert seen["query"] == f"key={REAL_KEY}&alt=sse"
    headers = seen["headers"]
    assert headers["x-goog-api-key"] == REAL_KEY and headers["api-key"] == f"prefix {REAL_KEY}"
    assert headers["x-org"] == "org-from-config"  # the config's header, not the engine's
    assert "x-private" not in headers and "proxy-authorization" not in headers
    assert seen["body"] == b'{"q": 1}'
    assert access.placeholder not in repr(seen)


async def test_a_keyless_provider_gets_no_placeholder(gateway: Gateway) -> None:
    echo = Echo()
    async with serving(echo) as upstream, httpx.AsyncClient() as client:
        access = await gateway.access_for("a")
        gateway.route("a", "ollama", Route(upstream, KeyLogin(None)))
        auth = {"Authorization": f"Bearer {access.placeholder}"}
        answer = await client.get(f"{access.base_url('ollama')}/api/tags", headers=auth)
    assert answer.status_code == 200
    assert "authorization" not in echo.seen[0]["headers"]


async def test_an_unknown_provider_is_a_clear_502(gateway: Gateway) -> None:
    async with httpx.AsyncClient() as client:
        access = await gateway.access_for("a")
        gateway.route("a", "mystery", Route(None, KeyLogin(REAL_KEY)))
        auth = {"Authorization": f"Bearer {access.placeholder}"}
        answer = await client.post(f"{access.base_url('mystery')}/x", headers=auth)
        missing = await client.post(f"{access.base_url('nope')}/x", headers=auth)
    assert answer.status_code == 502 and "baseURL" in answer.json()["error"]["message"]
    assert missing.status_code == 404


async def test_a_stream_passes_chunk_by_chunk(gateway: Gateway) -> None:
    """The upstream sends its second chunk only once the client has the first: a gateway
    that held chunks back would never deliver it (the test then fails at its deadline)."""
    first_seen = anyio.Event()

    async def upstream_app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"data: one\n\n", "more_body": True})
        await first_seen.wait()
        await send({"type": "http.response.body", "body": b"data: two\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async with serving(upstream_app) as upstream, httpx.AsyncClient() as client:
        access = await gateway.access_for("a")
        gateway.route("a", "p", Route(upstream, KeyLogin(REAL_KEY)))
        auth = {"Authorization": f"Bearer {access.placeholder}"}
        got: list[bytes] = []
        with anyio.fail_after(20):
            async with client.stream("POST", f"{access.base_url('p')}/s", headers=auth) as r:
                async for chunk in r.aiter_raw():
                    got.append(chunk)
                    if b"one" in chunk:
                        first_seen.set()
    assert b"".join(got) == b"data: one\n\ndata: two\n\n"
    assert got[0] == b"data: one\n\n"


async def test_a_429_is_counted_with_its_retry_after(gateway: Gateway) -> None:
    echo = Echo(status=429, headers=[(b"retry-after", b"7")])
    async with serving(echo) as upstream, httpx.AsyncClient() as client:
        access = await gateway.access_for("a")
        gateway.route("a", "p", Route(upstream, KeyLogin(REAL_KEY)))
        before = gateway.snapshot("a")
        auth = {"Authorization": f"Bearer {access.placeholder}"}
        answer = await client.post(f"{access.base_url('p')}/chat/completions", headers=auth)
    assert answer.status_code == 429 and answer.headers["retry-after"] == "7"
    turn = gateway.snapshot("a").since(before)
    assert turn["rate_limited"] == 1 and turn["retry_after_s"] == 7.0 and turn["requests"] == 1
    failed = TurnResult("failed", Failure(FailureClass.ENGINE_ERROR, "AI_APICallError"))
    result = gateway_rate_limit(failed, turn)
    assert result.failure is not None and result.failure.cls is FailureClass.RATE_LIMITED
    assert result.failure.retry_after_s == 7.0
    succeeded = TurnResult("succeeded")
    assert gateway_rate_limit(succeeded, turn) is succeeded  # OpenCode's retry worked


def test_retry_after_reads_seconds_and_dates() -> None:
    assert retry_after_s("30") == 30.0
    assert retry_after_s(None) is None and retry_after_s("soon") is None
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past


async def test_the_listener_and_placeholder_stay_for_the_agent(gateway: Gateway) -> None:
    first = await gateway.access_for("a")
    assert await gateway.access_for("a") == first  # a warm server keeps using it


async def test_an_anthropic_oauth_token_goes_as_a_bearer_with_its_beta(gateway: Gateway) -> None:
    echo = Echo()
    async with serving(echo) as upstream, httpx.AsyncClient() as client:
        access = await gateway.access_for("a")
        route = Route(upstream, KeyLogin("oauth-access"), bearer_beta="oauth-2025-04-20")
        gateway.route("a", "anthropic", route)
        answer = await client.post(
            f"{access.base_url('anthropic')}/messages",
            headers={"x-api-key": access.placeholder, "anthropic-beta": "tools-1"},
        )
    assert answer.status_code == 200
    headers = echo.seen[0]["headers"]
    assert "x-api-key" not in headers and headers["authorization"] == "Bearer oauth-access"
    assert headers["anthropic-beta"] == "tools-1,oauth-2025-04-20"
