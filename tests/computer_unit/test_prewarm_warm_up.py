"""A prewarm's warm-up (issue 26) and its key.

- `warm_run.warm_up`: on a fresh server, the path a first prompt boots lazily is gone
  through with a `noReply` message in a throwaway session (deleted after), so no model
  call; a server that refuses or breaks is only logged.
- `WarmPool.prewarm` runs it before the prewarm is over: a turn that comes meanwhile
  waits for it.
- A prewarm of an agent with capabilities (MCP servers, skills) prepares the same
  server key as that agent's turn, so the turn finds the prewarmed server.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from computer_service.engine.base import EventSink, StopSignal, WarmUp
from computer_service.engine.pipeline import Way
from computer_service.engine.preparation import PreparedTurn
from computer_service.engine.warm_channel import ServerAddress
from computer_service.engine.warm_pool import AgentServer, WarmPool, server_key
from computer_service.engine.warm_run import (
    RUN_PERMISSIONS,
    WARM_UP_TITLE,
    NoTimeLeft,
    _extra_key,
    warm_up,
)
from computer_service.gateway.warm_up import TWIN_PROVIDER, WarmUpGate, WarmUpTwin
from crew_common.capabilities import parse
from tests.computer_unit.engine_fixtures import make_rig
from tests.computer_unit.test_prewarm_pool import SlowLauncher
from tests.computer_unit.test_warm_parts import ENV, MB, Clock, FakeLauncher, request_for

pytestmark = pytest.mark.anyio

SESSION = "ses_0123456789abcdefWARMUP"


def fake_server(handle: Any) -> tuple[AgentServer, list[tuple[str, str, Any]]]:
    """A server whose HTTP answers come from `handle(request)`; what it got, in order."""
    seen: list[tuple[str, str, Any]] = []

    def record(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        seen.append((request.method, request.url.path, body))
        return handle(request)

    client = httpx.AsyncClient(
        transport=httpx.MockTransport(record), base_url="http://127.0.0.1:4001"
    )
    server = AgentServer(
        agent_id="a",
        address=ServerAddress(1, 1, 4001, "pw"),
        env_key="k",
        client=client,
        generation=object(),
    )
    return server, seen


def opencode(request: httpx.Request) -> httpx.Response:
    if request.method == "POST" and request.url.path == "/session":
        return httpx.Response(200, json={"id": SESSION})
    return httpx.Response(200, json=True)


async def test_the_warm_up_stores_a_message_without_a_reply_and_deletes_its_session() -> None:
    server, seen = fake_server(opencode)
    assert await warm_up(server, "local/scripted") is True
    assert seen == [
        ("POST", "/session", {"title": WARM_UP_TITLE, "permission": RUN_PERMISSIONS}),
        (
            "POST",
            f"/session/{SESSION}/message",
            {
                "noReply": True,
                "parts": [{"type": "text", "text": WARM_UP_TITLE}],
                "model": {"providerID": "local", "modelID": "scripted"},
            },
        ),
        ("DELETE", f"/session/{SESSION}", None),
    ]
    # Never a prompt that would ask the model.
    assert not any(path.endswith("/prompt_async") for _, path, _ in seen)
    await server.client.aclose()


async def test_with_a_twin_the_warm_up_prompts_its_model_while_the_gate_is_open() -> None:
    gate = WarmUpGate()
    during: list[bool] = []

    def answers(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/message"):
            during.append(gate.on)
            return httpx.Response(200, json={"info": {"role": "assistant"}, "parts": []})
        return opencode(request)

    server, seen = fake_server(answers)
    twin = WarmUpTwin(f"{TWIN_PROVIDER}/scripted", gate)
    assert await warm_up(server, "local/scripted", twin) is True
    assert seen[1] == (
        "POST",
        f"/session/{SESSION}/message",
        {
            "parts": [{"type": "text", "text": WARM_UP_TITLE}],
            "model": {"providerID": TWIN_PROVIDER, "modelID": "scripted"},
        },
    )  # a real prompt (no noReply), to the twin, never to the turn's provider
    assert seen[-1] == ("DELETE", f"/session/{SESSION}", None)
    assert during == [True] and gate.on is False  # open for the prompt only
    await server.client.aclose()

    # An answer that carries an error (the twin could not be reached) is no warm-up.
    def errs(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/message"):
            return httpx.Response(200, json={"info": {"error": {"name": "APIError"}}})
        return opencode(request)

    server, seen = fake_server(errs)
    assert await warm_up(server, "local/scripted", twin) is False
    assert seen[-1] == ("DELETE", f"/session/{SESSION}", None) and gate.on is False
    await server.client.aclose()


async def test_a_refused_warm_up_still_deletes_its_session_and_a_broken_one_never_raises() -> None:
    def refuses(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/message"):
            return httpx.Response(400, json={"error": "no such model"})
        return opencode(request)

    server, seen = fake_server(refuses)
    assert await warm_up(server, "local/missing") is False
    assert seen[-1] == ("DELETE", f"/session/{SESSION}", None)
    await server.client.aclose()

    def breaks(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("gone", request=request)

    server, seen = fake_server(breaks)
    assert await warm_up(server, "local/scripted") is False
    assert [path for _, path, _ in seen] == ["/session"]
    await server.client.aclose()

    no_session, seen = fake_server(lambda request: httpx.Response(404))
    assert await warm_up(no_session, "local/scripted") is False
    assert [path for _, path, _ in seen] == ["/session"]  # nothing sent to a session
    await no_session.client.aclose()


async def test_the_prewarm_warms_up_its_server_before_a_waiting_turn_gets_it() -> None:
    launcher = SlowLauncher()
    pool = WarmPool(launcher, memory_budget=4096 * MB, clock=Clock())
    warmed: list[AgentServer] = []
    warming = anyio.Event()
    finish = anyio.Event()

    async def warm(server: AgentServer) -> None:
        warming.set()
        await finish.wait()
        warmed.append(server)

    got: list[AgentServer | None] = []
    outcomes: list[str] = []

    async def turn() -> None:
        got.append(await pool.acquire("a", ENV, request_for("a")))

    async def prewarm() -> None:
        outcomes.append(await pool.prewarm("a", ENV, request_for("a"), warm_up=warm))

    async with anyio.create_task_group() as tg:
        tg.start_soon(prewarm)
        await launcher.entered.wait()
        launcher.go.set()
        with anyio.fail_after(10):  # the prewarm must warm its server up
            await warming.wait()
        tg.start_soon(turn)
        await anyio.sleep(0.05)
        assert got == [] and outcomes == []  # the turn waits for the warm-up
        finish.set()
    assert outcomes == ["started"] and launcher.started == ["a"]
    assert warmed == [pool.servers["a"]] and got == [pool.servers["a"]]
    assert pool.counters.turns_found_starting == 1
    server = got[0]
    assert server is not None
    await pool.release(server)
    # A second prewarm of a warm server warms nothing up again.
    assert await pool.prewarm("a", ENV, request_for("a"), warm_up=warm) == "warm"
    assert len(warmed) == 1
    await pool.close()


async def test_no_warm_up_for_a_server_that_did_not_start() -> None:
    pool = WarmPool(FakeLauncher(fail=True), memory_budget=4096 * MB, clock=Clock())
    warmed: list[AgentServer] = []

    async def warm(server: AgentServer) -> None:
        warmed.append(server)

    assert await pool.prewarm("a", ENV, request_for("a"), warm_up=warm) == "failed"
    assert warmed == []
    await pool.close()


class KeyWay(Way):
    """Records the server key each prewarm and each turn would ask the pool for."""

    def __init__(self) -> None:
        self.keys: list[tuple[str, str]] = []

    async def prewarm(self, turn: PreparedTurn) -> str:
        self.keys.append(("prewarm", server_key(turn.asking_env(), await _extra_key(turn))))
        return "started"

    @asynccontextmanager
    async def attempts(
        self, turn: PreparedTurn, on_event: EventSink, stop: StopSignal
    ) -> AsyncIterator[NoTimeLeft]:
        self.keys.append(("turn", server_key(turn.asking_env(), await _extra_key(turn))))
        yield NoTimeLeft(1.0)


CAPABILITIES = {
    "mcp_servers": [
        {
            "type": "local",
            "name": "notes",
            "command": ["python3", "-I", "notes.py"],
            "environment": {"NOTES_DIR": "/tmp/notes"},
            "secret_environment": {"TOKEN": "s3cret"},
        },
        {"type": "remote", "name": "docs", "url": "http://127.0.0.1:9/mcp"},
    ],
    "skills": [{"name": "tidy-up", "description": "Tidy the room.", "body": "# Tidy\nDo it."}],
}


async def test_a_prewarm_with_capabilities_keys_the_server_as_the_agents_turn(
    tmp_path: Path,
) -> None:
    rig = make_rig(tmp_path)
    rig.use(FakeLauncher())  # type: ignore[arg-type]  # the Way below replaces the cold one
    engine = rig.engine
    assert engine is not None
    way = engine.way = KeyWay()
    caps = parse(CAPABILITIES)
    agent_id = rig.paths.agent_id
    await engine.prewarm([WarmUp(agent_id, "local/scripted", capabilities=caps)])
    await rig.turn("hello", capabilities=caps)
    prewarm_keys = [key for what, key in way.keys if what == "prewarm"]
    turn_keys = [key for what, key in way.keys if what == "turn"]
    assert len(prewarm_keys) == 1 and turn_keys
    assert set(turn_keys) == set(prewarm_keys)

    # The key does depend on them: a prewarm without (or with other) capabilities would
    # start a server this turn could not use.
    way.keys.clear()
    await engine.prewarm([WarmUp(agent_id, "local/scripted")])
    other = parse({"skills": [{"name": "tidy-up", "description": "Other.", "body": "x"}]})
    await engine.prewarm([WarmUp(agent_id, "local/scripted", capabilities=other)])
    without, with_other = [key for _, key in way.keys]
    assert len({without, with_other, prewarm_keys[0]}) == 3
