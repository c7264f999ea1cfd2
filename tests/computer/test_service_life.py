"""The service's start, event stream and stop against an in-process fake server (computer.md §1).

`FakeCrewServer` scripts each `GET /computer/events` answer and records every
call, so reconnect details (backoff, `retry:`, `Last-Event-ID`, sync-then-wake)
are checked exactly and fast.
"""

from __future__ import annotations

import io
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest

from computer_service.bootstrap import Bootstrap
from computer_service.parts_protocol import ModelsFailed, StartupFailed
from computer_service.service import ComputerService
from computer_service.upstream import Upstream
from crew_harness.waiting import wait_until_async
from crew_testkit.scripted import ScriptedEngine
from tests.computer.fakes import UNUSABLE, FakeCrewServer, FakeParts, RecordingBackoff

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@dataclass
class Running:
    service: ComputerService
    server: FakeCrewServer
    parts: FakeParts
    stdout: io.BytesIO
    outcome: list[int | BaseException]

    @property
    def socket(self) -> Path:
        return self.service.crew_home / "sockets" / "computer.sock"

    def local(self) -> httpx.AsyncClient:
        transport = httpx.AsyncHTTPTransport(uds=str(self.socket))
        return httpx.AsyncClient(transport=transport, base_url="http://computer")


@asynccontextmanager
async def computer(
    tmp_path: Path,
    server: FakeCrewServer,
    *,
    parts: Callable[[Path], FakeParts] | None = None,
    backoff: RecordingBackoff | None = None,
    retry_base_s: float = 5.0,
) -> AsyncIterator[Running]:
    """Serve a Computer against `server`; on exit stop it and wait for `serve()` to return."""
    crew_home = tmp_path / "crew"
    made = parts(crew_home) if parts else FakeParts(crew_home, ScriptedEngine())
    boot = Bootstrap(
        server_url="http://crew.test",
        token="tok-computer",
        crew_home=crew_home,
        retry_base_s=retry_base_s,
    )
    stdout = io.BytesIO()
    upstream = Upstream(boot.server_url, boot.token, transport=server.transport())
    service = ComputerService(boot, made, upstream=upstream, stdout=stdout, handle_signals=False)
    if backoff is not None:
        service.events.backoff = backoff
    running = Running(service, server, made, stdout, [])

    async def serve() -> None:
        try:
            running.outcome.append(await service.serve())
        except StartupFailed as exc:
            running.outcome.append(exc)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            yield running
            service.request_stop()
    finally:
        server.closed.set()


def events(*lines: str) -> bytes:
    return ("\n".join(lines) + "\n\n").encode()


async def test_reconnects_back_off_honour_retry_resend_the_last_id_and_sync_then_wake(
    tmp_path: Path,
) -> None:
    server = FakeCrewServer()
    alice = server.agent("alice")
    bob_joined = anyio.Event()

    async def alice_claimed(times: int) -> None:
        await wait_until_async(
            f"{times} unread claims", lambda: server.unread_claims(alice["id"]) >= times
        )

    async def add_bob() -> None:
        await alice_claimed(2)
        server.agent("bob")  # appears while the stream is down: no event tells about it
        bob_joined.set()

    server.events_answers = [
        *[503] * 5,
        # Connected: a `retry:` and an id; the stream ends once alice was woken.
        [events("retry: 60", "id: 7", "event: ping", "data: {}"), lambda: alice_claimed(1)],
        [events("id: 9", "event: ping", "data: {}"), add_bob],
    ]
    backoff = RecordingBackoff(initial_s=0.01, cap_s=0.08)
    async with computer(tmp_path, server, backoff=backoff) as c:
        await wait_until_async("bob's unread claim", lambda: server.unread_claims("agent-bob") >= 1)
        assert c.service.events.connected
        # Every reconnect sends the id of the last event it saw.
        assert server.last_event_ids == [None] * 6 + ["7", "9"]
        # Five refusals: doubling from 0.01 s up to the 0.08 s cap, each jittered into its
        # upper half; then the server's `retry: 60` is the base after each successful connect.
        assert backoff.bases == pytest.approx([0.01] * 5 + [0.06, 0.06])
        ceilings = [0.01, 0.02, 0.04, 0.08, 0.08, 0.06, 0.06]
        assert len(backoff.delays) == len(ceilings)
        for delay, ceiling in zip(backoff.delays, ceilings, strict=True):
            assert ceiling / 2 - 1e-9 <= delay <= ceiling + 1e-9
        assert len({round(d, 9) for d in backoff.delays[3:5]}) == 2  # jittered, not lockstep
        # After every successful connect: the agent list first, then a wake-up for every
        # runner (alice claims although no wake event came; bob, new, is woken too).
        opens = [i for i, call in enumerate(server.calls) if call == ("GET", "/computer/events")]
        connected = opens[5:]
        assert len(connected) == 3
        for n, start in enumerate(connected):
            end = connected[n + 1] if n + 1 < len(connected) else len(server.calls)
            # (The model report runs alongside and may land anywhere.)
            after = [c for c in server.calls[start + 1 : end] if c[1] != "/computer/models"]
            assert after[0] == ("GET", "/computer/agents"), after
            assert ("POST", f"/computer/agents/{alice['id']}/unread") in after, after
        assert ("POST", "/computer/agents/agent-bob/unread") in server.calls[connected[2] :]
    assert c.outcome == [0]


