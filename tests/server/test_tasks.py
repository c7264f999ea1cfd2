"""Tasks: numbers from 1, host message and thread, claim/assign/status refusals, notices that wake."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.world import Computer, World, bearer

pytestmark = pytest.mark.anyio


async def setup(
    world: World,
) -> tuple[Computer, dict[str, Any], dict[str, Any], dict[str, Any], str, str]:
    box = await world.computer()
    alice, bob = await world.agent("alice", box), await world.agent("bob", box)
    room = await world.group("launch", alice, bob)
    return box, alice, bob, room, await world.token(box, alice), await world.token(box, bob)


async def test_create_with_assignee_hosts_a_message_opens_a_thread_and_wakes_the_assignee(
    world: World,
) -> None:
    box, _alice, bob, room, alice_token, _ = await setup(world)
    before = world.cursor()
    task = await world.ok(
        "POST",
        "/agent/tasks",
        headers=bearer(alice_token),
        status=201,
        json={"room_id": room["id"], "title": "Write the release note", "assignee": "@bob"},
    )
    assert task["number"] == 1 and task["status"] == "todo" and task["assignee"] == "bob"
    host = (await world.messages(room["id"]))[-1]
    assert host["id"] == task["host_message_id"] and host["body"] == "Write the release note"
    assert host["task"] == {
        "number": 1,
        "title": "Write the release note",
        "status": "todo",
        "assignee": "bob",
    }
    assert host["thread"]["id"] == task["thread_id"]
    notices = await world.messages(task["thread_id"])
    assert [(n["kind"], n["body"]) for n in notices] == [
        ("notice", "@alice created task #1, assigned to @bob.")
    ]
    assert notices[0]["author"]["kind"] == "system"
    assert world.wakes(box, before).count(bob["id"]) == 2  # the group message and the notice
    second = await world.ok(
        "POST", "/api/tasks", json={"room_id": room["id"], "title": "Two"}, status=201
    )
    assert second["number"] == 2


async def test_claim_is_refused_when_someone_else_holds_the_task(world: World) -> None:
    _, _, _, room, alice_token, bob_token = await setup(world)
    task = await world.ok(
        "POST",
        "/agent/tasks",
        headers=bearer(alice_token),
        status=201,
        json={"room_id": room["id"], "title": "Fix the build"},
    )
    claimed = await world.ok(
        "POST", f"/agent/tasks/{task['number']}/claim", headers=bearer(alice_token)
    )
    assert claimed["assignee"] == "alice" and claimed["status"] == "in_progress"
    refused = await world.client.post(
        f"/agent/tasks/{task['number']}/claim", headers=bearer(bob_token)
    )
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "refused"
    assert "assigned to @alice" in error["message"]
    again = await world.ok(
        "POST", f"/agent/tasks/{task['number']}/claim", headers=bearer(alice_token)
    )
    assert again["assignee"] == "alice"


async def test_only_the_assignee_or_the_user_moves_a_task(world: World) -> None:
    box, alice, bob, room, alice_token, bob_token = await setup(world)
    task = await world.ok(
        "POST",
        "/agent/tasks",
        headers=bearer(alice_token),
        status=201,
        json={"room_id": room["id"], "title": "Tidy", "assignee": "alice"},
    )
    number = task["number"]
    refused = await world.client.post(
        f"/agent/tasks/{number}/status", headers=bearer(bob_token), json={"status": "done"}
    )
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "refused"
    assert "only the assignee (@alice)" in refused.json()["error"]["message"]

    moved = await world.ok(
        "POST",
        f"/agent/tasks/{number}/status",
        headers=bearer(alice_token),
        json={"status": "in_review", "note": "done, see work/tidy.md"},
    )
    assert moved["status"] == "in_review"
    before = world.cursor()
    back = await world.ok(
        "POST",
        f"/api/tasks/{number}/status",
        json={"status": "in_progress", "note": "please add tests"},
    )
    assert back["status"] == "in_progress"
    assert alice["id"] in world.wakes(box, before)
    bodies = [m["body"] for m in await world.messages(task["thread_id"])]
    assert bodies[-2:] == [
        "@alice moved task #1 to in_review: done, see work/tidy.md",
        "User moved task #1 to in_progress: please add tests",
    ]
    assert bob["id"] not in world.wakes(box, before)


async def test_unassigned_task_must_be_claimed_before_moving(world: World) -> None:
    _, _, _, room, alice_token, _ = await setup(world)
    task = await world.ok(
        "POST",
        "/agent/tasks",
        headers=bearer(alice_token),
        status=201,
        json={"room_id": room["id"], "title": "Open"},
    )
    refused = await world.client.post(
        f"/agent/tasks/{task['number']}/status",
        headers=bearer(alice_token),
        json={"status": "done"},
    )
    assert refused.status_code == 409 and "claim it first" in refused.json()["error"]["message"]


async def test_assign_is_refused_to_non_holders_and_wakes_the_new_assignee(world: World) -> None:
    box, _, bob, room, alice_token, bob_token = await setup(world)
    task = await world.ok(
        "POST",
        "/agent/tasks",
        headers=bearer(alice_token),
        status=201,
        json={"room_id": room["id"], "title": "Deploy", "assignee": "alice"},
    )
    refused = await world.client.post(
        f"/agent/tasks/{task['number']}/assign", headers=bearer(bob_token), json={"assignee": "bob"}
    )
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "refused"
    before = world.cursor()
    handed = await world.ok(
        "POST",
        f"/agent/tasks/{task['number']}/assign",
        headers=bearer(alice_token),
        json={"assignee": "@bob"},
    )
    assert handed["assignee"] == "bob"
    assert world.wakes(box, before) == [bob["id"]]
    rooms = await world.unread(box, bob)
    thread = next(r for r in rooms if r["room"]["id"] == task["thread_id"])
    assert (
        thread["room"]["kind"] == "thread"
        and thread["room"]["root_message"]["id"] == task["host_message_id"]
    )
    assert thread["messages"][-1]["body"] == "@alice assigned task #1 to @bob."
    stranger = await world.client.post(
        f"/api/tasks/{task['number']}/assign", json={"assignee": "nobody"}
    )
    assert stranger.status_code == 409 and "no agent @nobody" in stranger.json()["error"]["message"]


async def test_convert_turns_a_message_into_a_task_hosted_on_it(world: World) -> None:
    _box, _alice, _bob, room, _, bob_token = await setup(world)
    message = await world.post(room["id"], "Please update the docs\nand the changelog")
    task = await world.ok(
        "POST",
        "/agent/tasks/convert",
        headers=bearer(bob_token),
        status=201,
        json={"message_id": message["id"]},
    )
    assert task["host_message_id"] == message["id"] and task["title"] == "Please update the docs"
    assert task["room_id"] == room["id"]
    listed = await world.ok(
        "GET", "/agent/tasks", params={"room_id": room["id"]}, headers=bearer(bob_token)
    )
    assert [t["number"] for t in listed] == [task["number"]]
    via_thread = await world.ok(
        "GET", "/agent/tasks", params={"room_id": task["thread_id"]}, headers=bearer(bob_token)
    )
    assert via_thread == listed
    twice = await world.client.post("/api/tasks/convert", json={"message_id": message["id"]})
    assert twice.status_code == 409 and "already task #1" in twice.json()["error"]["message"]
    host = next(m for m in await world.messages(room["id"]) if m["id"] == message["id"])
    assert host["task"]["number"] == task["number"]


async def test_tasks_of_a_room_the_agent_is_not_in_are_forbidden(world: World) -> None:
    box, _, _, room, _, _ = await setup(world)
    carol = await world.agent("carol", box)
    carol_token = await world.token(box, carol)
    answer = await world.client.get(
        "/agent/tasks", params={"room_id": room["id"]}, headers=bearer(carol_token)
    )
    assert answer.status_code == 403
    missing = await world.client.post("/agent/tasks/99/claim", headers=bearer(carol_token))
    assert missing.status_code == 404


async def test_task_calls_naming_another_room_are_not_found(world: World) -> None:
    _, _, _, room, alice_token, _ = await setup(world)
    task = await world.ok(
        "POST",
        "/agent/tasks",
        headers=bearer(alice_token),
        status=201,
        json={"room_id": room["id"], "title": "Here"},
    )
    other = await world.group("elsewhere")
    for room_id, status in ((room["id"], 200), (task["thread_id"], 200), (other["id"], 404)):
        answer = await world.client.post(
            f"/agent/tasks/{task['number']}/claim",
            json={"room_id": room_id},
            headers=bearer(alice_token),
        )
        assert answer.status_code == status, answer.text
    moved = await world.client.post(
        f"/api/tasks/{task['number']}/status", json={"room_id": other["id"], "status": "done"}
    )
    assert moved.status_code == 404 and "not in room" in moved.json()["error"]["message"]


async def test_a_task_in_a_dm_has_a_thread_its_agent_follows(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    dm = await world.dm(alice)
    token = await world.token(box, alice)
    before = world.cursor()
    task = await world.ok(
        "POST", "/api/tasks", json={"room_id": dm["id"], "title": "Book"}, status=201
    )
    assert task["room_id"] == dm["id"] and world.wakes(box, before) == [alice["id"]]
    rooms = {r["room"]["kind"]: r for r in await world.unread(box, alice)}  # same time: any order
    assert {k: [m["body"] for m in r["messages"]] for k, r in rooms.items()} == {
        "dm": ["Book"],
        "thread": ["User created task #1."],
    }
    assert rooms["thread"]["room"]["parent_room_id"] == dm["id"]
    assert rooms["thread"]["room"]["parent_kind"] == "dm"
    assert rooms["thread"]["room"]["root_message"]["id"] == task["host_message_id"]
    # the user writes in the task's thread: the dm's agent is woken and gets it
    before = world.cursor()
    await world.post(task["thread_id"], "any news?")
    assert world.wakes(box, before) == [alice["id"]]
    rooms = {r["room"]["kind"]: r for r in await world.unread(box, alice)}  # not acked: again
    assert [m["body"] for m in rooms["thread"]["messages"]] == [
        "User created task #1.",
        "any news?",
    ]
    sent = await world.reply(token, task["thread_id"], "booked")
    assert sent.status_code == 201, sent.text
    done = await world.ok(
        "POST",
        f"/agent/tasks/{task['number']}/claim",
        json={"room_id": task["thread_id"]},
        headers=bearer(token),
    )
    assert done["assignee"] == "alice"
    bodies = [m["body"] for m in await world.messages(task["thread_id"])]
    assert bodies == ["User created task #1.", "any news?", "booked", "@alice claimed task #1."]
    host = (await world.messages(dm["id"]))[0]
    assert host["thread"]["replies"] == 4 and host["task"]["status"] == "in_progress"
