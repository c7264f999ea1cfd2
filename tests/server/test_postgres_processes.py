"""Three `crew-server` processes on one PostgreSQL database, any of which serves any
request: seqs stay gapless, claims exact, wakes reach the stream of another process
once, reminders fire once, and an epoch race never leaves a fenced-off turn running.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse

from crew_harness.waiting import wait_until
from crew_server.store.db import migration_files
from crew_testkit.crew_server_proc import CrewServer, computer_connection, start_crew_server
from crew_testkit.postgres import PostgresCluster

POSTS_PER_WRITER = 15


def test_every_migration_has_its_postgresql_twin() -> None:
    """A new SQLite migration needs its PostgreSQL twin with the same number."""
    sqlite = [v for v, _ in migration_files("sqlite")]
    postgresql = [v for v, _ in migration_files("postgresql")]
    assert sqlite == postgresql, "write crew_server/migrations/postgresql/<same number>_….sql"


@pytest.fixture
def servers(postgres_cluster: PostgresCluster, tmp_path: Path) -> Iterator[list[CrewServer]]:
    """Three processes started at once on one fresh database (they race to create the
    one user token: one does, the others find it)."""
    url = postgres_cluster.new_database()
    with ThreadPoolExecutor(max_workers=3) as pool:
        starting = [pool.submit(start_crew_server, tmp_path, db=url) for _ in range(3)]
    started = [s.result() for s in starting if s.exception() is None]
    try:
        assert len(started) == 3, [s.exception() for s in starting]
        yield started
    finally:
        for server in started:
            server.stop()


class StreamReader:
    """A Computer's event stream held open in a thread; the events it got, in order."""

    def __init__(self, url: str, headers: dict[str, str], last_id: str | None = None) -> None:
        self.client = httpx.Client(base_url=url, timeout=httpx.Timeout(10, read=None))
        self.headers = headers | ({"Last-Event-ID": last_id} if last_id is not None else {})
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.opened = threading.Event()
        self._socket: socket.socket | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        wait_until("the stream to open", self.opened.is_set, 10)

    def _read(self) -> None:
        try:
            with connect_sse(self.client, "GET", "/computer/events", headers=self.headers) as src:
                self._socket = src.response.extensions["network_stream"].get_extra_info("socket")
                self.opened.set()
                for sse in src.iter_sse():
                    if sse.event != "ping":
                        self.events.append((int(sse.id), sse.event, sse.json()))
        except httpx.HTTPError:
            pass  # closed by `close` at the end of the test

    def ids_between(self, low: int, high: int) -> list[int]:
        """The ids it got in [low, high], in the order they came."""
        return [i for i, _, _ in self.events if low <= i <= high]

    def mark(self, agent_id: str, after: int = 0) -> int | None:
        """The id of the first `agents` event for `agent_id` after `after`, when it came."""
        found = [
            i
            for i, e, d in self.events
            if e == "agents" and d["agent_id"] == agent_id and i > after
        ]
        return found[0] if found else None

    def close(self) -> None:
        """End the stream: shutting its socket down wakes the blocked read at once
        (closing the client from this thread does not; the read would wait for the
        server's next ping, 15 s)."""
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "the stream's reader did not end"
        self.client.close()


def _mark(
    server: CrewServer, agent: dict[str, Any], streams: list[StreamReader], after: int
) -> int:
    """Change the agent (its Computer hears `agents`) and wait until every stream got it."""
    answer = server.client().patch(f"/api/agents/{agent['id']}", json={"name": f"n{after}"})
    answer.raise_for_status()
    # Well before the streams' 15 s ping (which would read the log anyway): a stream of
    # another process learns of the commit by LISTEN/NOTIFY, or the test fails.
    wait_until(
        "the mark on every stream", lambda: all(s.mark(agent["id"], after) for s in streams), 10
    )
    marks = {s.mark(agent["id"], after) for s in streams}
    assert len(marks) == 1, "streams of one Computer disagree on an event id"
    return int(marks.pop() or 0)


