"""Who may do what (tokens), and bad input: clear 4xx answers, nothing lost."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from crew_server.app import create_app
from crew_server.clock import Clock
from crew_server.store import Store
from tests.server.world import World, bearer

pytestmark = pytest.mark.anyio


async def test_agent_token_posts_only_where_its_agent_is(world: World) -> None:
    box = await world.computer()
    alice, bob = await world.agent("alice", box), await world.agent("bob", box)
    bob_dm, bob_group = await world.dm(bob), await world.group("bobs", bob)
    token = await world.token(box, alice)
    dm = await world.reply(token, bob_dm["id"], "let me in")
    assert dm.status_code == 403 and "another agent" in dm.json()["error"]["message"]
    group = await world.reply(token, bob_group["id"], "let me in")
    assert group.status_code == 403 and dm.json()["error"]["code"] == "forbidden"
    missing = await world.reply(token, "00000000-0000-4000-8000-000000000000", "x")
    assert missing.status_code == 404
    assert await world.messages(bob_dm["id"]) == []


async def test_agent_token_cannot_use_computer_endpoints(world: World) -> None:
    box = await world.computer()
    alice, bob = await world.agent("alice", box), await world.agent("bob", box)
    await world.post((await world.dm(bob))["id"], "secret for bob")
    token = await world.token(box, alice)
    for agent in (bob, alice):
        answer = await world.client.post(
            f"/computer/agents/{agent['id']}/unread", headers=bearer(token)
        )
        assert answer.status_code == 401
    assert (await world.positions(bob)) != {} and all(
        d == 0 for d, _ in (await world.positions(bob)).values()
    )


async def test_a_computer_sees_only_its_own_agents(world: World) -> None:
    mine, theirs = await world.computer("mine"), await world.computer("theirs")
    alice = await world.agent("alice", mine)
    bob = await world.agent("bob", theirs)
    listed = await world.ok("GET", "/computer/agents", headers=mine.headers)
    assert [a["handle"] for a in listed] == ["alice"]
    assert listed[0]["id"] == alice["id"]
    for method, path in (
        ("POST", f"/computer/agents/{bob['id']}/unread"),
        ("POST", f"/computer/agents/{bob['id']}/token"),
        ("DELETE", f"/computer/agents/{bob['id']}/problem"),
    ):
        answer = await world.client.request(method, path, headers=mine.headers)
        assert answer.status_code == 404, path
    bob_turn = await world.register(theirs, bob)
    finish = await world.client.post(
        f"/computer/turns/{bob_turn['turn_id']}/finish",
        json={"fence": bob_turn["fence"], "status": "succeeded"},
        headers=mine.headers,
    )
    assert finish.status_code == 404


async def test_agent_tokens_stay_valid_until_the_computer_reconnects(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    old, new = await world.token(box, alice), await world.token(box, alice)
    for token in (old, new):
        assert (await world.reply(token, room["id"], "still valid")).status_code == 201
    await world.connect(box)
    for token in (old, new):
        answer = await world.reply(token, room["id"], "after reconnect")
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "unauthorized"
    fresh = await world.token(box, alice)
    assert (await world.reply(fresh, room["id"], "new epoch")).status_code == 201


async def test_moving_an_agent_to_another_computer_ends_its_tokens(world: World) -> None:
    box, other = await world.computer("box"), await world.computer("other")
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    token = await world.token(box, alice)
    before = world.cursor()
    await world.ok("PATCH", f"/api/agents/{alice['id']}", json={"computer_id": other.id})
    assert ("agents", {"agent_id": alice["id"]}) in world.events(box, before)
    assert ("agents", {"agent_id": alice["id"]}) in world.events(other, before)
    assert (await world.reply(token, room["id"], "x")).status_code == 401


async def test_bad_computer_token_is_401(world: World) -> None:
    answer = await world.client.post(
        "/computer/connect",
        headers=bearer("crc_nope"),
        json={"hostname": "h", "platform": "p", "version": "v", "capacity": 1},
    )
    assert answer.status_code == 401
    assert (await world.client.get("/computer/agents")).status_code == 401


async def test_bodies_over_one_mebibyte_are_refused(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    big = b'{"body": "' + b"x" * (1024 * 1024) + b'"}'
    answer = await world.client.post(
        f"/api/rooms/{room['id']}/messages",
        content=big,
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "too_large"

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted while reading
        for _ in range(17):
            yield b" " * 65536

    streamed = await world.client.post(f"/api/rooms/{room['id']}/messages", content=chunks())
    assert streamed.status_code == 413
    assert await world.messages(room["id"]) == []


async def test_malformed_and_invalid_bodies_get_clear_4xx(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    path = f"/api/rooms/{room['id']}/messages"
    cases = [
        (b"{not json", 400, "bad_json"),
        (b"\xff\xfe", 400, "bad_json"),
        (b'{"body": ""}', 422, "invalid"),
        (b'{"body": "   "}', 422, "invalid"),
        (b'{"body": 5}', 422, "invalid"),
        (b'{"body": "' + b"y" * 20_001 + b'"}', 422, "invalid"),
        (b'{"body": "ok", "thread_of": "not-a-uuid"}', 422, "invalid"),
        (b"[1, 2]", 422, "invalid"),
    ]
    for raw, status, code in cases:
        answer = await world.client.post(
            path, content=raw, headers={"content-type": "application/json"}
        )
        assert answer.status_code == status, (raw[:30], answer.text)
        error = answer.json()["error"]
        assert error["code"] == code and error["message"]
    assert await world.messages(room["id"]) == []
    handle = await world.client.post(
        "/api/agents", json={"handle": "Bad Handle!", "name": "x", "model": "m"}
    )
    assert handle.status_code == 422 and "handle" in handle.json()["error"]["message"]
    taken = await world.client.post(
        "/api/agents", json={"handle": "alice", "name": "x", "model": "m"}
    )
    assert taken.status_code == 409 and "@alice is taken" in taken.json()["error"]["message"]
    dm_two = await world.client.post("/api/rooms", json={"kind": "dm", "agent_ids": []})
    assert dm_two.status_code == 422
    number = await world.client.post("/api/tasks/abc/status", json={"status": "done"})
    assert number.status_code == 422
    route = await world.client.get("/api/nothing-here")
    assert route.status_code == 404 and route.json()["error"]["code"] == "not_found"
    method = await world.client.delete("/api/rooms")
    assert method.status_code == 405 and method.json()["error"]["code"] == "method_not_allowed"
    seq = await world.client.get(path, params={"after_seq": "x"})
    assert seq.status_code == 422


@pytest.mark.parametrize("dev", [False, True])
async def test_user_api_needs_the_user_token_with_or_without_dev(
    dev: bool, store_location: str
) -> None:
    clock = Clock()
    store = Store(store_location, clock)
    token = store.ensure_user_token()
    assert token is not None and store.ensure_user_token() is None  # created once
    app = create_app(store, clock, dev=dev, run_scheduler=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as client:
        assert (await client.get("/api/agents")).status_code == 401
        assert (await client.get("/api/agents", headers=bearer("cru_wrong"))).status_code == 401
        assert (await client.get("/api/agents", headers=bearer(token))).status_code == 200
        tick = {"advance_seconds": 1}
        assert (await client.post("/api/dev/clock", json=tick)).status_code == 401
        clock_hook = await client.post("/api/dev/clock", json=tick, headers=bearer(token))
        # the hook exists only with --dev, and even then only for the user
        assert clock_hook.status_code == (200 if dev else 404)
    store.close()


async def test_values_beyond_what_can_be_stored_are_422_never_500(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    group = await world.group("launch", alice)
    token = await world.token(box, alice)
    turn = await world.register(box, alice)
    events = f"/computer/turns/{turn['turn_id']}/events"
    finish = f"/computer/turns/{turn['turn_id']}/finish"
    fence = turn["fence"]
    deep: dict[str, object] = {}
    for _ in range(300):
        deep = {"d": deep}
    for path, body, headers in (
        (
            events,
            {"fence": fence, "first_index": 0, "events": [{"type": "text", "at": at, "data": {}}]},
            box.headers,
        )
        for at in (
            "9999-12-31T23:59:59-01:00",
            "0001-01-01T00:00:00+01:00",
            "1970-12-31T23:00:00-02:00",
        )
    ):
        answer = await world.client.post(path, json=body, headers=headers)
        assert answer.status_code == 422 and "events.0.at" in answer.json()["error"]["message"]
    cases = [
        (
            events,
            {
                "fence": fence,
                "first_index": 0,
                "events": [{"type": "other", "at": "2026-10-05T09:00:00Z", "data": {"n": 2**70}}],
            },
            box.headers,
        ),
        (
            events,
            {
                "fence": fence,
                "first_index": 0,
                "events": [{"type": "other", "at": "2026-10-05T09:00:00Z", "data": deep}],
            },
            box.headers,
        ),
        (
            finish,
            {"fence": fence, "status": "succeeded", "usage": {"input_tokens": 2**60}},
            box.headers,
        ),
        (finish, {"fence": fence, "status": "succeeded", "usage": {"cost": 1e300}}, box.headers),
        (
            f"/computer/agents/{alice['id']}/turns",
            {
                "rooms": [{"room_id": group["id"], "from_seq": 1, "to_seq": 2**60}],
                "input": "x",
                "engine": "opencode",
                "model": "m",
            },
            box.headers,
        ),
        (
            "/agent/reminders",
            {"room_id": group["id"], "title": "t", "at": "9999-12-31T23:59:59-01:00"},
            bearer(token),
        ),
    ]
    for path, body, headers in cases:
        answer = await world.client.post(path, json=body, headers=headers)
        assert answer.status_code in (400, 422), (path, answer.text)
    mute = await world.client.put(
        f"/agent/mutes/{group['id']}",
        json={"until": "0001-01-01T00:00:00+01:00"},
        headers=bearer(token),
    )
    assert mute.status_code == 422
    record = await world.ok("GET", f"/api/turns/{turn['turn_id']}")
    assert record["status"] == "running" and "events" in record and record["events"] == []


async def test_an_unexpected_failure_is_a_json_500(store_location: str) -> None:
    class BrokenStore(Store):
        def list_agents(self) -> list[dict[str, object]]:
            raise RuntimeError("the disk is on fire")

    clock = Clock()
    store = BrokenStore(store_location, clock)
    token = store.ensure_user_token()
    assert token is not None
    app = create_app(store, clock, dev=True, run_scheduler=False)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        answer = await client.get("/api/agents", headers=bearer(token))
    assert answer.status_code == 500
    assert answer.json()["error"]["code"] == "internal"
    assert "GET /api/agents" in answer.json()["error"]["message"]
    assert "fire" not in answer.text  # details stay in the server's log
    store.close()
