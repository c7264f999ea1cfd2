"""The rows of upstream.md's endpoint tables not covered elsewhere: connect, models, rooms,
turn listing, query parameters, unknown routes and methods."""

from __future__ import annotations

import pytest

from crew_server.app import PING_SECONDS
from crew_server.clock import iso, parse_iso
from tests.server.world import World, bearer

pytestmark = pytest.mark.anyio


async def test_connect_gives_increasing_epochs_and_the_server_time(world: World) -> None:
    box = await world.computer(connect=False)
    body = {"hostname": "laptop", "platform": "linux", "version": "0.1", "capacity": 4}
    first = await world.ok("POST", "/computer/connect", json=body, headers=box.headers)
    assert first["computer_id"] == box.id and first["epoch"] == 1
    assert parse_iso(first["server_time"]) == world.clock.now()
    second = await world.ok("POST", "/computer/connect", json=body, headers=box.headers)
    assert second["epoch"] == 2
    other = await world.computer("other")  # epochs count per Computer credential
    epochs = {c["id"]: c["epoch"] for c in await world.ok("GET", "/api/computers")}
    assert epochs == {box.id: 2, other.id: 1}
    bad = await world.client.post(
        "/computer/connect", json={**body, "capacity": "4"}, headers=box.headers
    )
    assert bad.status_code == 422 and "capacity" in bad.json()["error"]["message"]


async def test_models_are_recorded_and_shown_with_the_computer(world: World) -> None:
    box = await world.computer()
    models = ["anthropic/claude-sonnet-4-5", "local/scripted"]
    answer = await world.client.put(
        "/computer/models", json={"models": models}, headers=box.headers
    )
    assert answer.status_code == 204
    [listed] = await world.ok("GET", "/api/computers")
    assert listed["models"] == models and listed["hostname"] == "h" and listed["epoch"] == 1
    bad = await world.client.put("/computer/models", json={"models": "x"}, headers=box.headers)
    assert bad.status_code == 422
    assert (await world.client.put("/computer/models", json={"models": []})).status_code == 401


async def test_rooms_dm_reuse_group_and_listing(world: World) -> None:
    box = await world.computer()
    alice, bob = await world.agent("alice", box), await world.agent("bob", box)
    dm = await world.dm(alice)
    assert dm["kind"] == "dm" and dm["title"] is None
    assert [m["handle"] for m in dm["members"]] == [None, "alice"]
    again = await world.client.post("/api/rooms", json={"kind": "dm", "agent_ids": [alice["id"]]})
    assert again.status_code == 200 and again.json()["id"] == dm["id"]  # it exists: 200
    two = await world.client.post(
        "/api/rooms", json={"kind": "dm", "agent_ids": [alice["id"], bob["id"]]}
    )
    assert two.status_code == 422 and "exactly one agent" in two.json()["error"]["message"]
    untitled = await world.client.post("/api/rooms", json={"kind": "group", "agent_ids": []})
    assert untitled.status_code == 422
    group = await world.group("launch", bob, alice, bob)
    assert [m["handle"] for m in group["members"]] == [None, "alice", "bob"]
    root = await world.post(group["id"], "root")
    await world.post(group["id"], "in a thread", thread_of=root["id"])
    listed = await world.ok("GET", "/api/rooms")
    assert sorted(r["id"] for r in listed) == sorted([dm["id"], group["id"]])  # no threads
    assert await world.ok("GET", f"/api/rooms/{dm['id']}") == dm
    missing = await world.client.get("/api/rooms/00000000-0000-4000-8000-000000000000")
    assert missing.status_code == 404


async def test_turns_are_listed_newest_first_without_events(world: World) -> None:
    box = await world.computer()
    alice, bob = await world.agent("alice", box), await world.agent("bob", box)
    ids = []
    for agent in (alice, bob, alice):
        ids.append((await world.register(box, agent))["turn_id"])
        world.clock.advance(1)
    listed = await world.ok("GET", "/api/turns")
    assert [t["id"] for t in listed] == ids[::-1]
    mine = await world.ok("GET", "/api/turns", params={"agent_id": alice["id"], "limit": 1})
    assert [t["id"] for t in mine] == [ids[2]]