async def test_a_refused_last_event_id_reconnects_afresh(tmp_path: Path) -> None:
    server = FakeCrewServer()
    server.events_answers = [[events("id: 5", "event: ping", "data: {}")], 422]
    async with computer(tmp_path, server, backoff=RecordingBackoff(0.01, 0.02)) as c:
        await wait_until_async("three event streams", lambda: len(server.last_event_ids) == 3)
        await wait_until_async("connected", lambda: c.service.events.connected)
        assert server.last_event_ids == [None, "5", None]
    assert c.outcome == [0]


async def test_a_busy_server_is_retried_not_fatal(tmp_path: Path) -> None:
    server = FakeCrewServer()
    server.events_answers = [429, 408, 503]
    async with computer(tmp_path, server, backoff=RecordingBackoff(0.01, 0.02)) as c:
        await wait_until_async("connected", lambda: c.service.events.connected)
        assert len(server.last_event_ids) == 4
    assert c.outcome == [0]


async def test_a_refused_token_on_the_event_stream_exits_1_after_an_orderly_stop(
    tmp_path: Path,
) -> None:
    server = FakeCrewServer()
    server.agent("alice")
    server.events_answers = [401]
    async with computer(tmp_path, server) as c:
        await wait_until_async("the start-up outcome", lambda: c.outcome, 10)
    [failed] = c.outcome
    assert isinstance(failed, StartupFailed)
    assert "token was refused" in str(failed) and "tok-computer" not in str(failed)
    assert c.parts.launcher_stopped
    assert not c.socket.exists()
    assert not (c.service.crew_home / "runtime" / "testrun").exists()


async def test_an_event_stream_the_server_refuses_at_once_exits_1(tmp_path: Path) -> None:
    server = FakeCrewServer()
    server.events_answers = [404]
    async with computer(tmp_path, server) as c:
        await wait_until_async("the start-up outcome", lambda: c.outcome, 10)
    [failed] = c.outcome
    assert isinstance(failed, StartupFailed)
    assert str(failed).startswith("cannot subscribe to the crew server's events")


async def test_models_that_cannot_be_read_exit_1(tmp_path: Path) -> None:
    server = FakeCrewServer()

    def parts(crew_home: Path) -> FakeParts:
        made = FakeParts(crew_home, ScriptedEngine())
        made.models_errors = [ModelsFailed("opencode models took over 30 s and was stopped")]
        return made

    async with computer(tmp_path, server, parts=parts) as c:
        await wait_until_async("the start-up outcome", lambda: c.outcome, 10)
    [failed] = c.outcome
    assert isinstance(failed, StartupFailed)
    assert str(failed) == (
        "cannot read the available models: opencode models took over 30 s and was stopped"
    )
    assert server.models is None
    assert c.parts.launcher_stopped and not c.socket.exists()


async def test_models_are_retried_while_the_launcher_restarts_or_the_server_is_down(
    tmp_path: Path,
) -> None:
    server = FakeCrewServer()
    server.models_statuses = [503, 503]

    def parts(crew_home: Path) -> FakeParts:
        made = FakeParts(crew_home, ScriptedEngine())
        made.models_errors = [RuntimeError("the sandbox launcher is not running")]
        return made

    async with computer(tmp_path, server, parts=parts, backoff=RecordingBackoff(0.01, 0.02)) as c:
        await wait_until_async("the models", lambda: server.models is not None, timeout=20)
        assert server.models == ["local/scripted", "local/other", "local/fake"]
        assert c.parts.models_calls == 2  # read again after the launcher error, not after a 503
        assert server.count("PUT", "/computer/models") == 3
        assert not c.outcome  # still running
    assert c.outcome == [0]


async def test_models_are_reported_when_the_sandbox_is_unusable(tmp_path: Path) -> None:
    server = FakeCrewServer()

    def parts(crew_home: Path) -> FakeParts:
        return FakeParts(crew_home, ScriptedEngine(), status=UNUSABLE)

    async with computer(tmp_path, server, parts=parts) as c:
        await wait_until_async("the models", lambda: server.models is not None, timeout=20)
        assert server.models == ["local/scripted", "local/other", "local/fake"]
        async with c.local() as local:
            health = (await local.get("/health")).json()
        assert health["sandbox"]["ok"] is False
        assert not c.outcome  # still running, every agent told why it cannot run
    assert c.outcome == [0]


