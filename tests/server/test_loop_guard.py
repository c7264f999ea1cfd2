"""The loop guard (issue 24): agents answering each other stop at the room's hop limit or
per-minute cap with one notice, nothing is lost, and the user's next message starts them
again. Pure table tests of the rule, then the store on both backends."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from crew_server import rules
from crew_server.clock import Clock, iso
from crew_server.errors import Held
from crew_server.store import Store
from crew_server.store.identities import AgentIdentity
from tests.server.conftest import START
from tests.server.world import Computer, World, bearer
from tests.support.postgres import location_for

# ---------------------------------------------------------------- the pure rule


def facts(
    in_a_row: int = 0,
    last_minute: int = 0,
    *,
    hop: int = 3,
    rate: int = 12,
    paused: bool = False,
) -> rules.LoopFacts:
    return rules.LoopFacts(hop, rate, in_a_row, last_minute, paused)


@pytest.mark.parametrize(
    ("loop", "why"),
    [
        (facts(0), None),
        (facts(2), None),  # the third agent message in a row still wakes
        (facts(3), "hops"),  # the fourth does not
        (facts(0, hop=0), "hops"),  # 0: agents never wake each other
        (facts(0, 11), None),
        (facts(0, 12), "rate"),  # the 13th within a minute
        (facts(5, 20), "hops"),  # the hop limit is named first
        (facts(0, 0, paused=True), "paused"),  # paused until the user writes
        (facts(99, hop=100, rate=600), None),
    ],
)
def test_loop_pause(loop: rules.LoopFacts, why: str | None) -> None:
    assert rules.loop_pause(loop) == why


GROUP = rules.RoomFacts("group", frozenset({"A", "B", "C"}), frozenset({"C"}))
ALL_MUTED = rules.RoomFacts("group", frozenset({"A", "B"}), frozenset({"B"}))
DM = rules.RoomFacts("dm", frozenset({"A"}), frozenset())


@pytest.mark.parametrize(
    ("room", "mentions", "loop", "woken", "pause"),
    [
        (GROUP, [], facts(0), ["B"], None),
        (GROUP, ["C"], facts(2), ["B", "C"], None),  # a mention within the limit wakes
        (GROUP, ["C"], facts(3), [], "hops"),  # beyond it, it does not
        (GROUP, [], facts(0, 12), [], "rate"),
        (GROUP, [], facts(7, paused=True), [], None),  # one notice per pause
        (DM, [], facts(9), [], None),  # a message that concerns nobody is no loop
        (ALL_MUTED, [], facts(9), [], None),
        (ALL_MUTED, ["B"], facts(9), [], "hops"),
        (rules.RoomFacts("thread", frozenset({"A", "B"}), frozenset()), [], facts(3), [], "hops"),
    ],
)
def test_woken_by_agent_message(
    room: rules.RoomFacts,
    mentions: list[str],
    loop: rules.LoopFacts,
    woken: list[str],
    pause: str | None,
) -> None:
    assert rules.woken_by_agent_message(room, "A", mentions, loop) == (woken, pause)


@pytest.mark.parametrize(
    ("reason", "loop", "text"),
    [
        (
            "hops",
            facts(3),
            "Agents paused here until someone writes (4 agent messages in a row; this "
            "room's hop limit is 3)",
        ),
        (
            "hops",
            facts(0, hop=0),
            "Agents paused here until someone writes (1 agent message in a row; this "
            "room's hop limit is 0)",
        ),
        (
            "rate",
            facts(1, 12),
            "Agents paused here until someone writes (13 agent messages within a minute; "
            "this room allows 12)",
        ),
    ],
)
def test_pause_notice(reason: str, loop: rules.LoopFacts, text: str) -> None:
    assert rules.loop_pause_notice(reason, loop) == text


# ---------------------------------------------------------------- the store, both backends

PAUSED = "Agents paused here until someone writes"


async def pair(world: World) -> tuple[Computer, list[dict[str, Any]], list[str], dict[str, Any]]:
    """The demo's shape: two agents in a group on one Computer."""
    box = await world.computer()
    agents = [await world.agent("ada", box), await world.agent("bob", box)]
    tokens = [await world.token(box, a) for a in agents]
    room = await world.group("pair", *agents)
    return box, agents, tokens, room


