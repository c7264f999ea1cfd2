"""The introspection app: routes, errors, SSE, metrics; the socket's permissions; the schema."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml

from computer_service.introspection import (
    AgentDetail,
    AgentRow,
    EventBus,
    Health,
    IntrospectionServer,
    TurnSummary,
    create_app,
)
from crew_harness.waiting import wait_until_async
from tests.computer.static_view import StaticView

OPENAPI = Path(__file__).resolve().parents[2] / "openapi" / "computer.yaml"


@pytest.fixture
def view() -> StaticView:
    return StaticView()


def client_for(view: StaticView, bus: EventBus | None = None) -> httpx.AsyncClient:
    app = create_app(view, bus or EventBus())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://computer")


@pytest.mark.anyio
async def test_routes_answer_and_errors_are_json(view: StaticView) -> None:
    async with client_for(view) as client:
        health = (await client.get("/health")).json()
        assert health["sandbox"] == {
            "ok": True,
            "backend": "bwrap",
            "reason": None,
            "not_granted": [],
            "network": "namespace",
        }
        rows = (await client.get("/agents")).json()
        assert [r["handle"] for r in rows] == ["alice", "bob"]
        detail = (await client.get("/agents/a1")).json()
        assert detail["recent_turns"][0]["failure_class"] == "engine_error"

        missing = await client.get("/agents/nope")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
        assert "nope" in missing.json()["error"]["message"]

        assert (await client.post("/agents/a1/wake")).status_code == 202
        assert view.woken == ["a1"]
        refused = await client.post("/agents/a2/wake")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "conflict"

        stop = await client.post("/agents/a1/stop")
        assert stop.status_code == 202 and stop.json() == {"id": "a1", "accepted": True}
        again = await client.post("/agents/a1/stop")
        assert again.status_code == 200 and again.json()["accepted"] is False

        wrong_method = await client.delete("/health")
        assert wrong_method.status_code == 405
        assert wrong_method.json()["error"]["code"] == "method_not_allowed"
        unknown = await client.get("/nowhere")
        assert unknown.status_code == 404 and "no route" in unknown.json()["error"]["message"]


@pytest.mark.anyio
async def test_metrics_are_prometheus_text(view: StaticView) -> None:
    view.metrics.turn_finished("succeeded", 0.3)
    view.metrics.turn_finished("failed", 12.0)
    view.metrics.batches_sent = 4
    view.metrics.batches_dropped = 1
    view.metrics.queue_length = lambda: 7
    async with client_for(view) as client:
        response = await client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert 'crew_turns_total{result="succeeded"} 1' in text
    assert 'crew_turns_total{result="failed"} 1' in text
    assert 'crew_turn_duration_seconds_bucket{le="0.5"} 1' in text
    assert 'crew_turn_duration_seconds_bucket{le="+Inf"} 2' in text
    assert 'crew_report_batches_total{outcome="dropped"} 1' in text
    assert "crew_turn_queue_length 7" in text


@pytest.mark.anyio
async def test_events_stream_state_changes_until_the_bus_closes(view: StaticView) -> None:
    bus = EventBus()
    app = create_app(view, bus)
    received: list[bytes] = []

    async def reader() -> None:
        # Drive the ASGI app directly: ASGITransport buffers whole responses.
        messages: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            await anyio.sleep_forever()
            return {}

        async def send(message: dict[str, Any]) -> None:
            messages.append(message)
            if message["type"] == "http.response.body" and message.get("body"):
                received.append(message["body"])

        scope = {
            "type": "http",
            "method": "GET",
            "path": "/events",
            "headers": [],
            "query_string": b"",
            "root_path": "",
            "scheme": "http",
            "http_version": "1.1",
            "server": ("computer", 80),
            "client": None,
            "asgi": {"version": "3.0"},
        }
        await app(scope, receive, send)

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        await wait_until_async("a subscriber", lambda: bus.has_subscribers, 5)
        bus.publish("state", {"id": "a1", "state": "running"})
        bus.publish("engine", {"agent_id": "a1", "type": "text", "data": {"text": "hi"}})
        await wait_until_async("three chunks", lambda: len(received) >= 3, 5)
        bus.close()
    body = b"".join(received)
    assert b'event: state\ndata: {"id":"a1","state":"running"}\n\n' in body
    assert f"id: {bus.stream}-1\nevent: state\n".encode() in body
    assert f"id: {bus.stream}-2\nevent: engine\n".encode() in body
    assert b"event: engine\n" in body
    assert body.index(b"event: state") < body.index(b"event: engine")


@pytest.mark.anyio
async def test_served_on_the_unix_socket(tmp_path: Path, view: StaticView) -> None:
    path = tmp_path / "sockets" / "computer.sock"
    server = IntrospectionServer(create_app(view, EventBus()), path)
    await server.start()
    try:
        transport = httpx.AsyncHTTPTransport(uds=str(path))
        async with httpx.AsyncClient(transport=transport, base_url="http://computer") as client:
            assert (await client.get("/health")).json()["ready"] is True
    finally:
        await server.stop()
    assert not path.exists()


def test_openapi_documents_every_route_and_the_models() -> None:
    spec = yaml.safe_load(OPENAPI.read_text())
    app = create_app(StaticView(), EventBus())
    routes = {(m, r.path) for r in app.routes for m in getattr(r, "methods", set()) if m != "HEAD"}
    documented = {
        (m.upper(), p.replace("{agent_id}", "{agent_id}"))
        for p, ops in spec["paths"].items()
        for m in ops
        if m != "parameters"
    }
    assert routes == documented
    schemas = spec["components"]["schemas"]
    for model, name in (
        (Health, "Health"),
        (AgentRow, "AgentRow"),
        (AgentDetail, "AgentDetail"),
        (TurnSummary, "TurnSummary"),
    ):
        assert set(model.model_fields) == set(schemas[name]["properties"]), name
        assert set(schemas[name]["required"]) == set(model.model_fields), name


RAW_GET = (
    "import socket,sys\n"
    "s=socket.socket(socket.AF_UNIX)\n"
    "s.connect(sys.argv[1])\n"
    "sys.stdout.write('connected\\n')\n"
    "s.sendall(b'GET /health HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
    "sys.stdout.write(s.recv(65536).decode())\n"
)


async def _raw_get(path: Path, allowed_uid: int, user: int | None) -> str:
    server = IntrospectionServer(create_app(StaticView(), EventBus()), path, allowed_uid)
    await server.start()
    try:
        # Reachable by anyone on purpose: here only the peer check stands guard.
        os.chmod(path.parent, 0o755)
        os.chmod(path, 0o666)
        done = await anyio.run_process(
            ["/usr/bin/python3" if user is not None else sys.executable, "-c", RAW_GET, str(path)],
            user=user,
            check=False,
        )
        return done.stdout.decode()
    finally:
        await server.stop()


@pytest.mark.anyio
async def test_another_uid_is_cut_off_before_any_http() -> None:
    root = Path(tempfile.mkdtemp(prefix="cc-peer-", dir="/tmp"))
    try:
        os.chmod(root, 0o755)
        served = await _raw_get(root / "a" / "computer.sock", os.getuid(), None)
        assert served.startswith("connected\nHTTP/1.1 200")
        refused = await _raw_get(root / "b" / "computer.sock", os.getuid() + 4242, None)
        assert refused == "connected\n"  # reached, then closed without a byte
        if os.getuid() == 0 and os.path.exists("/usr/bin/python3"):
            # A real other user, when we can act as one.
            other = await _raw_get(root / "c" / "computer.sock", 0, 65534)
            assert other == "connected\n"
    finally:
        shutil.rmtree(root, ignore_errors=True)
