"""The turn binding across `crew-server` processes on one PostgreSQL database (issue 22).

The Computer moves to another process while the one holding the agent's reply is
SIGSTOPped: that process takes the reply late, after the retry turn claimed the same
message elsewhere. The database decides (the claim count), so the late reply is refused
and the retry's own reply is the one answer; a late reply before any newer claim is taken
and acknowledges its turn's room, seen from every process.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import httpx

from crew_harness.waiting import wait_until
from crew_testkit.crew_server_proc import CrewServer
from tests.server.test_postgres_processes import servers  # noqa: F401  (the fixture)


def register(server: CrewServer, headers: dict[str, str], agent_id: str) -> dict[str, Any]:
    """Claim the agent's unread messages through `server` and register a turn for them."""
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as c:
        claim = c.post(f"/computer/agents/{agent_id}/unread", json={})
        claim.raise_for_status()
        rooms = [
            {
                "room_id": r["room"]["id"],
                "from_seq": r["messages"][0]["seq"],
                "to_seq": r["messages"][-1]["seq"],
            }
            for r in claim.json()["rooms"]
        ]
        body = {"rooms": rooms, "input": "in", "engine": "opencode", "model": "m/x"}
        turn = c.post(f"/computer/agents/{agent_id}/turns", json=body)
        turn.raise_for_status()
        return dict(turn.json())


def fail(server: CrewServer, headers: dict[str, str], turn: dict[str, Any]) -> None:
    body = {
        "fence": turn["fence"],
        "status": "failed",
        "failure": {"class": "reply_refused", "reason": "timed out"},
    }
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as c:
        c.post(f"/computer/turns/{turn['turn_id']}/finish", json=body).raise_for_status()


def reply(server: CrewServer, token: str, room_id: str, body: str, turn: dict[str, Any]) -> int:
    headers = {"Authorization": f"Bearer {token}", "Crew-Turn": turn["turn_secret"]}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as c:
        return c.post("/agent/reply", json={"room_id": room_id, "body": body}).status_code


def agent_bodies(server: CrewServer, room_id: str) -> list[str]:
    return [m["body"] for m in server.messages(room_id) if m["author"]["kind"] == "agent"]


def test_a_reply_a_paused_process_takes_after_the_retry_claimed_elsewhere_is_refused(
    servers: list[CrewServer],  # noqa: F811
) -> None:
    a, b, _ = servers
    box = a.create_computer("box")
    agent = a.create_agent("ann", computer_id=box["computer_id"])
    room = a.create_room("dm", [agent["id"]])
    headers = a.connection(box)
    with httpx.Client(base_url=a.url, headers=headers) as c:
        token = c.post(f"/computer/agents/{agent['id']}/token").json()["token"]
    a.post(room["id"], "a question")
    first = register(a, headers, agent["id"])
    os.kill(b.process.pid, signal.SIGSTOP)
    statuses: list[int] = []
    late = threading.Thread(
        target=lambda: statuses.append(reply(b, token, room["id"], "late answer", first))
    )
    try:
        late.start()
        # crew gave up on b; the turn failed and the retry claimed through a.
        fail(a, headers, first)
        second = register(a, headers, agent["id"])
    finally:
        os.kill(b.process.pid, signal.SIGCONT)
    late.join(60)
    assert statuses == [409], statuses  # turn_over: the newer turn has the question
    assert reply(a, token, room["id"], "the answer", second) == 201
    assert agent_bodies(b, room["id"]) == ["the answer"]


def test_a_late_reply_before_any_newer_claim_acks_its_room_for_every_process(
    servers: list[CrewServer],  # noqa: F811
) -> None:
    a, b, c = servers
    box = a.create_computer("box")
    agent = a.create_agent("bea", computer_id=box["computer_id"])
    room = a.create_room("dm", [agent["id"]])
    headers = a.connection(box)
    with httpx.Client(base_url=a.url, headers=headers) as client:
        token = client.post(f"/computer/agents/{agent['id']}/token").json()["token"]
    a.post(room["id"], "a question")
    first = register(a, headers, agent["id"])
    fail(a, headers, first)
    assert reply(b, token, room["id"], "late answer", first) == 201
    wait_until(
        "the room read",
        lambda: {p["room_id"]: p["read_seq"] for p in c.positions(agent["id"])}[room["id"]] == 2,
        10,
    )
    with httpx.Client(base_url=c.url, headers=headers) as client:
        claim = client.post(f"/computer/agents/{agent['id']}/unread", json={})
    assert claim.json()["rooms"] == []
    assert agent_bodies(c, room["id"]) == ["late answer"]
