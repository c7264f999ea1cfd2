"""Writers at once: two Computers, two agents and the user posting into one group together.

`seq` must stay gapless per room and every message be stored exactly once, whether the
writers share one server (real HTTP) or two stores share one database file.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from crew_server.clock import Clock
from crew_server.errors import Held
from crew_server.store import AgentIdentity, Store
from crew_testkit.crew_server_proc import computer_connection, start_crew_server
from tests.support.postgres import BACKENDS, location_for

PER_WRITER = 25


def _check_room(messages: list[dict[str, Any]], expected: set[str]) -> None:
    assert [m["seq"] for m in messages] == list(range(1, len(messages) + 1))
    bodies = [m["body"] for m in messages]
    assert len(bodies) == len(set(bodies)) and set(bodies) == expected


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_stores_on_one_database_write_one_group_at_once(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two stores on one SQLite file, or on one PostgreSQL schema (as two processes)."""
    db = str(tmp_path / "crew.db") if backend == "sqlite" else location_for(backend, request)
    first, second = Store(db, Clock()), Store(db, Clock())
    try:
        box_a, _ = first.create_computer("a")
        box_b, _ = first.create_computer("b")
        alice = first.create_agent("alice", "Alice", "", "m/x", "opencode", box_a)
        bob = first.create_agent("bob", "Bob", "", "m/x", "opencode", box_b)
        group, _ = first.create_room("group", "launch", [alice["id"], bob["id"]])
        # Every message here is a writer's: no loop guard notice among them.
        first.set_loop_limits(group["id"], 100, 600)
        first.connect(box_a, "h", "linux", "1", 2)
        second.connect(box_b, "h", "linux", "1", 2)

        def agent_writer(store: Store, who: dict[str, Any], box: str) -> Callable[[int], None]:
            identity = AgentIdentity(who["id"], who["handle"], box)

            def write(i: int) -> None:
                while True:  # a reply is held while others' messages are unseen: send again
                    try:
                        store.reply(identity, group["id"], f"{who['handle']} {i}", None)
                        return
                    except Held:
                        continue

            return write

        writers: dict[str, Callable[[int], None]] = {
            "alice": agent_writer(first, alice, box_a),
            "bob": agent_writer(second, bob, box_b),
            "user-a": lambda i: first.user_post(group["id"], f"user-a {i}", None) and None,
            "user-b": lambda i: second.user_post(group["id"], f"user-b {i}", None) and None,
        }
        errors: list[BaseException] = []
        start = threading.Barrier(len(writers))

        def run(write: Callable[[int], None]) -> None:
            try:
                start.wait()
                for i in range(PER_WRITER):
                    write(i)
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(w,)) for w in writers.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not errors, errors
        expected = {f"{name} {i}" for name in writers for i in range(PER_WRITER)}
        _check_room(first.list_messages(group["id"], 0, 1000), expected)
        for agent in (alice, bob):
            for position in second.positions(agent["id"]):
                assert position["delivered_seq"] >= position["read_seq"]
    finally:
        first.close()
        second.close()


@pytest.mark.timeout(120)
def test_two_computers_and_the_user_post_into_one_group_over_http(tmp_path: Path) -> None:
    with start_crew_server(tmp_path) as server:
        boxes = [server.create_computer("a"), server.create_computer("b")]
        agents = [
            server.create_agent(h, computer_id=b["computer_id"])
            for h, b in (("alice", boxes[0]), ("bob", boxes[1]))
        ]
        group = server.create_room("group", [a["id"] for a in agents], title="launch")
        # Every message here is a writer's: no loop guard notice among them.
        limits = {"agent_hop_limit": 100, "agent_rate_limit": 600}
        with httpx.Client(base_url=server.url, headers=server.user_headers) as client:
            client.patch(f"/api/rooms/{group['id']}", json=limits).raise_for_status()
        tokens = []
        with httpx.Client(base_url=server.url) as client:
            for box, agent in zip(boxes, agents, strict=True):
                headers = computer_connection(client, box["token"])
                answer = client.post(f"/computer/agents/{agent['id']}/token", headers=headers)
                tokens.append(answer.json()["token"])

        async def writers() -> dict[str, int]:
            held: dict[str, int] = {"alice": 0, "bob": 0}
            # the user's token by default; the agents send their own
            async with httpx.AsyncClient(
                base_url=server.url, timeout=30, headers=server.user_headers
            ) as client:

                async def agent(handle: str, token: str) -> None:
                    for i in range(PER_WRITER):
                        body = {"room_id": group["id"], "body": f"{handle} {i}"}
                        while True:
                            sent = await client.post(
                                "/agent/reply",
                                json=body,
                                headers={"Authorization": f"Bearer {token}"},
                            )
                            if sent.status_code == 201:
                                break
                            assert sent.status_code == 409 and sent.json()["held"] is True
                            held[handle] += 1

                async def user(name: str) -> None:
                    for i in range(PER_WRITER):
                        path = f"/api/rooms/{group['id']}/messages"
                        posted = await client.post(path, json={"body": f"{name} {i}"})
                        assert posted.status_code == 201, posted.text

                await asyncio.gather(
                    agent("alice", tokens[0]),
                    agent("bob", tokens[1]),
                    user("user-a"),
                    user("user-b"),
                )
            return held

        held = asyncio.run(writers())
        names = ("alice", "bob", "user-a", "user-b")
        expected = {f"{name} {i}" for name in names for i in range(PER_WRITER)}
        _check_room(server.messages(group["id"]), expected)
        print(f"replies held (then sent again) while others wrote: {held}")
