"""The gateway's canned warm-up route (`gateway.warm_up`, issue 26), on a real listener.

It answers a model call with its canned stream only while the agent's warm-up gate is
open; outside, it refuses (409). It needs the agent's placeholder like every route, it
answers nothing but a model call's path, and it never forwards nor counts usage: the
agent's real provider route (an upstream that records every request) sees nothing.
What a tool could get from it during a warm-up is the canned text, nothing more.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from computer_service.gateway.access import GatewayAccess
from computer_service.gateway.forward import Route
from computer_service.gateway.gateway import Gateway
from computer_service.gateway.logins import KeyLogin
from computer_service.gateway.warm_up import CANNED_TEXT, TWIN_PROVIDER, twin_provider
from tests.computer_unit.test_gateway import Echo, serving

pytestmark = pytest.mark.anyio

CHAT = {"model": "scripted", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def sse_data(text: str) -> list[Any]:
    return [
        orjson.loads(line[6:])
        for line in text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


async def test_canned_only_while_the_gate_is_open_never_forwarded_never_counted() -> None:
    upstream = Echo()
    gateway = Gateway()
    try:
        async with serving(upstream) as up:
            access = await gateway.access_for("a")
            gateway.route("a", "local", Route(up, KeyLogin("sk-real")))
            gate = gateway.warm_up_gate("a")
            auth = {"authorization": f"Bearer {access.placeholder}"}
            url = access.base_url(TWIN_PROVIDER)
            async with httpx.AsyncClient(timeout=10) as client:
                # Outside a warm-up: refused, whoever asks with the right credential.
                closed = await client.post(f"{url}/chat/completions", json=CHAT, headers=auth)
                assert closed.status_code == 409, closed.text
                with gate.open():
                    # No placeholder: refused as on every route.
                    bare = await client.post(f"{url}/chat/completions", json=CHAT)
                    assert bare.status_code == 401
                    # Not a model call's path, or not a POST: 404.
                    other = await client.post(f"{url}/models", json=CHAT, headers=auth)
                    assert other.status_code == 404
                    get = await client.get(f"{url}/chat/completions", headers=auth)
                    assert get.status_code == 404
                    # Not JSON: 400.
                    junk = await client.post(
                        f"{url}/chat/completions", content=b"{no", headers=auth
                    )
                    assert junk.status_code == 400
                    chat = await client.post(f"{url}/chat/completions", json=CHAT, headers=auth)
                    assert chat.status_code == 200
                    assert chat.headers["content-type"].startswith("text/event-stream")
                    assert chat.text.endswith("data: [DONE]\n\n")
                    chunks = sse_data(chat.text)
                    deltas = [c["choices"][0]["delta"].get("content") for c in chunks[:-1]]
                    assert "".join(d or "" for d in deltas) == CANNED_TEXT
                    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
                    # Whatever it is asked, the answer is the canned one.
                    asked = {**CHAT, "messages": [{"role": "user", "content": "write a poem"}]}
                    again = await client.post(
                        f"{url}/v1/chat/completions", json=asked, headers=auth
                    )
                    assert again.text == chat.text.replace(
                        str(chunks[0]["created"]), str(sse_data(again.text)[0]["created"])
                    )
                    anthropic = await client.post(
                        f"{url}/messages", json={**CHAT, "model": "claude"}, headers=auth
                    )
                    events = sse_data(anthropic.text)
                    assert [e["type"] for e in events] == [
                        "message_start",
                        "content_block_start",
                        "content_block_delta",
                        "content_block_stop",
                        "message_delta",
                        "message_stop",
                    ]
                    assert events[2]["delta"]["text"] == CANNED_TEXT
                    responses = await client.post(f"{url}/responses", json=CHAT, headers=auth)
                    kinds = [e["type"] for e in sse_data(responses.text)]
                    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
                    plain = await client.post(
                        f"{url}/chat/completions", json={**CHAT, "stream": False}, headers=auth
                    )
                    assert plain.json()["choices"][0]["message"]["content"] == CANNED_TEXT
                # Closed again once the warm-up is over.
                after = await client.post(f"{url}/chat/completions", json=CHAT, headers=auth)
                assert after.status_code == 409
        assert upstream.seen == []  # nothing reached the provider
        snapshot = gateway.snapshot("a")
        assert snapshot.requests == 0 and snapshot.bytes_up == 0 and snapshot.bytes_down == 0
        assert snapshot.refused == 1  # the bare call, as on every route
        assert (gate.answered, gate.refused) == (5, 2)
        lines = gateway.metric_lines()
        assert "crew_gateway_warm_up_answers_total 5" in lines
        assert "crew_gateway_warm_up_refused_total 2" in lines
    finally:
        await gateway.aclose()


def test_the_twin_copies_the_package_and_the_model_shape_never_the_price() -> None:
    access = GatewayAccess(4242, "crew-gw-x")
    section = {
        "npm": "@ai-sdk/openai-compatible",
        "options": {"baseURL": "http://models.example/v1", "apiKey": "sk-real"},
        "models": {
            "m": {"name": "M", "tool_call": True, "cost": {"input": 1}, "limit": {"context": 9}}
        },
    }
    twin = twin_provider(section, "local", "m", access)
    assert twin == {
        TWIN_PROVIDER: {
            "npm": "@ai-sdk/openai-compatible",
            "name": "crew warm-up (answered by the Computer)",
            "options": {"baseURL": "http://127.0.0.1:4242/crew-warm-up", "apiKey": "crew-gw-x"},
            "models": {"m": {"name": "m", "tool_call": True, "limit": {"context": 9}}},
        }
    }
    # A built-in provider: its package by name; one whose dialect is not spoken: no twin.
    anthropic = twin_provider(None, "anthropic", "claude-x", access)
    assert anthropic is not None and anthropic[TWIN_PROVIDER]["npm"] == "@ai-sdk/anthropic"
    assert twin_provider(None, "google", "gemini", access) is None
    assert twin_provider({"npm": "@ai-sdk/mistral"}, "mistral", "x", access) is None