async def test_bad_query_parameters_are_4xx_in_the_error_shape(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    for i in range(3):
        await world.post(room["id"], f"m{i}")
    path = f"/api/rooms/{room['id']}/messages"
    page = await world.ok("GET", path, params={"after_seq": 1, "limit": 1})
    assert [m["seq"] for m in page] == [2]
    for params, words in (
        ({"after_seq": "abc"}, "after_seq must be an integer"),
        ({"after_seq": "-1"}, "after_seq must be between"),
        ({"limit": "0"}, "limit must be between"),
        ({"limit": "1.5"}, "limit must be an integer"),
        ({"afterseq": "1"}, "unknown query parameter 'afterseq'"),
    ):
        answer = await world.client.get(path, params=params)
        assert answer.status_code == 422, params
        assert (
            answer.json()["error"]["code"] == "invalid"
            and words in answer.json()["error"]["message"]
        )
    for path, params in (
        ("/api/turns", {"agent_id": "nope"}),
        ("/api/tasks", {"room_id": "nope"}),
        ("/api/agents", {"x": "1"}),
    ):
        answer = await world.client.get(path, params=params)
        assert answer.status_code == 422 and answer.json()["error"]["code"] == "invalid", path
    for number in ("abc", "%C2%B2", "%D9%A3", "-1"):  # "²" and "٣" are digits, not ASCII ones
        answer = await world.client.post(f"/api/tasks/{number}/status", json={"status": "done"})
        assert answer.status_code == 422, number
    token = await world.token(box, alice)
    tasks = await world.client.get("/agent/tasks", params={"room_id": "x"}, headers=bearer(token))
    assert tasks.status_code == 422
    for last_id in (b"abc", b"-1", "²".encode("latin-1"), b"1.5"):
        stream = await world.client.get(
            "/computer/events", headers={**box.headers, "Last-Event-ID": last_id}
        )
        assert stream.status_code == 422, last_id
        assert "Last-Event-ID" in stream.json()["error"]["message"]


async def test_unknown_routes_and_methods_answer_json_errors(world: World) -> None:
    box = await world.computer()
    # "/" is the web app (crew_server/web) now
    for path in ("/computer/nothing", "/agent/nothing", "/api/nothing", "/nothing"):
        answer = await world.client.get(path, headers=box.headers)
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found", path
        assert path in answer.json()["error"]["message"]
    wrong = await world.client.get("/computer/connect", headers=box.headers)
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
    assert wrong.headers["allow"] == "POST"
    both = await world.client.post("/api/rooms/00000000-0000-4000-8000-000000000000")
    assert both.status_code == 405
    assert set(both.headers["allow"].split(", ")) == {"GET", "HEAD", "PATCH", "DELETE"}


async def test_a_reply_in_a_thread_is_held_while_the_thread_has_unseen_messages(
    world: World,
) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    group = await world.group("launch", alice)
    token = await world.token(box, alice)
    root = await world.post(group["id"], "plan?")
    first = await world.post(group["id"], "@alice in the thread", thread_of=root["id"])
    await world.unread(box, alice)
    newer = await world.post(group["id"], "one more", thread_of=root["id"])
    held = await world.reply(token, group["id"], "ok", thread_of=root["id"])
    assert held.status_code == 409
    [room] = held.json()["rooms"]
    assert room["room"]["id"] == first["room_id"] and room["room"]["kind"] == "thread"
    assert [m["id"] for m in room["messages"]] == [newer["id"]]
    sent = await world.reply(token, group["id"], "ok", thread_of=root["id"])
    assert sent.status_code == 201 and sent.json()["thread_id"] == first["room_id"]
    summary = (await world.messages(group["id"]))[0]["thread"]
    assert summary["replies"] == 3 and summary["last_at"] == iso(world.clock.now())


def test_the_event_stream_pings_every_15_seconds_by_default() -> None:
    assert PING_SECONDS == 15.0