async def test_a_refused_models_report_exits_1(tmp_path: Path) -> None:
    server = FakeCrewServer()
    server.models_statuses = [422]
    async with computer(tmp_path, server) as c:
        await wait_until_async("the start-up outcome", lambda: c.outcome, 10)
    [failed] = c.outcome
    assert isinstance(failed, StartupFailed)
    assert str(failed).startswith("the crew server refused the list of models")


async def test_ready_is_written_before_the_launcher_starts(tmp_path: Path) -> None:
    server = FakeCrewServer()
    release = anyio.Event()

    def parts(crew_home: Path) -> FakeParts:
        made = FakeParts(crew_home, ScriptedEngine())
        made.launcher_release = release
        return made

    async with computer(tmp_path, server, parts=parts) as c:
        with anyio.fail_after(10):
            await c.parts.launcher_starting.wait()
        # The launcher's self-test is still running: `ready` is out, and introspection answers.
        assert c.stdout.getvalue() == b"ready\n"
        async with c.local() as local:
            health = (await local.get("/health")).json()
        assert health["ready"] is True
        assert health["sandbox"]["ok"] is None
        assert server.count("GET", "/computer/events") == 0
        release.set()
        await wait_until_async("connected", lambda: c.service.events.connected)
    assert c.outcome == [0]


async def test_a_run_directory_that_cannot_be_prepared_exits_1(tmp_path: Path) -> None:
    server = FakeCrewServer()
    crew_home = tmp_path / "crew"
    crew_home.mkdir()
    (crew_home / "runtime").write_text("a file where the run directories go")
    async with computer(tmp_path, server) as c:
        await wait_until_async("the start-up outcome", lambda: c.outcome, 10)
    [failed] = c.outcome
    assert isinstance(failed, StartupFailed)
    assert "cannot prepare the run directory" in str(failed)
    assert c.stdout.getvalue() == b"ready\n"
    assert c.parts.launcher_stopped and not c.socket.exists()
    assert server.count("GET", "/computer/events") == 0  # never idles in a broken state


async def test_default_capacity_is_the_cpu_count_at_least_two(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    boot = Bootstrap(server_url="http://crew.test", token="t")
    for cpus, expected in ((None, 2), (1, 2), (2, 2), (12, 12)):
        monkeypatch.setattr(os, "cpu_count", lambda cpus=cpus: cpus)
        assert boot.turn_capacity() == expected
    explicit = Bootstrap(server_url="http://crew.test", token="t", max_concurrent_turns=5)
    assert explicit.turn_capacity() == 5


async def test_a_stream_that_ends_before_any_event_still_backs_off(tmp_path: Path) -> None:
    server = FakeCrewServer()
    server.events_answers = [
        *[[b": connected\n\n"]] * 3,  # a 200, then closed before any event
        [events("id: 1", "event: ping", "data: {}")],
    ]
    backoff = RecordingBackoff(initial_s=0.01, cap_s=1.0)
    async with computer(tmp_path, server, backoff=backoff) as c:
        await wait_until_async(
            "five agent lists", lambda: server.count("GET", "/computer/agents") == 5
        )
        assert len(server.last_event_ids) == 5
        ceilings = [0.01, 0.02, 0.04, 0.01]  # doubling; back to the base after an event
        assert len(backoff.delays) == len(ceilings)
        for delay, ceiling in zip(backoff.delays, ceilings, strict=True):
            assert ceiling / 2 - 1e-9 <= delay <= ceiling + 1e-9
    assert c.outcome == [0]


async def test_an_agent_whose_token_could_not_be_issued_gets_its_runner_without_a_new_event(
    tmp_path: Path,
) -> None:
    """The server refuses the token once (its disk full, a restart) while the stream stays
    open: no later event syncs the agents, so the Computer tries again by itself and the
    message waiting for the agent is claimed (the chaos run's agent left without a runner)."""
    server = FakeCrewServer()
    alice = server.agent("alice")
    server.faults["token"] = [503, 503]
    server.post(alice["id"], "waiting since before the Computer started")
    async with computer(tmp_path, server, retry_base_s=0.05) as c:
        await wait_until_async(
            "alice's unread claim", lambda: server.unread_claims(alice["id"]) >= 1, 10
        )
        assert server.faults["token"] == []
        assert alice["id"] in c.service.roster.runners
        # One stream all along: the runner came from the Computer's own retry.
        assert server.count("GET", "/computer/events") == 1
