"""The warm engine's pure parts and its pool, without OpenCode: events → lines, the end of a
turn, the SSE splitter, the owner check, and the pool's start/evict/give-up rules."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

from computer_service.engine.approvals import asked_of
from computer_service.engine.warm_channel import (
    NotTheServer,
    ServerAddress,
    _listeners,
    check_owner,
    listening_inodes,
    process_start_time,
)
from computer_service.engine.warm_events import (
    MessageIds,
    SseFrames,
    TurnEnd,
    retry_status,
    run_line,
)
from computer_service.engine.warm_pool import MAX_FAILED_STARTS, WarmPool
from computer_service.launcher_client import LauncherRefused
from crew_common.launcher_wire import ServerInfo, ServerRequest

S = "ses_abc"
MB = 1024 * 1024


def part_event(part: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message.part.updated", "properties": {"part": {"sessionID": S, **part}}}


@pytest.mark.parametrize(
    ("part", "line_type"),
    [
        ({"type": "step-start"}, "step_start"),
        ({"type": "step-finish", "tokens": {"input": 1}}, "step_finish"),
        ({"type": "text", "text": "done", "time": {"start": 1, "end": 2}}, "text"),
        ({"type": "text", "text": "do", "time": {"start": 1}}, None),  # still streaming
        ({"type": "tool", "state": {"status": "completed"}}, "tool_use"),
        ({"type": "tool", "state": {"status": "error"}}, "tool_use"),
        ({"type": "tool", "state": {"status": "running"}}, None),
        ({"type": "reasoning", "text": "hm", "time": {"end": 2}}, None),  # run without --thinking
        ({"type": "patch"}, None),
    ],
)
def test_parts_become_the_lines_opencode_run_prints(
    part: dict[str, Any], line_type: str | None
) -> None:
    line = run_line(part_event(part), S, 1234)
    if line_type is None:
        assert line is None
    else:
        assert line == {
            "type": line_type,
            "timestamp": 1234,
            "sessionID": S,
            "part": {"sessionID": S, **part},
        }


@pytest.mark.parametrize(
    "event",
    [
        part_event({"type": "step-start", "sessionID": "ses_other"}),
        {"type": "session.error", "properties": {"sessionID": "ses_other", "error": {"name": "X"}}},
        {"type": "session.error", "properties": {"sessionID": S}},
        {"type": "message.part.updated", "properties": "not an object"},
        {"type": "server.heartbeat", "properties": {}},
        "not an object",
        None,
    ],
)
def test_other_sessions_and_odd_shapes_give_no_line(event: Any) -> None:
    assert run_line(event, S, 1) is None


def test_a_session_error_is_an_error_line() -> None:
    error = {"name": "APIError", "data": {"message": "bad key", "statusCode": 401}}
    event = {"type": "session.error", "properties": {"sessionID": S, "error": error}}
    assert run_line(event, S, 5) == {
        "type": "error",
        "timestamp": 5,
        "sessionID": S,
        "error": error,
    }


def status(kind: str, session: str = S) -> dict[str, Any]:
    return {
        "type": "session.status",
        "properties": {"sessionID": session, "status": {"type": kind}},
    }


def assistant(parent: str, **info: Any) -> dict[str, Any]:
    body = {"sessionID": S, "role": "assistant", "parentID": parent, **info}
    return {"type": "message.updated", "properties": {"info": body}}


def test_a_turn_ends_at_the_first_idle_after_our_finalised_answer() -> None:
    end = TurnEnd(S, "msg_ours")
    assert not end.see(status("idle"))  # the previous turn's late idle
    assert not end.see(assistant("msg_earlier", time={"completed": 1}))
    assert not end.see(status("idle"))
    assert not end.see(assistant("msg_ours", time={"created": 1}))  # not final yet
    assert not end.see(status("busy"))
    assert not end.see(assistant("msg_ours", time={"completed": 2}))
    assert not end.see(status("idle", "ses_other"))
    assert end.see(status("idle"))


def test_an_error_turn_ends_at_its_second_idle_not_its_first() -> None:
    end = TurnEnd(S, "msg_ours")
    error = {"type": "session.error", "properties": {"sessionID": S, "error": {"name": "E"}}}
    assert not end.see(error)
    assert not end.see(status("idle"))  # the first idle: not over
    assert end.error_idle  # without an answer in time it is over anyway
    assert not end.see(assistant("msg_ours", error={"name": "E"}))
    assert end.see(status("idle"))


def test_permission_requests_of_our_session_are_answered() -> None:
    asked = {"type": "permission.asked", "properties": {"sessionID": S, "id": "per_1"}}
    found = asked_of(asked, S)
    assert found is not None and found.request_id == "per_1"
    assert asked_of(asked, "ses_other") is None
    bad = {"type": "permission.asked", "properties": {"sessionID": S, "id": "../x"}}
    assert asked_of(bad, S) is None


def test_sse_frames_are_split_across_chunks_and_bounded() -> None:
    frames = SseFrames(limit=64)
    assert frames.feed(b'data: {"type":"a"}\n') == []
    assert frames.feed(b'\ndata: {"ty') == [{"type": "a"}]
    assert frames.feed(b'pe":"b"}\r\n\r\ndata: not json\n\n') == [{"type": "b"}]
    with pytest.raises(ValueError, match="over 64 bytes"):
        frames.feed(b"data: " + b"x" * 100 + b"\n")
    with pytest.raises(ValueError, match="over 64 bytes"):
        SseFrames(limit=64).feed(b"data: " + b"x" * 100)  # no newline ever


def test_message_ids_ascend_and_have_opencodes_form() -> None:
    ids = MessageIds()
    made = [ids.next() for _ in range(50)]
    assert made == sorted(made) and len(set(made)) == 50
    assert all(len(m) == 30 and m.startswith("msg_") for m in made)


# ---- the owner check ----


def test_proc_net_rows_are_read_for_loopback_and_wildcard_listeners() -> None:
    rows = [
        "0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 111 1",
        "1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 222 1",
        "2: 0100007F:1F90 0100007F:9999 01 00000000:00000000 00:00000000 00000000 0 0 333 1",
        "3: 0A00000A:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 444 1",
        "4: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 555 1",
    ]
    assert _listeners(rows, 8080, {"0100007F", "00000000"}) == {111, 222}


def test_only_the_process_holding_the_listener_passes() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        assert listening_inodes(port)
        me = os.getpid()
        started = process_start_time(me)
        assert started is not None
        check_owner(ServerAddress(me, started, port, "x"))  # ours: passes
        with pytest.raises(NotTheServer, match="other than the warm server"):
            parent = os.getppid()
            check_owner(ServerAddress(parent, process_start_time(parent) or 0, port, "x"))
        with pytest.raises(NotTheServer, match="is gone"):
            check_owner(ServerAddress(me, started + 1, port, "x"))  # a reused pid
    finally:
        listener.close()
    with pytest.raises(NotTheServer, match="nothing listens"):
        check_owner(ServerAddress(me, started, port, "x"))


# ---- the pool ----


class FakeLauncher:
    """The launcher's server endpoints, in memory."""

    def __init__(self, fail: bool = False, rss: int = 300 * MB) -> None:
        self.fail = fail
        self.rss = rss
        self.started: list[str] = []
        self.stopped: list[str] = []
        self.swept: list[str] = []
        self.gen = object()

    def generation(self) -> object:
        return self.gen

    async def start_server(self, request: ServerRequest) -> ServerInfo:
        if self.fail:
            raise LauncherRefused(502, "server_failed", "opencode serve exited with status 1")
        self.started.append(request.agent_id)
        return ServerInfo(
            agent_id=request.agent_id,
            pid=10_000 + len(self.started),
            start_time=1,
            port=4000 + len(self.started),
            started_at="2026-01-01T00:00:00.000+00:00",
            rss_bytes=self.rss,
            listener_pid=10_000 + len(self.started),
            listener_start_time=1,
        )

    async def sweep_server(self, agent_id: str) -> tuple[int, int | None]:
        self.swept.append(agent_id)
        return 0, self.rss

    async def server_denials(self, agent_id: str) -> list[Any]:
        return []

    async def server_limit_hit(self, agent_id: str) -> str | None:
        return None

    async def stop_server(self, agent_id: str) -> None:
        self.stopped.append(agent_id)

    async def servers(self) -> list[ServerInfo]:
        return []


