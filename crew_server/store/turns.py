"""Turns: an agent's runs on its Computer, fenced by the connection epoch, and their events."""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson

from crew_server import rules
from crew_server.errors import Invalid, NotAnswered, NotConnected, NotFound, StaleTurn
from crew_server.store.answered import (
    ENDED_UNACKED,
    ack_answered_rooms,
    answered_every_room,
    sweep_running_turns,
)
from crew_server.store.approval_state import close_turn_approvals
from crew_server.store.budget_holds import budget_after_turn
from crew_server.store.controls import stopped_notice
from crew_server.store.db import StorePart, Transaction, new_id
from crew_server.store.identities import connection_epoch, own_agent
from crew_server.store.messages import post
from crew_server.store.turn_binding import new_turn_secret

TURN_COLS = (
    "id, agent_id, computer_id, fence, status, failure, rooms, input, engine, model, "
    "session_id, usage, gateway_usage, gaps, started_at, finished_at, trace"
)
# The steps of a turn's trace the server itself records (the Computer's come with the finish).
SERVER_TRACE_STEPS = ("reply_received", "reply_stored")


def turn_of(r: sqlite3.Row) -> dict[str, Any]:
    """A turn row (`TURN_COLS`) as the API shows it (JSON columns decoded)."""
    return {
        **dict(r),
        "failure": orjson.loads(r["failure"]) if r["failure"] else None,
        "rooms": orjson.loads(r["rooms"]),
        "usage": orjson.loads(r["usage"]) if r["usage"] else None,
        "gateway_usage": orjson.loads(r["gateway_usage"]) if r["gateway_usage"] else None,
        "gaps": orjson.loads(r["gaps"]),
        "trace": orjson.loads(r["trace"]) if r["trace"] else None,
    }


def merged_trace(stored: str | None, computer: dict[str, int] | None) -> str | None:
    """The Computer's steps with the server's own (the server's win: they are its clock's)."""
    ours: dict[str, int] = orjson.loads(stored) if stored else {}
    if computer is None and not ours:
        return None
    theirs = {k: v for k, v in (computer or {}).items() if k not in SERVER_TRACE_STEPS}
    return orjson.dumps({**theirs, **ours}).decode()


def stored_event(r: sqlite3.Row) -> dict[str, Any]:
    """A `turn_events` row as the API shows it. Data that is not a JSON object (a row
    written by hand, a damaged database) comes as `{"stored": …}` with `malformed`
    saying why: one bad row must not make its whole turn unreadable."""
    event = {"index": r["idx"], "type": r["type"], "at": r["at"]}
    try:
        data = orjson.loads(r["data"])
    except orjson.JSONDecodeError as exc:
        text = str(r["data"])
        return {
            **event,
            "data": {"stored": text[:4000]},
            "malformed": f"its data is not JSON ({exc})",
        }
    if not isinstance(data, dict):
        problem = f"its data is {type(data).__name__}, not an object"
        return {**event, "data": {"stored": data}, "malformed": problem}
    return {**event, "data": data}


def fenced_turn(tx: Transaction, computer_id: str, turn_id: str, fence: int) -> tuple[str, int]:
    """Check a write for a turn carries a live fence: (agent id, next event index)."""
    row = tx.execute(
        "SELECT t.agent_id, t.computer_id, t.fence, t.status, t.next_index, c.epoch "
        "FROM turns t JOIN computers c ON c.id = t.computer_id WHERE t.id = ?",
        (turn_id,),
    ).fetchone()
    if row is None or row["computer_id"] != computer_id:
        raise NotFound(f"no turn {turn_id} on this computer")
    status = row["status"]
    if status != "running":
        raise StaleTurn(f"turn {turn_id} is {status}, no longer running; stop it without acking")
    if fence != row["fence"] or row["epoch"] != row["fence"]:
        raise StaleTurn(
            f"turn {turn_id} belongs to an older connection of this computer; stop it without acking"
        )
    return row["agent_id"], row["next_index"]


def record_gap(tx: Transaction, turn_id: str, from_index: int, to_index: int) -> None:
    """Note events `from_index..to_index` (inclusive) of a turn as lost on the way."""
    gaps = orjson.loads(
        tx.execute("SELECT gaps FROM turns WHERE id = ?", (turn_id,)).fetchone()["gaps"]
    )
    gaps.append({"from_index": from_index, "to_index": to_index})
    tx.execute("UPDATE turns SET gaps = ? WHERE id = ?", (orjson.dumps(gaps).decode(), turn_id))