@pytest.mark.timeout(240)
def test_three_processes_share_rooms_claims_and_wakes(servers: list[CrewServer]) -> None:
    first = servers[0]
    boxes = [first.create_computer("a"), first.create_computer("b")]
    agents = [
        first.create_agent(handle, computer_id=boxes[i % 2]["computer_id"])
        for i, handle in enumerate(("ann", "bob", "cid", "dee"))
    ]
    group = first.create_room("group", [a["id"] for a in agents], title="launch")
    dms = [first.create_room("dm", [a["id"]]) for a in agents]
    with httpx.Client(base_url=first.url) as client:
        connections = [computer_connection(client, box["token"]) for box in boxes]
    # Each Computer's stream is held twice, by the two processes the posts go to least.
    streams = [[StreamReader(s.url, c) for s in servers[1:]] for c in connections]
    starts = [_mark(first, agents[i], streams[i], 0) for i in range(2)]

    def user_writer(n: int) -> None:
        server = servers[n % 3]
        with httpx.Client(base_url=server.url, headers=server.user_headers, timeout=30) as c:
            for i in range(POSTS_PER_WRITER):
                room = group if i % 2 else dms[(n + i) % len(dms)]
                body = f"w{n} {i} @{agents[i % len(agents)]['handle']}"
                c.post(f"/api/rooms/{room['id']}/messages", json={"body": body}).raise_for_status()

    claimed: dict[str, list[tuple[str, int]]] = {a["id"]: [] for a in agents}

    def drain(agent: dict[str, Any], headers: dict[str, str], rounds: int, *, stop: bool) -> None:
        """Claim → register → ack, each request through the next process (round robin);
        with `stop`, until a claim finds nothing."""
        clients = [httpx.Client(base_url=s.url, headers=headers, timeout=30) for s in servers]
        turn = itertools.cycle(clients)
        try:
            for _ in range(rounds):
                got = next(turn).post(f"/computer/agents/{agent['id']}/unread", json={})
                got.raise_for_status()
                rooms = got.json()["rooms"]
                for r in rooms:
                    claimed[agent["id"]] += [(r["room"]["id"], m["seq"]) for m in r["messages"]]
                if not rooms:
                    if stop:
                        return
                    continue
                body = {"rooms": [], "input": "x", "engine": "opencode", "model": "m"}
                made = next(turn).post(f"/computer/agents/{agent['id']}/turns", json=body)
                made.raise_for_status()
                ack = {"turn_id": made.json()["turn_id"], "fence": made.json()["fence"]}
                next(turn).post(f"/computer/agents/{agent['id']}/ack", json=ack).raise_for_status()
        finally:
            for client in clients:
                client.close()

    with ThreadPoolExecutor(max_workers=10) as pool:
        jobs = [pool.submit(user_writer, n) for n in range(6)]
        jobs += [
            pool.submit(drain, a, connections[i % 2], 12, stop=False) for i, a in enumerate(agents)
        ]
        for job in jobs:
            job.result()
    # What is still unread after the writers stopped: drained the same way.
    for i, agent in enumerate(agents):
        drain(agent, connections[i % 2], 30, stop=True)

    for room in [group, *dms]:
        seqs = [m["seq"] for m in servers[2].messages(room["id"])]
        assert seqs == list(range(1, len(seqs) + 1)), f"seqs of {room['id']} have gaps"
    for agent in agents:
        seen = claimed[agent["id"]]
        assert len(seen) == len(set(seen)), f"a message was claimed twice by {agent['handle']}"
        for p in servers[1].positions(agent["id"]):
            assert p["read_seq"] == p["delivered_seq"] == len(servers[0].messages(p["room_id"]))

    # Every event of the log reached each stream of its Computer once, in id order: both
    # live streams got the same ids as a replay from the start, between two marks.
    for i in range(2):
        end = _mark(first, agents[i], streams[i], starts[i])
        replay = StreamReader(first.url, connections[i], last_id="0")
        wait_until(
            "the replay to reach the end mark",
            lambda r=replay, e=end, a=agents[i]["id"]: r.mark(a, e - 1),
            30,
        )
        logged = replay.ids_between(starts[i], end)
        assert logged == sorted(set(logged)) and len(logged) > 2
        for stream in streams[i]:
            assert stream.ids_between(starts[i], end) == logged
        for reader in [replay, *streams[i]]:
            reader.close()


@pytest.mark.timeout(120)
def test_reminders_fire_once_and_no_fenced_off_turn_stays_running(
    servers: list[CrewServer],
) -> None:
    first = servers[0]
    box = first.create_computer("a")
    agent = first.create_agent("ann", computer_id=box["computer_id"])
    room = first.create_room("dm", [agent["id"]])
    headers = first.connection(box)
    token = first.client().post(f"/computer/agents/{agent['id']}/token", headers=headers)
    agent_headers = {"Authorization": f"Bearer {token.json()['token']}"}
    now = datetime.fromisoformat(first.advance_clock(0)["now"])
    due = (now + timedelta(days=1)).isoformat()
    for n in range(6):
        body = {"room_id": room["id"], "title": f"r{n}", "at": due}
        first.client().post("/agent/reminders", json=body, headers=agent_headers).raise_for_status()

    # Every process moves its own dev clock past the reminders at once: each fires what
    # is due, and together they fire each reminder once.
    with ThreadPoolExecutor(max_workers=3) as pool:
        fired = sum(pool.map(lambda s: s.advance_clock(2 * 86_400)["fired"], servers))
    notices = [m for m in first.messages(room["id"]) if m["kind"] == "notice"]
    assert fired == 6 and len(notices) == 6

    # A turn registered by the old connection while a new one connects: either it is
    # refused (superseded) or it is interrupted; never left running under an old fence.
    body = {"rooms": [], "input": "x", "engine": "opencode", "model": "m"}
    for _ in range(8):
        old = first.connection(box)

        def register(server: CrewServer, old: dict[str, str] = old) -> int:
            path = f"/computer/agents/{agent['id']}/turns"
            return server.client().post(path, json=body, headers=old).status_code

        def reconnect(server: CrewServer) -> None:
            box["headers"] = computer_connection(server.client(), box["token"])

        with ThreadPoolExecutor(max_workers=2) as pool:
            registered = pool.submit(register, servers[1])
            pool.submit(reconnect, servers[2]).result()
            assert registered.result() in (201, 409)
        epoch = int(first.connection(box)["Crew-Epoch"])
        running = [t for t in first.turns(agent["id"]) if t["status"] == "running"]
        assert all(t["fence"] >= epoch for t in running), running
