"""Deleting agents, rooms and Computers, renaming a group and changing its members (issue
25), through the user API on both backends: each with its effects on tokens, rooms,
positions, tasks and the Computer's events, and the refusals."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from httpx_sse import connect_sse

from crew_server.store import Store
from crew_testkit.crew_server_proc import computer_connection
from tests.server.test_sse import threaded_server  # noqa: F401  (a fixture)
from tests.server.world import World, bearer, turn_registration


@pytest.mark.anyio
async def test_deleting_an_agent_takes_its_dm_and_tokens_and_keeps_its_group_messages(
    world: World,
) -> None:
    box = await world.computer()
    ada, bob = await world.agent("ada", box), await world.agent("bob", box)
    dm = await world.dm(ada)
    group = await world.group("Crew", ada, bob)
    ada_token = await world.token(box, ada)
    said = (await world.reply(ada_token, group["id"], "hello from ada")).json()
    task = await world.ok(
        "POST", "/api/tasks", json={"room_id": group["id"], "title": "t", "assignee": "ada"}
    )
    await world.post(dm["id"], "hi ada")
    running = await world.register(box, ada)
    cursor = world.cursor()

    await world.ok("DELETE", f"/api/agents/{ada['id']}", status=204)

    assert [a["handle"] for a in await world.ok("GET", "/api/agents")] == ["bob"]
    assert [
        a["handle"] for a in await world.ok("GET", "/computer/agents", headers=box.headers)
    ] == ["bob"]
    assert ("agents", {"agent_id": ada["id"]}) in world.events(box, cursor)
    # Her dm is gone; the group stays, without her, with her message under her name.
    assert [r["id"] for r in await world.ok("GET", "/api/rooms")] == [group["id"]]
    await world.ok("GET", f"/api/rooms/{dm['id']}", status=404)
    room = await world.ok("GET", f"/api/rooms/{group['id']}")
    assert [p.get("handle") for p in room["members"]] == [None, "bob"]
    kept = next(m for m in await world.messages(group["id"]) if m["id"] == said["message_id"])
    assert kept["author"] == {
        "kind": "agent",
        "id": ada["id"],
        "name": "Ada (deleted)",
        "handle": None,
    }
    # Her token no longer works; her task has no assignee; her running turn was stopped.
    refused = await world.reply(ada_token, group["id"], "still here?")
    assert refused.status_code == 401
    tasks = await world.ok("GET", f"/api/tasks?room_id={group['id']}")
    assert [(t["number"], t["assignee"]) for t in tasks] == [(task["number"], None)]
    turn = await world.ok("GET", f"/api/turns/{running['turn_id']}")
    assert turn["status"] == "cancelled"
    late = await world.client.post(
        f"/computer/turns/{running['turn_id']}/finish",
        json={"fence": running["fence"], "status": "succeeded"},
        headers=box.headers,
    )
    assert late.status_code == 409 and late.json()["error"]["code"] == "stale_turn"
    # Gone for good: a second delete, a patch, a room with her are refused; @ada is free.
    await world.ok("DELETE", f"/api/agents/{ada['id']}", status=404)
    await world.ok("PATCH", f"/api/agents/{ada['id']}", json={"name": "A"}, status=404)
    await world.ok("GET", f"/api/agents/{ada['id']}/positions", status=404)
    await world.ok("DELETE", f"/api/agents/{ada['id']}/mutes/{group['id']}", status=404)
    body = {"kind": "group", "title": "Again", "agent_ids": [ada["id"]]}
    await world.ok("POST", "/api/rooms", json=body, status=404)
    again = await world.agent("ada", box)
    assert again["id"] != ada["id"]


@pytest.mark.anyio
async def test_deleting_a_room_takes_its_threads_and_leaves_its_agents(world: World) -> None:
    box = await world.computer()
    ada, bob = await world.agent("ada", box), await world.agent("bob", box)
    group = await world.group("Crew", ada, bob)
    root = await world.post(group["id"], "plan @ada")
    reply = await world.post(group["id"], "in the thread", thread_of=root["id"])
    await world.ok("POST", "/api/tasks", json={"room_id": group["id"], "title": "t"})
    await world.ok(
        "POST", f"/api/rooms/{group['id']}/messages", json={"body": "x", "thread_of": root["id"]}
    )
    token = await world.token(box, ada)
    muted = await world.client.put(f"/agent/mutes/{group['id']}", json={}, headers=bearer(token))
    assert muted.status_code == 200
    dm = await world.dm(bob)

    # A thread goes only with its group.
    refused = await world.client.delete(f"/api/rooms/{reply['room_id']}")
    assert (
        refused.status_code == 422 and "goes with its group" in refused.json()["error"]["message"]
    )
    await world.ok("DELETE", f"/api/rooms/{group['id']}", status=204)

    await world.ok("GET", f"/api/rooms/{group['id']}", status=404)
    await world.ok("GET", f"/api/rooms/{reply['room_id']}", status=404)
    await world.ok("GET", f"/api/rooms/{group['id']}/messages", status=404)
    assert [r["id"] for r in await world.ok("GET", "/api/rooms")] == [dm["id"]]
    assert await world.ok("GET", "/api/tasks") == []
    assert list(await world.positions(ada)) == []
    assert list(await world.positions(bob)) == [dm["id"]]
    assert [a["handle"] for a in await world.ok("GET", "/api/agents")] == ["ada", "bob"]
    # Posting there is refused; a dm goes the same way.
    await world.ok("POST", f"/api/rooms/{group['id']}/messages", json={"body": "x"}, status=404)
    await world.ok("DELETE", f"/api/rooms/{dm['id']}", status=204)
    await world.ok("DELETE", f"/api/rooms/{dm['id']}", status=404)
    assert await world.ok("GET", "/api/rooms") == []


@pytest.mark.anyio
async def test_deleting_a_computer_revokes_its_tokens_and_frees_its_agents(world: World) -> None:
    box = await world.computer()
    ada = await world.agent("ada", box)
    dm = await world.dm(ada)
    await world.post(dm["id"], "hi")
    token = await world.token(box, ada)
    claimed = await world.unread(box, ada)
    turn = await world.ok(
        "POST",
        f"/computer/agents/{ada['id']}/turns",
        json=turn_registration(claimed),
        headers=box.headers,
        status=201,
    )

    await world.ok("DELETE", f"/api/computers/{box.id}", status=204)

    refused = await world.client.get("/computer/agents", headers=box.headers)
    assert refused.status_code == 401
    assert "was deleted on the crew server" in refused.json()["error"]["message"]
    assert (await world.reply(token, dm["id"], "answer")).status_code == 401
    assert await world.ok("GET", "/api/computers") == []
    agent = next(a for a in await world.ok("GET", "/api/agents") if a["id"] == ada["id"])
    assert agent["computer_id"] is None
    ended = await world.ok("GET", f"/api/turns/{turn['turn_id']}")
    assert ended["status"] == "interrupted"
    # Nothing was answered: the message waits for the agent's next Computer.
    assert (await world.positions(ada))[dm["id"]][1] == 0
    await world.ok("DELETE", f"/api/computers/{box.id}", status=404)
    patch = {"computer_id": box.id}
    await world.ok("PATCH", f"/api/agents/{ada['id']}", json=patch, status=404)


@pytest.mark.anyio
async def test_renaming_a_group_and_changing_its_members(world: World) -> None:
    box = await world.computer()
    ada, bob = await world.agent("ada", box), await world.agent("bob", box)
    group = await world.group("Crew", ada)
    await world.post(group["id"], "before bob")
    token = await world.token(box, ada)
    await world.client.put(f"/agent/mutes/{group['id']}", json={}, headers=bearer(token))

    room = await world.ok(
        "PATCH", f"/api/rooms/{group['id']}", json={"title": "Ship it", "agent_ids": [bob["id"]]}
    )
    assert room["title"] == "Ship it"
    assert [p.get("handle") for p in room["members"]] == [None, "bob"]
    # Bob starts at the newest message: only what follows wakes him. Ada is not woken there.
    positions = await world.positions(bob)
    assert positions[group["id"]] == (1, 1)
    assert group["id"] not in await world.positions(ada)
    cursor = world.cursor()
    await world.post(group["id"], "after the change")
    assert world.wakes(box, cursor) == [bob["id"]]
    assert (await world.reply(token, group["id"], "me?")).status_code == 403
    assert await world.unread(box, bob) != []
    # Back in: no mute left from before.
    room = await world.ok(
        "PATCH", f"/api/rooms/{group['id']}", json={"agent_ids": [ada["id"], bob["id"]]}
    )
    assert room["muted"] is False
    assert [m["handle"] for m in room["members"][1:]] == ["ada", "bob"]
    # The loop guard still changes on its own, and with a rename.
    room = await world.ok(
        "PATCH", f"/api/rooms/{group['id']}", json={"agent_hop_limit": 5, "title": "Crew"}
    )
    assert (room["title"], room["agent_hop_limit"]) == ("Crew", 5)


@pytest.mark.anyio
async def test_a_dm_or_thread_cannot_be_renamed_and_bad_changes_are_refused(world: World) -> None:
    box = await world.computer()
    ada = await world.agent("ada", box)
    dm = await world.dm(ada)
    group = await world.group("Crew", ada)
    root = await world.post(group["id"], "root")
    thread = (await world.post(group["id"], "reply", thread_of=root["id"]))["room_id"]

    async def refused(room_id: str, body: dict[str, Any], status: int) -> str:
        answer = await world.client.patch(f"/api/rooms/{room_id}", json=body)
        assert answer.status_code == status, answer.text
        return str(answer.json()["error"]["message"])

    assert "a dm is between you and one agent" in await refused(dm["id"], {"title": "x"}, 422)
    assert "a dm is between" in await refused(dm["id"], {"agent_ids": []}, 422)
    assert "a thread follows its group" in await refused(thread, {"title": "x"}, 422)
    assert "title" in await refused(group["id"], {"title": "   "}, 422)
    assert "title" in await refused(group["id"], {"title": "x" * 201}, 422)
    missing = "00000000-0000-4000-8000-000000000000"
    assert missing in await refused(group["id"], {"agent_ids": [missing]}, 404)
    await refused(missing, {"title": "x"}, 404)
    # Nothing changed.
    room = await world.ok("GET", f"/api/rooms/{group['id']}")
    assert room["title"] == "Crew" and [m["handle"] for m in room["members"][1:]] == ["ada"]
    for path in ("agents", "rooms", "computers"):
        await world.ok("DELETE", f"/api/{path}/{missing}", status=404)


@pytest.mark.timeout(30)
def test_deleting_a_computer_ends_its_open_stream_with_the_reason(
    threaded_server: tuple[httpx.Client, Store],  # noqa: F811
) -> None:
    """The Computer's stream says `revoked` (why) and ends; opening it again is 401."""
    client, _ = threaded_server
    made = client.post("/api/computers", json={"name": "box"}).json()
    headers = computer_connection(client, made["token"])
    seen: list[tuple[str, Any]] = []
    with connect_sse(client, "GET", "/computer/events", headers=headers, timeout=10) as source:
        assert source.response.status_code == 200
        assert client.delete(f"/api/computers/{made['computer_id']}").status_code == 204
        for sse in source.iter_sse():
            seen.append((sse.event, orjson.loads(sse.data)))
    events = [(e, d) for e, d in seen if e != "ping"]
    assert [e for e, _ in events] == ["revoked"]
    assert "'box' was deleted on the crew server" in events[0][1]["reason"]
    again = client.get("/computer/events", headers=headers)
    assert again.status_code == 401 and "revoked" in again.json()["error"]["message"]