def mark_set_aside(tx: Transaction, agent_id: str, turn_id: str, reason: str) -> None:
    """Mark read the messages of the turn's claim (and nothing else), with one notice per
    room saying the agent gave up on them, and why.

    Only the turn's own range moves: a message that reached the agent later (a HELD
    answer during the turn moved `delivered_seq` past the claim) stays unread, so a
    later turn answers it (issue 20). The notice wakes nobody, and the agent itself
    skips it when it follows the range at once: a notice about its own failure is no
    work for it.
    """
    handle = tx.execute("SELECT handle FROM agents WHERE id = ?", (agent_id,)).fetchone()["handle"]
    rooms = orjson.loads(
        tx.execute("SELECT rooms FROM turns WHERE id = ?", (turn_id,)).fetchone()["rooms"]
    )
    for room in rooms:
        upto = int(room["to_seq"])
        count = max(1, upto - int(room["from_seq"]) + 1)
        notice = post(tx, room["room_id"], None, rules.set_aside_notice(handle, count, reason))
        if notice["seq"] == upto + 1:
            upto = notice["seq"]
        tx.execute(
            "UPDATE positions SET read_seq = CASE WHEN read_seq < ? THEN ? ELSE read_seq END, "
            "delivered_seq = CASE WHEN delivered_seq < ? THEN ? ELSE delivered_seq END "
            "WHERE agent_id = ? AND room_id = ?",
            (upto, upto, upto, upto, agent_id, room["room_id"]),
        )