async def answer(
    world: World, box: Computer, agent: dict[str, Any], token: str, room_id: str, body: str
) -> list[str]:
    """The agent takes its turn as a Computer would (claim, reply, ack) → whom it woke."""
    await world.unread(box, agent)
    turn = await world.register(box, agent)
    before = world.cursor()
    response = await world.client.post(
        "/agent/reply",
        json={"room_id": room_id, "body": body},
        headers={**bearer(token), "Crew-Turn": turn["turn_secret"]},
    )
    assert response.status_code == 201, response.text
    woke = world.wakes(box, before)
    await world.ok(
        "POST",
        f"/computer/agents/{agent['id']}/ack",
        json={"turn_id": turn["turn_id"], "fence": turn["fence"]},
        headers=box.headers,
        status=204,
    )
    return woke


async def notices(world: World, room_id: str) -> list[str]:
    return [m["body"] for m in await world.messages(room_id) if m["body"].startswith(PAUSED)]


@pytest.mark.anyio
async def test_two_agents_stop_at_the_hop_limit_with_one_notice(world: World) -> None:
    box, agents, tokens, room = await pair(world)
    await world.post(room["id"], "talk to each other")
    woke = []
    for n in range(6):
        i = n % 2
        woke.append(await answer(world, box, agents[i], tokens[i], room["id"], f"reply {n}"))
    ada, bob = agents[0]["id"], agents[1]["id"]
    # Three agent messages in a row wake the other; the fourth and later wake nobody.
    assert woke == [[bob], [ada], [bob], [], [], []]
    assert await notices(world, room["id"]) == [
        f"{PAUSED} (4 agent messages in a row; this room's hop limit is 3)"
    ]
    shown = await world.ok("GET", f"/api/rooms/{room['id']}")
    messages = await world.messages(room["id"])
    fourth = next(m for m in messages if m["body"] == "reply 3")
    assert shown["agents_paused"] == {"since": iso(START), "seq": fourth["seq"], "reason": "hops"}
    assert shown["agent_messages_in_a_row"] == 6
    assert (shown["agent_hop_limit"], shown["agent_rate_limit"]) == (3, 12)
    # Nothing is lost: every reply is stored.
    assert [m["body"] for m in messages if m["author"]["kind"] == "agent"] == [
        f"reply {n}" for n in range(6)
    ]
    listed = {r["id"]: r for r in await world.ok("GET", "/api/rooms")}
    assert listed[room["id"]]["agents_paused"]["reason"] == "hops"


@pytest.mark.anyio
async def test_the_claim_holds_back_what_came_after_the_pause_and_the_user_releases_it(
    world: World,
) -> None:
    box, agents, tokens, room = await pair(world)
    await world.post(room["id"], "go")
    for n in range(5):
        i = n % 2
        await answer(world, box, agents[i], tokens[i], room["id"], f"reply {n}")
    paused_seq = (await world.ok("GET", f"/api/rooms/{room['id']}"))["agents_paused"]["seq"]
    # Ada, woken by another room, claims: nothing of this room from the pause on.
    ada = agents[0]
    other = await world.dm(ada)
    await world.post(other["id"], "something else")
    claimed = await world.unread(box, ada)
    seqs = {r["room"]["id"]: [m["seq"] for m in r["messages"]] for r in claimed}
    assert all(s < paused_seq for s in seqs.get(room["id"], []))
    assert seqs[other["id"]] == [1]
    # ... and they are not lost: unread, not delivered, not set aside.
    delivered, read = (await world.positions(ada))[room["id"]]
    assert delivered < paused_seq and read < paused_seq
    # A reply of hers into the paused room is not held for them and wakes nobody.
    assert await answer(world, box, ada, tokens[0], room["id"], "still here") == []
    assert (await world.positions(ada))[room["id"]][0] < paused_seq
    # The user writes: the pause ends, everyone is woken and gets the whole backlog.
    before = world.cursor()
    human = await world.post(room["id"], "thanks both")
    assert sorted(world.wakes(box, before)) == sorted(a["id"] for a in agents)
    shown = await world.ok("GET", f"/api/rooms/{room['id']}")
    assert shown["agents_paused"] is None and shown["agent_messages_in_a_row"] == 0
    [entry] = [r for r in await world.unread(box, ada) if r["room"]["id"] == room["id"]]
    got = [m["seq"] for m in entry["messages"]]
    assert got == list(range(got[0], human["seq"] + 1)) and got[0] <= paused_seq
    assert any(m["body"].startswith(PAUSED) for m in entry["messages"])


