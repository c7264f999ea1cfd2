"""SSE for Computers: ids on every event, replay after Last-Event-ID, `agents`, pings.

Streams need a real server: a `crew-server --dev` subprocess, or uvicorn in a thread
(for the short ping interval).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from httpx_sse import ServerSentEvent, connect_sse

from crew_harness.ports import free_port
from crew_harness.waiting import wait_until
from crew_server.app import create_app
from crew_server.clock import Clock
from crew_server.store import Store
from crew_testkit.crew_server_proc import computer_connection, start_crew_server


def read_events(
    client: httpx.Client,
    url: str,
    token: str,
    count: int,
    last_id: str | None = None,
    on_open: Callable[[], object] | None = None,
) -> list[ServerSentEvent]:
    """Open the stream, call `on_open`, return the first `count` non-ping events, close it.

    The server fixes where the stream starts and subscribes it before it answers
    (its first bytes are `: connected`), so whatever `on_open` causes is on the stream.
    """
    headers = computer_connection(client, token)
    if last_id is not None:
        headers["Last-Event-ID"] = last_id
    got: list[ServerSentEvent] = []
    with connect_sse(client, "GET", url, headers=headers, timeout=10.0) as source:
        assert source.response.status_code == 200
        assert source.response.headers["content-type"].startswith("text/event-stream")
        if on_open is not None:
            on_open()
        for sse in source.iter_sse():
            if sse.event == "ping":
                continue
            got.append(sse)
            if len(got) == count:
                break
    return got


@pytest.mark.timeout(60)
def test_reconnect_with_last_event_id_replays_every_missed_wake_in_order(tmp_path: Path) -> None:
    with start_crew_server(tmp_path) as server, httpx.Client(base_url=server.url) as client:
        box = server.create_computer()
        alice = server.create_agent("alice", computer_id=box["computer_id"])
        bob = server.create_agent("bob", computer_id=box["computer_id"])
        dm = server.create_room("dm", [alice["id"]])
        group = server.create_room("group", [alice["id"], bob["id"]], title="launch")

        first = read_events(
            client,
            "/computer/events",
            box["token"],
            1,
            on_open=lambda: server.post(dm["id"], "first"),
        )
        assert first[0].event == "wake" and first[0].json() == {"agent_id": alice["id"]}
        assert first[0].id.isdigit()

        # disconnected: a dm, a group message (two wakes) and a settings change
        server.post(dm["id"], "second")
        server.post(group["id"], "to the group")
        server.client().patch(
            f"/api/agents/{bob['id']}", json={"model": "p/other"}
        ).raise_for_status()

        missed = read_events(client, "/computer/events", box["token"], 4, last_id=first[0].id)
        got = [(e.event, e.json()["agent_id"]) for e in missed]
        assert got[0] == ("wake", alice["id"])  # the dm, then the group's two, then the change
        assert sorted(got[1:3]) == sorted([("wake", alice["id"]), ("wake", bob["id"])])
        assert got[3] == ("agents", bob["id"])
        ids = [int(first[0].id)] + [int(e.id) for e in missed]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)


@pytest.mark.timeout(60)
def test_a_fresh_stream_starts_at_now_and_sees_only_its_own_computer(tmp_path: Path) -> None:
    with start_crew_server(tmp_path) as server, httpx.Client(base_url=server.url) as client:
        box, other = server.create_computer("box"), server.create_computer("other")
        alice = server.create_agent("alice", computer_id=box["computer_id"])
        stranger = server.create_agent("stranger", computer_id=other["computer_id"])
        server.post(server.create_room("dm", [alice["id"]])["id"], "before the stream")
        stranger_dm = server.create_room("dm", [stranger["id"]])
        alice_dm = server.create_room("dm", [alice["id"]])

        def post_both() -> None:
            server.post(stranger_dm["id"], "not for box")
            server.post(alice_dm["id"], "for box")

        got = read_events(client, "/computer/events", box["token"], 1, on_open=post_both)
        assert [(e.event, e.json()) for e in got] == [("wake", {"agent_id": alice["id"]})]


@pytest.mark.timeout(60)
def test_new_agent_on_a_computer_sends_agents_and_bad_token_is_401(tmp_path: Path) -> None:
    with start_crew_server(tmp_path) as server, httpx.Client(base_url=server.url) as client:
        box = server.create_computer()
        bad = client.get("/computer/events", headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401 and bad.json()["error"]["code"] == "unauthorized"

        def create() -> None:
            server.create_agent("newbie", computer_id=box["computer_id"])

        got = read_events(client, "/computer/events", box["token"], 1, on_open=create)
        assert got[0].event == "agents"


@contextmanager
def serve_in_thread(store: Store, ping_seconds: float = 15.0) -> Iterator[str]:
    """uvicorn in a thread serving a dev app on `store`; yields its URL."""
    app = create_app(store, store.clock, dev=True, ping_seconds=ping_seconds)
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until("uvicorn to start", lambda: server.started, 10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        app.state.hub.close()
        thread.join(timeout=10)


@pytest.fixture
def threaded_server(store_location: str) -> Iterator[tuple[httpx.Client, Store]]:
    """uvicorn in a thread serving an app whose pings come every 0.2 s; a client on it
    that sends the user token (calls with their own `Authorization` send that)."""
    store = Store(store_location, Clock())
    token = store.ensure_user_token()
    try:
        with (
            serve_in_thread(store, ping_seconds=0.2) as url,
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client,
        ):
            yield client, store
    finally:
        store.close()


@pytest.mark.timeout(30)
def test_pings_carry_the_stream_position(threaded_server: tuple[httpx.Client, Store]) -> None:
    client, store = threaded_server
    made = client.post("/api/computers", json={"name": "box"}).json()
    alice = client.post(
        "/api/agents",
        json={"handle": "alice", "name": "A", "model": "m/x", "computer_id": made["computer_id"]},
    ).json()
    position = str(store.last_event_id())
    seen: list[tuple[str, str, Any]] = []
    headers = computer_connection(client, made["token"])
    with connect_sse(client, "GET", "/computer/events", headers=headers, timeout=10) as source:
        for sse in source.iter_sse():
            seen.append((sse.event, sse.id, orjson.loads(sse.data)))
            if len(seen) == 2:
                break
    assert seen == [("ping", position, {}), ("ping", position, {})]
    assert alice["handle"] == "alice"


def _pruned_world(store: Store) -> tuple[str, str, list[dict[str, Any]]]:
    """A Computer with two agents (and one elsewhere) and enough wakes to prune the log."""
    computer_id, token = store.create_computer("box")
    other_id, _ = store.create_computer("other")
    agents = [
        store.create_agent(h, h.title(), "", "m/x", "opencode", computer_id) for h in ("bob", "al")
    ]
    store.create_agent("stranger", "S", "", "m/x", "opencode", other_id)
    room, _ = store.create_room("dm", None, [agents[0]["id"]])
    for i in range(12):
        store.user_post(room["id"], f"message {i}", None)
    return computer_id, token, agents


def test_a_cursor_older_than_the_log_asks_to_wake_every_agent_of_that_computer(
    store_location: str,
) -> None:
    store = Store(store_location, Clock(), event_log_keep=4, prune_every=1)
    computer_id, _, agents = _pruned_world(store)
    newest = store.last_event_id()
    assert len(store.events_after(computer_id, 0)) == 4  # the rest was pruned
    pruned = newest - 4
    cursor, lost = store.replay_start(computer_id, 1)
    assert cursor == pruned and lost == [agents[1]["id"], agents[0]["id"]]  # by handle
    assert store.replay_start(computer_id, pruned) == (pruned, None)  # nothing lost after it
    assert store.replay_start(computer_id, newest - 1) == (newest - 1, None)
    assert store.replay_start(computer_id, None) == (newest, None)
    assert store.replay_start(computer_id, newest + 100) == (newest, None)  # a reset database
    empty, _ = store.create_computer("empty")  # lost events, no agents: still a resync
    assert store.replay_start(empty, 1) == (pruned, [])


@pytest.mark.timeout(30)
def test_a_stream_resuming_before_the_log_wakes_every_agent_then_replays_the_rest(
    store_location: str,
) -> None:
    store = Store(store_location, Clock(), event_log_keep=4, prune_every=1)
    try:
        computer_id, token, agents = _pruned_world(store)
        kept = [str(i) for i, _, _ in store.events_after(computer_id, 0)]
        pruned = str(int(kept[0]) - 1)
        with serve_in_thread(store) as url, httpx.Client(base_url=url) as client:
            got = read_events(client, "/computer/events", token, 3 + len(kept), last_id="2")
        assert [(e.event, e.id, e.json()) for e in got[:3]] == [
            ("agents", pruned, {"agent_id": None}),
            ("wake", pruned, {"agent_id": agents[1]["id"]}),
            ("wake", pruned, {"agent_id": agents[0]["id"]}),
        ]
        assert got[0].retry == 2000
        assert [(e.event, e.id) for e in got[3:]] == [("wake", i) for i in kept]
    finally:
        store.close()


@pytest.mark.timeout(30)
def test_a_new_connection_ends_the_stream_of_the_old_one(
    threaded_server: tuple[httpx.Client, Store],
) -> None:
    """The app started twice: the first Computer's stream says `superseded` and ends, and
    that connection cannot open another one."""
    client, _ = threaded_server
    made = client.post("/api/computers", json={"name": "box"}).json()
    old = computer_connection(client, made["token"])
    seen: list[tuple[str, Any]] = []
    with connect_sse(client, "GET", "/computer/events", headers=old, timeout=10) as source:
        assert source.response.status_code == 200
        new = computer_connection(client, made["token"])
        for sse in source.iter_sse():
            seen.append((sse.event, orjson.loads(sse.data)))
    # The loop ended: the server closed the stream after `superseded`.
    assert [e for e, _ in seen if e != "ping"] == ["superseded"]
    assert seen[-1] == ("superseded", {"epoch": int(new["Crew-Epoch"])})
    again = client.get("/computer/events", headers=old)
    assert again.status_code == 409 and again.json()["error"]["code"] == "superseded"
