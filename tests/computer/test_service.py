"""The service in-process against a real crew-server: event stream, reconnects, sync, stop."""

from __future__ import annotations

import random
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest

from computer_service.bootstrap import Bootstrap
from computer_service.event_stream import Backoff, agent_id_of
from computer_service.parts_protocol import StartupFailed
from computer_service.service import ComputerService
from computer_service.upstream import Upstream, UpstreamUnavailable
from crew_harness.waiting import wait_until_async
from crew_testkit.crew_server_proc import start_crew_server
from crew_testkit.scripted import ScriptedEngine, blocking
from tests.computer.fakes import FakeParts
from tests.support.turns import finished_async


@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_reconnects_after_a_server_restart_and_handles_what_came_meanwhile(
    tmp_path: Path,
) -> None:
    (tmp_path / "srv").mkdir()
    server = start_crew_server(tmp_path / "srv")
    port = int(server.url.rsplit(":", 1)[1])
    crew_home = tmp_path / "crew"
    engine = ScriptedEngine()
    parts = FakeParts(crew_home, engine)
    try:
        comp = server.create_computer()
        agent = server.create_agent("rc", computer_id=comp["computer_id"])
        room = server.create_room("dm", [agent["id"]])
        boot = Bootstrap(server_url=server.url, token=comp["token"], crew_home=crew_home)
        service = ComputerService(boot, parts, handle_signals=False)
        async with anyio.create_task_group() as tg:
            tg.start_soon(service.serve)
            with anyio.fail_after(20):
                await service.roster.synced.wait()
            server.post(room["id"], "before the restart")
            await finished_async(server, agent["id"], 1)

            server.stop()
            await wait_until_async(
                "the Computer to notice", lambda: not service.events.connected, 20
            )
            server = start_crew_server(tmp_path / "srv", db=server.db, port=port)
            server.post(room["id"], "while the Computer was away")
            turns = await finished_async(server, agent["id"], 2, timeout=45)
            assert [t["status"] for t in turns] == ["succeeded", "succeeded"]
            assert "while the Computer was away" in engine.inputs[1]
            assert "before the restart" not in engine.inputs[1]  # acked, not handled twice
            assert service.events.connected

            # The introspection socket serves while running.
            transport = httpx.AsyncHTTPTransport(uds=str(crew_home / "sockets" / "computer.sock"))
            async with httpx.AsyncClient(transport=transport, base_url="http://c") as local:
                rows = (await local.get("/agents")).json()
                assert rows[0]["last_result"] == "succeeded"
                woken = await local.post(f"/agents/{agent['id']}/wake")
                assert woken.status_code == 202
            service.request_stop()
        assert parts.launcher_stopped
        assert not (crew_home / "runtime" / "testrun").exists()
        assert not (crew_home / "sockets" / "computer.sock").exists()
    finally:
        server.stop()


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_agent_changes_replace_and_drop_runners(tmp_path: Path) -> None:
    (tmp_path / "srv").mkdir()
    server = start_crew_server(tmp_path / "srv")
    crew_home = tmp_path / "crew"
    engine = ScriptedEngine()
    try:
        comp = server.create_computer()
        other = server.create_computer("other")
        agent = server.create_agent("chg", computer_id=comp["computer_id"])
        boot = Bootstrap(server_url=server.url, token=comp["token"], crew_home=crew_home)
        service = ComputerService(boot, FakeParts(crew_home, engine), handle_signals=False)
        async with anyio.create_task_group() as tg:
            tg.start_soon(service.serve)
            await wait_until_async("a runner", lambda: agent["id"] in service.roster.runners, 20)
            first = service.roster.runners[agent["id"]]
            server.client().patch(
                f"/api/agents/{agent['id']}", json={"model": "local/other"}
            ).raise_for_status()
            await wait_until_async(
                "a new runner",
                lambda: service.roster.runners.get(agent["id"]) not in (None, first),
                20,
            )
            assert service.roster.runners[agent["id"]].agent.model == "local/other"
            assert first.finished.is_set()
            agents_md = (crew_home / "agents" / agent["id"] / "AGENTS.md").read_text()
            assert "@chg" in agents_md

            # Moved to another Computer: the runner is dropped.
            server.client().patch(
                f"/api/agents/{agent['id']}", json={"computer_id": other["computer_id"]}
            )
            await wait_until_async(
                "the runner dropped", lambda: agent["id"] not in service.roster.runners, 20
            )
            service.request_stop()
    finally:
        server.stop()


def test_backoff_is_capped_jittered_and_honours_retry() -> None:
    random.seed(7)
    backoff = Backoff(initial_s=0.5, cap_s=8)
    delays = [backoff.next_delay() for _ in range(10)]
    assert all(0.25 <= d <= 8 for d in delays)
    assert delays[0] <= 0.5 and max(delays[6:]) <= 8 and min(delays[6:]) >= 4
    backoff.reset()
    backoff.server_retry(2000)
    first = backoff.next_delay()
    assert 1.0 <= first <= 2.0
    assert len({round(d, 6) for d in delays}) > 5  # jittered, not lockstep