@pytest.mark.anyio
async def test_a_user_message_starts_them_again_and_they_stop_again(world: World) -> None:
    box, agents, tokens, room = await pair(world)
    ada, bob = agents[0]["id"], agents[1]["id"]
    for _ in range(2):
        await world.post(room["id"], "go")
        woke = [
            await answer(world, box, agents[n % 2], tokens[n % 2], room["id"], "hi")
            for n in range(5)
        ]
        assert woke == [[bob], [ada], [bob], [], []]
    assert len(await notices(world, room["id"])) == 2


@pytest.mark.anyio
async def test_a_mention_wakes_within_the_limit_and_not_beyond(world: World) -> None:
    box = await world.computer()
    ada, bob, cy = [await world.agent(h, box) for h in ("ada", "bob", "cy")]
    room = await world.group("three", ada, bob, cy)
    cy_token = await world.token(box, cy)
    await world.ok("PUT", f"/agent/mutes/{room['id']}", json={}, headers=bearer(cy_token))
    await world.ok("PATCH", f"/api/rooms/{room['id']}", json={"agent_hop_limit": 1})
    token = await world.token(box, ada)
    await world.post(room["id"], "ada, ask cy")
    # Within the limit a mention wakes even the muted agent.
    assert sorted(await answer(world, box, ada, token, room["id"], "@cy what do you think?")) == (
        sorted([bob["id"], cy["id"]])
    )
    # Beyond it, it does not.
    assert await answer(world, box, ada, token, room["id"], "@cy hello?") == []
    assert len(await notices(world, room["id"])) == 1


@pytest.mark.anyio
async def test_hop_limit_zero_agents_never_wake_each_other(world: World) -> None:
    box, agents, tokens, room = await pair(world)
    changed = await world.ok("PATCH", f"/api/rooms/{room['id']}", json={"agent_hop_limit": 0})
    assert changed["agent_hop_limit"] == 0
    before = world.cursor()
    await world.post(room["id"], "both of you")
    assert len(world.wakes(box, before)) == 2  # the user still wakes them
    assert await answer(world, box, agents[0], tokens[0], room["id"], "hi") == []
    assert await notices(world, room["id"]) == [
        f"{PAUSED} (1 agent message in a row; this room's hop limit is 0)"
    ]


@pytest.mark.anyio
async def test_the_per_minute_cap_pauses_until_the_user_writes(world: World) -> None:
    box, agents, tokens, room = await pair(world)
    await world.ok(
        "PATCH",
        f"/api/rooms/{room['id']}",
        json={"agent_hop_limit": 100, "agent_rate_limit": 3},
    )
    await world.post(room["id"], "go")
    woke = [
        await answer(world, box, agents[n % 2], tokens[n % 2], room["id"], "hi") for n in range(4)
    ]
    assert [bool(w) for w in woke] == [True, True, True, False]
    assert await notices(world, room["id"]) == [
        f"{PAUSED} (4 agent messages within a minute; this room allows 3)"
    ]
    assert (await world.ok("GET", f"/api/rooms/{room['id']}"))["agents_paused"]["reason"] == "rate"
    # A minute later the cap alone would allow more, but the pause waits for the user.
    world.clock.advance(61)
    assert await answer(world, box, agents[0], tokens[0], room["id"], "hi") == []
    await world.post(room["id"], "go on")
    assert await answer(world, box, agents[1], tokens[1], room["id"], "hi") == [agents[0]["id"]]
    # Messages older than a minute do not count.
    world.clock.advance(61)
    woke = [
        await answer(world, box, agents[n % 2], tokens[n % 2], room["id"], "hi") for n in range(3)
    ]
    assert all(woke)