def request_for(agent_id: str) -> Any:
    def build(password: str) -> ServerRequest:
        env = {"PWD": f"/crew/agents/{agent_id}/work", "OPENCODE_SERVER_PASSWORD": password}
        return ServerRequest(
            agent_id=agent_id, agent_dir="/a", runtime_dir="/r", bin_dir="/b", env=env
        )

    return build


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


ENV = {"PATH": "/usr/bin", "OPENCODE_CONFIG_CONTENT": "{}"}


@pytest.mark.anyio
async def test_a_server_is_reused_while_the_environment_is_the_same() -> None:
    launcher = FakeLauncher()
    pool = WarmPool(launcher, memory_budget=4096 * MB, clock=Clock())
    first = await pool.acquire("a", ENV, request_for("a"))
    assert first is not None
    await pool.release(first)
    again = await pool.acquire("a", ENV, request_for("a"))
    assert again is first and launcher.started == ["a"] and launcher.swept == ["a"]
    await pool.release(again)
    other = await pool.acquire(
        "a", {**ENV, "OPENCODE_CONFIG_CONTENT": '{"model":"b"}'}, request_for("a")
    )
    assert other is not None and other is not first
    assert launcher.stopped == ["a"] and launcher.started == ["a", "a"]
    await pool.close()


@pytest.mark.anyio
async def test_idle_servers_are_evicted_least_recent_first_and_no_room_means_cold() -> None:
    launcher = FakeLauncher(rss=600 * MB)
    clock = Clock()
    pool = WarmPool(launcher, memory_budget=1400 * MB, server_estimate=650 * MB, clock=clock)
    a = await pool.acquire("a", ENV, request_for("a"))
    assert a is not None
    clock.now = 1
    await pool.release(a)
    b = await pool.acquire("b", ENV, request_for("b"))  # 600 + 650 fits
    assert b is not None
    clock.now = 2
    await pool.release(b)
    c = await pool.acquire("c", ENV, request_for("c"))  # evicts a, the least recent
    assert c is not None and launcher.stopped == ["a"] and pool.counters.evictions == 1
    d = await pool.acquire("d", ENV, request_for("d"))  # evicts b; c is busy
    assert d is not None and launcher.stopped == ["a", "b"]
    assert await pool.acquire("e", ENV, request_for("e")) is None  # c and d are busy: cold
    assert pool.agent_status("e")["warm"] is False
    await pool.close()