class Turns(StorePart):
    """Registering, feeding, finishing and acking turns; reading them back."""

    def register_turn(
        self,
        computer_id: str,
        agent_id: str,
        rooms: list[dict[str, Any]],
        input_text: str,
        engine: str,
        model: str,
        session_id: str | None,
        epoch: int | None = None,
    ) -> dict[str, Any]:
        """Record a running turn of an agent of this Computer → `{turn_id, fence, turn_secret}`.

        The fence is the caller's connection epoch (`Superseded` when a newer one exists).
        The secret is the turn's identity, for its `crew` only (`store.turn_binding`).
        """
        turn_id = new_id()
        with self._database.write() as tx:
            own_agent(tx, computer_id, agent_id)
            epoch = connection_epoch(tx, computer_id, epoch)
            if epoch == 0:
                raise NotConnected(
                    "this computer has not connected; call POST /computer/connect first"
                )
            # Turns of one agent never overlap: one still `running` when the next is
            # registered lost its end (the finish never arrived, or the answer to its
            # registration was lost). Without this it would stay running forever.
            sweep_running_turns(tx, agent_id)
            secret, secret_hash = new_turn_secret()
            tx.execute(
                "INSERT INTO turns (id, agent_id, computer_id, fence, status, rooms, input, engine, "
                "model, session_id, started_at, secret_hash, claim_no) "
                "VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, "
                "(SELECT claims FROM agents WHERE id = ?))",
                (
                    turn_id,
                    agent_id,
                    computer_id,
                    epoch,
                    orjson.dumps(rooms).decode(),
                    input_text,
                    engine,
                    model,
                    session_id,
                    tx.now(),
                    secret_hash,
                    agent_id,
                ),
            )
        return {"turn_id": turn_id, "fence": epoch, "turn_secret": secret}

    def add_events(
        self,
        computer_id: str,
        turn_id: str,
        fence: int,
        first_index: int,
        events: list[dict[str, Any]],
    ) -> None:
        """Append a batch of events (`type`, `at`, `data_json`); a jump past the next index
        records the gap."""
        with self._database.write() as tx:
            _, next_index = fenced_turn(tx, computer_id, turn_id, fence)
            if first_index > next_index:
                record_gap(tx, turn_id, next_index, first_index - 1)
            tx.executemany(
                "INSERT INTO turn_events (turn_id, idx, type, at, data) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                [
                    (turn_id, first_index + i, e["type"], e["at"], e["data_json"])
                    for i, e in enumerate(events)
                ],
            )
            tx.execute(
                "UPDATE turns SET next_index = CASE WHEN next_index > ? THEN next_index ELSE ? END "
                "WHERE id = ?",
                (first_index + len(events), first_index + len(events), turn_id),
            )

    def finish_turn(
        self,
        computer_id: str,
        turn_id: str,
        fence: int,
        status: str,
        failure: dict[str, Any] | None,
        usage: dict[str, Any] | None,
        event_count: int | None = None,
        input_text: str | None = None,
        gateway_usage: dict[str, Any] | None = None,
        trace: dict[str, int] | None = None,
    ) -> None:
        """Record a turn's result; usage summed from `step_finish` events when absent.
        `gateway_usage` is what the Computer's model gateway counted (None: it ran none).
        `trace` is the Computer's part of the turn's trace (step → epoch ms), kept with
        the server's own steps (`note_reply`).

        `event_count` is how many events the turn produced: a tail the server never got
        (the Computer could not send it) is recorded as a gap. `input_text`, when given,
        replaces the registered input (the engine had to start a new session).
        """
        with self._database.write() as tx:
            _, next_index = fenced_turn(tx, computer_id, turn_id, fence)
            if event_count is not None and event_count > next_index:
                record_gap(tx, turn_id, next_index, event_count - 1)
            if usage is None:
                events = [
                    {"type": r["type"], "data": orjson.loads(r["data"])}
                    for r in tx.execute(
                        "SELECT type, data FROM turn_events WHERE turn_id = ? AND type = 'step_finish'",
                        (turn_id,),
                    )
                ]
                usage = rules.usage_from_events(events)
            stored_trace = tx.execute(
                "SELECT trace FROM turns WHERE id = ?", (turn_id,)
            ).fetchone()["trace"]
            tx.execute(
                "UPDATE turns SET status = ?, failure = ?, usage = ?, gateway_usage = ?, "
                "finished_at = ?, input = COALESCE(?, input), trace = ? WHERE id = ?",
                (
                    status,
                    orjson.dumps(failure).decode() if failure else None,
                    orjson.dumps(usage).decode(),
                    orjson.dumps(gateway_usage).decode() if gateway_usage is not None else None,
                    tx.now(),
                    input_text,
                    merged_trace(stored_trace, trace),
                    turn_id,
                ),
            )
            budget_after_turn(tx, turn_id)
            close_turn_approvals(tx, [turn_id])
            if status in ENDED_UNACKED:
                agent_id = tx.execute(
                    "SELECT agent_id FROM turns WHERE id = ?", (turn_id,)
                ).fetchone()["agent_id"]
                ack_answered_rooms(tx, agent_id, turn_id)
            if status == "cancelled":
                stopped_notice(tx, turn_id)

    def ack(
        self,
        computer_id: str,
        agent_id: str,
        turn_id: str,
        fence: int,
        set_aside: str | None = None,
        *,
        only_if_answered: bool = False,
    ) -> None:
        """Read := delivered in every room of the agent (the turn handled what it was given).

        With `set_aside` (a reason), the turn could not handle its messages and the
        Computer gives up on them: the messages of the turn's claim — only those — are
        marked read, and each room of the turn gets a notice saying so, so the user
        knows they were not answered (`mark_set_aside`).
        """
        with self._database.write() as tx:
            own_agent(tx, computer_id, agent_id)
            turn_agent, _ = fenced_turn(tx, computer_id, turn_id, fence)
            if turn_agent != agent_id:
                raise Invalid(f"turn {turn_id} is not a turn of agent {agent_id}")
            if only_if_answered and not answered_every_room(tx, agent_id, turn_id):
                raise NotAnswered(
                    f"agent {agent_id} did not reply in every room of turn {turn_id}; "
                    "its messages stay unread"
                )
            if set_aside is not None:
                mark_set_aside(tx, agent_id, turn_id, set_aside)
            else:
                tx.execute(
                    "UPDATE positions SET read_seq = delivered_seq "
                    "WHERE agent_id = ? AND read_seq != delivered_seq",
                    (agent_id,),
                )
            # The turn's claim was cut at its bound: wake the agent for the rest.
            if tx.execute(
                "UPDATE agents SET claim_more = 0 WHERE id = ? AND claim_more = 1", (agent_id,)
            ).rowcount:
                tx.wake([agent_id])

    def list_turns(self, agent_id: str | None, limit: int) -> list[dict[str, Any]]:
        """Turns without events, newest first (of one agent when given)."""
        with self._database.read() as tx:
            if agent_id is None:
                rows = tx.execute(
                    f"SELECT {TURN_COLS} FROM turns ORDER BY started_at DESC, rowid DESC LIMIT ?",
                    (limit,),
                ).fetchall()
            else:
                rows = tx.execute(
                    f"SELECT {TURN_COLS} FROM turns WHERE agent_id = ? "
                    "ORDER BY started_at DESC, rowid DESC LIMIT ?",
                    (agent_id, limit),
                ).fetchall()
        return [turn_of(r) for r in rows]

    def get_turn(self, turn_id: str, from_index: int = 0) -> dict[str, Any]:
        """A turn with its events in index order (those from `from_index` on: a page
        following a running turn reads only what is new)."""
        with self._database.read() as tx:
            row = tx.execute(f"SELECT {TURN_COLS} FROM turns WHERE id = ?", (turn_id,)).fetchone()
            if row is None:
                raise NotFound(f"no turn {turn_id}")
            events = [
                stored_event(e)
                for e in tx.execute(
                    "SELECT idx, type, at, data FROM turn_events WHERE turn_id = ? AND idx >= ? "
                    "ORDER BY idx",
                    (turn_id, from_index),
                )
            ]
        return {**turn_of(row), "events": events}