@pytest.mark.anyio
async def test_a_reminder_in_a_paused_room_still_wakes_its_agent_and_reaches_it(
    world: World,
) -> None:
    box, agents, tokens, room = await pair(world)
    await world.post(room["id"], "go")
    for n in range(5):
        await answer(world, box, agents[n % 2], tokens[n % 2], room["id"], f"reply {n}")
    at = iso(world.clock.now() + timedelta(minutes=30))
    await world.ok(
        "POST",
        "/agent/reminders",
        headers=bearer(tokens[1]),
        status=201,
        json={"room_id": room["id"], "title": "check the build", "at": at},
    )
    before = world.cursor()
    assert (await world.ok("POST", "/api/dev/clock", json={"advance_seconds": 1800}))["fired"]
    assert world.wakes(box, before) == [agents[1]["id"]]
    [entry] = [r for r in await world.unread(box, agents[1]) if r["room"]["id"] == room["id"]]
    assert entry["messages"][-1]["body"] == "Reminder from @bob: check the build"
    # The other agent's claim still stops at the pause; the room stays paused.
    shown = await world.ok("GET", f"/api/rooms/{room['id']}")
    ada_claim = [r for r in await world.unread(box, agents[0]) if r["room"]["id"] == room["id"]]
    assert all(m["seq"] < shown["agents_paused"]["seq"] for r in ada_claim for m in r["messages"])


@pytest.mark.anyio
async def test_a_dm_never_pauses(world: World) -> None:
    box = await world.computer()
    ada = await world.agent("ada", box)
    room = await world.dm(ada)
    token = await world.token(box, ada)
    await world.post(room["id"], "write a lot")
    for n in range(6):
        assert await answer(world, box, ada, token, room["id"], f"part {n}") == []
    shown = await world.ok("GET", f"/api/rooms/{room['id']}")
    assert shown["agents_paused"] is None and shown["agent_messages_in_a_row"] == 6
    assert await notices(world, room["id"]) == []


@pytest.mark.anyio
async def test_a_thread_is_guarded_on_its_own_with_its_groups_limits(world: World) -> None:
    _box, _agents, tokens, room = await pair(world)
    await world.ok("PATCH", f"/api/rooms/{room['id']}", json={"agent_hop_limit": 1})
    root = await world.post(room["id"], "discuss in the thread")
    made = await world.reply(tokens[0], room["id"], "first", thread_of=root["id"])
    thread_id = made.json()["thread_id"]
    await world.reply(tokens[0], room["id"], "@bob join", thread_of=root["id"])
    await world.reply(tokens[0], room["id"], "@bob again", thread_of=root["id"])
    thread = await world.ok("GET", f"/api/rooms/{thread_id}")
    assert thread["agent_hop_limit"] == 1 and thread["agents_paused"]["reason"] == "hops"
    assert (await world.ok("GET", f"/api/rooms/{room['id']}"))["agents_paused"] is None
    refused = await world.client.patch(f"/api/rooms/{thread_id}", json={"agent_hop_limit": 5})
    assert refused.status_code == 422 and "follows its group" in refused.json()["error"]["message"]
    # The user's reply in the thread ends the thread's pause.
    await world.post(room["id"], "ok", thread_of=root["id"])
    assert (await world.ok("GET", f"/api/rooms/{thread_id}"))["agents_paused"] is None