@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_server_restart_during_a_turn_loses_nothing_and_acks_once(tmp_path: Path) -> None:
    (tmp_path / "srv").mkdir()
    server = start_crew_server(tmp_path / "srv")
    port = int(server.url.rsplit(":", 1)[1])
    crew_home = tmp_path / "crew"
    release = anyio.Event()
    engine = ScriptedEngine(script=[blocking(release)])
    try:
        comp = server.create_computer()
        agent = server.create_agent("rs", computer_id=comp["computer_id"])
        room = server.create_room("dm", [agent["id"]])
        boot = Bootstrap(server_url=server.url, token=comp["token"], crew_home=crew_home)
        service = ComputerService(boot, FakeParts(crew_home, engine), handle_signals=False)
        async with anyio.create_task_group() as tg:
            tg.start_soon(service.serve)
            server.post(room["id"], "during the restart")
            with anyio.fail_after(20):
                await engine.started.wait()
            server.stop()
            reported = service.metrics.events_reported
            release.set()  # the engine's events come while the server is down: they wait
            await wait_until_async(
                "the engine's last events", lambda: service.metrics.events_reported > reported
            )
            server = start_crew_server(tmp_path / "srv", db=server.db, port=port)
            [turn] = await finished_async(server, agent["id"], 1)
            assert turn["status"] == "succeeded"  # the ack and the finish waited for the server
            [position] = server.positions(agent["id"])
            assert position["read_seq"] == position["delivered_seq"] == 1
            server.post(room["id"], "after the restart")
            turns = await finished_async(server, agent["id"], 2)
            assert turns[1]["status"] == "succeeded"
            assert "after the restart" in engine.inputs[1]
            assert "during the restart" not in engine.inputs[1]  # handled once, acked once
            assert service.metrics.batches_dropped == 0  # they went out once it was back
            service.request_stop()
    finally:
        server.stop()


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_a_replaced_computer_exits_1_with_one_line_and_acks_nothing(
    tmp_path: Path,
) -> None:
    """The app started twice: the first Computer hears `superseded` (its turn's writes and
    its event stream), stops without ack and exits 1; the message stays unread."""
    (tmp_path / "srv").mkdir()
    server = start_crew_server(tmp_path / "srv")
    crew_home = tmp_path / "crew"
    release = anyio.Event()
    engine = ScriptedEngine(script=[blocking(release)])
    try:
        comp = server.create_computer()
        agent = server.create_agent("fx", computer_id=comp["computer_id"])
        room = server.create_room("dm", [agent["id"]])
        boot = Bootstrap(server_url=server.url, token=comp["token"], crew_home=crew_home)
        service = ComputerService(boot, FakeParts(crew_home, engine), handle_signals=False)
        failures: list[str] = []

        async def serve() -> None:
            # `crew-computer` prints this one line and exits 1 (computer_service.__main__).
            with pytest.raises(StartupFailed) as failed:
                await service.serve()
            failures.append(str(failed.value))

        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            server.post(room["id"], "answered by whom?")
            with anyio.fail_after(20):
                await engine.started.wait()
            newer = Upstream(server.url, comp["token"])
            await newer.connect("elsewhere", "linux", "0", 2)
            release.set()
            await wait_until_async("the old Computer to stop", lambda: failures, 30)
            assert "another Computer connected" in failures[0]
            # Nothing acked: the newer connection still finds the message unread.
            rooms = await newer.claim_unread(agent["id"])
            assert [m.body for r in rooms for m in r.messages] == ["answered by whom?"]
            await newer.aclose()
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ('{"agent_id": "a1"}', "a1"),
        ("not json", None),
        ("[1, 2]", None),
        ('{"agent_id": 5}', None),
        ('{"other": "x"}', None),
        ("\udcff", None),
    ],
)
def test_malformed_wake_events_are_recognised(data: str, expected: str | None) -> None:
    assert agent_id_of(data) == expected


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_an_event_stream_gone_silent_is_dead_after_the_watchdogs_setting() -> None:
    """A server that opens the stream, pings once, then says nothing (a half-open connection)."""

    async def silent_server(stream: anyio.abc.SocketStream) -> None:
        await stream.receive()  # the request
        await stream.send(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\nevent: ping\ndata: {}\n\n"
        )
        await anyio.sleep_forever()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    upstream = Upstream(f"http://127.0.0.1:{port}", "t", sse_read_timeout_s=0.5)
    seen: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, silent_server)
        with anyio.fail_after(10), pytest.raises(UpstreamUnavailable, match="event stream"):
            async with upstream.events(None) as source:
                async for event in source.aiter_sse():
                    seen.append(event.event)
        tg.cancel_scope.cancel()
    await upstream.aclose()
    assert seen == ["ping"]