@pytest.mark.anyio
async def test_three_failed_starts_in_a_row_make_the_agent_cold() -> None:
    launcher = FakeLauncher(fail=True)
    pool = WarmPool(launcher, memory_budget=4096 * MB, clock=Clock())
    for _ in range(MAX_FAILED_STARTS):
        assert await pool.acquire("a", ENV, request_for("a")) is None
    assert pool.agent_status("a")["engine_mode"] == "cold"
    assert "failed to start 3 times" in str(pool.agent_status("a")["cold_reason"])
    launcher.fail = False
    assert await pool.acquire("a", ENV, request_for("a")) is None  # stays cold
    assert launcher.started == [] and pool.counters.failed_starts == MAX_FAILED_STARTS


@pytest.mark.anyio
async def test_idle_servers_stop_after_the_timeout_and_a_new_launcher_forgets_them() -> None:
    launcher = FakeLauncher()
    clock = Clock()
    pool = WarmPool(launcher, memory_budget=4096 * MB, idle_timeout_s=600, clock=clock)
    a = await pool.acquire("a", ENV, request_for("a"))
    assert a is not None
    await pool.release(a)
    clock.now = 599
    await pool.stop_idle()
    assert launcher.stopped == []
    clock.now = 600
    await pool.stop_idle()
    assert launcher.stopped == ["a"] and "a" not in pool.servers
    b = await pool.acquire("b", ENV, request_for("b"))
    assert b is not None
    await pool.release(b)
    launcher.gen = object()  # the launcher was replaced: its servers died with it
    again = await pool.acquire("b", ENV, request_for("b"))
    assert again is not None and again is not b
    await pool.close()


@pytest.mark.anyio
async def test_a_server_a_turn_left_over_the_ceiling_is_restarted_for_the_next_turn() -> None:
    launcher = FakeLauncher(rss=700 * MB)
    pool = WarmPool(launcher, memory_budget=4096 * MB, server_ceiling=512 * MB, clock=Clock())
    first = await pool.acquire("a", ENV, request_for("a"))
    assert first is not None
    await pool.release(first)  # the sweep measures 700 MB: over the ceiling
    assert launcher.stopped == ["a"] and pool.counters.ceiling_restarts == 1
    assert pool.agent_status("a")["warm"] is False
    again = await pool.acquire("a", ENV, request_for("a"))
    assert again is not None and again is not first and launcher.started == ["a", "a"]
    launcher.rss = 300 * MB
    await pool.release(again)  # under it: kept
    assert launcher.stopped == ["a"] and pool.counters.ceiling_restarts == 1
    assert "crew_warm_ceiling_restarts_total 1" in pool.counters.lines()
    await pool.close()


@pytest.mark.parametrize(
    "event, expected",
    [
        (
            {
                "type": "session.status",
                "properties": {
                    "sessionID": "ses_a",
                    "status": {"type": "retry", "attempt": 1, "message": "quota", "next": 1.5e12},
                },
            },
            (1.5e12, "quota"),
        ),
        # Another session's, another status, or a `next` that is no number: not ours to act on.
        (
            {
                "type": "session.status",
                "properties": {"sessionID": "ses_b", "status": {"type": "retry", "next": 1}},
            },
            None,
        ),
        (
            {
                "type": "session.status",
                "properties": {"sessionID": "ses_a", "status": {"type": "busy"}},
            },
            None,
        ),
        (
            {
                "type": "session.status",
                "properties": {"sessionID": "ses_a", "status": {"type": "retry", "next": "soon"}},
            },
            None,
        ),
        (
            {
                "type": "session.status",
                "properties": {"sessionID": "ses_a", "status": {"type": "retry", "next": True}},
            },
            None,
        ),
        ({"type": "session.status", "properties": "x"}, None),
        ("not an event", None),
    ],
)
def test_a_retry_status_names_the_time_opencode_waits_for(
    event: object, expected: tuple[float, str] | None
) -> None:
    assert retry_status(event, "ses_a") == expected