@pytest.mark.anyio
async def test_a_task_handed_between_agents_counts_as_their_message(world: World) -> None:
    box, _agents, tokens, room = await pair(world)
    await world.ok("PATCH", f"/api/rooms/{room['id']}", json={"agent_hop_limit": 1})
    task = await world.ok(
        "POST",
        "/agent/tasks",
        headers=bearer(tokens[0]),
        status=201,
        json={"room_id": room["id"], "title": "ship it", "assignee": "bob"},
    )
    thread = task["thread_id"]
    before = world.cursor()
    await world.ok(
        "POST",
        f"/agent/tasks/{task['number']}/assign",
        headers=bearer(tokens[1]),
        json={"assignee": "ada"},
    )
    # The creation notice woke bob (1 in a row); ada handing it back is the second.
    assert world.wakes(box, before) == []
    assert (await world.ok("GET", f"/api/rooms/{thread}"))["agents_paused"]["reason"] == "hops"
    # The user's task action is the user writing there.
    await world.ok("POST", f"/api/tasks/{task['number']}/assign", json={"assignee": "bob"})
    assert (await world.ok("GET", f"/api/rooms/{thread}"))["agents_paused"] is None


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"agent_hop_limit": -1}, "agent_hop_limit"),
        ({"agent_hop_limit": 101}, "agent_hop_limit"),
        ({"agent_hop_limit": "3"}, "agent_hop_limit"),
        ({"agent_hop_limit": 2.5}, "agent_hop_limit"),
        ({"agent_hop_limit": True}, "agent_hop_limit"),
        ({"agent_rate_limit": 0}, "agent_rate_limit"),
        ({"agent_rate_limit": 601}, "agent_rate_limit"),
    ],
)
async def test_bad_limits_are_refused_and_nothing_is_stored(
    world: World, body: dict[str, Any], reason: str
) -> None:
    _, _, _, room = await pair(world)
    response = await world.client.patch(
        f"/api/rooms/{room['id']}", json={"agent_rate_limit": 30, **body}
    )
    assert response.status_code == 422
    assert reason in response.json()["error"]["message"]
    shown = await world.ok("GET", f"/api/rooms/{room['id']}")
    assert (shown["agent_hop_limit"], shown["agent_rate_limit"]) == (3, 12)
    missing = await world.client.patch(
        "/api/rooms/00000000-0000-4000-8000-000000000000", json={"agent_hop_limit": 1}
    )
    assert missing.status_code == 404


def test_concurrent_agents_on_two_server_processes_get_one_notice(
    request: pytest.FixtureRequest,
) -> None:
    """Two stores on one PostgreSQL database (as two server processes): the count holds."""
    store_location = location_for("postgresql", request)
    clock = Clock(START)
    stores = [Store(store_location, clock), Store(store_location, clock)]
    try:
        one = stores[0]
        computer_id, _ = one.create_computer("box")
        agent_ids = [
            one.create_agent(h, h, "", "m/x", "opencode", computer_id)["id"]
            for h in ("ada", "bob", "cy", "dee")
        ]
        room, _ = one.create_room("group", "crowd", agent_ids)
        one.user_post(room["id"], "go", None)

        def write(store: Store, agent_id: str, handle: str) -> None:
            identity = AgentIdentity(agent_id, handle, computer_id, None)
            for n in range(5):
                while True:
                    try:
                        store.reply(identity, room["id"], f"{handle} {n}", None)
                        break
                    except Held:
                        continue  # it has seen the news now; send again

        threads = [
            threading.Thread(target=write, args=(stores[i % 2], a, h))
            for i, (a, h) in enumerate(zip(agent_ids, ("ada", "bob", "cy", "dee"), strict=True))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        shown = one.get_room(room["id"])
        messages = one.list_messages(room["id"], 0, 1000)
        agent_messages = [m for m in messages if m["author"]["kind"] == "agent"]
        assert len(agent_messages) == 20  # nothing lost
        assert shown["agent_messages_in_a_row"] == 20
        assert [m["seq"] for m in messages if m["body"].startswith(PAUSED)] != []
        assert len([m for m in messages if m["body"].startswith(PAUSED)]) == 1
        assert shown["agents_paused"]["seq"] == agent_messages[3]["seq"]
    finally:
        for store in stores:
            store.close()
