"""Messages: posting (by the user, an agent, or the system as a notice), threads, replies."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson

from crew_server import rules
from crew_server.errors import Held, Invalid, NotFound, Refused
from crew_server.store import loop_guard
from crew_server.store.answered import ack_if_late
from crew_server.store.db import StorePart, Transaction, new_id
from crew_server.store.identities import USER, Actor, AgentIdentity
from crew_server.store.message_view import select_messages
from crew_server.store.positions import ClaimBudget, claim_room
from crew_server.store.rooms import members, require_member, room_row
from crew_server.store.turn_binding import note_reply, refuse_if_superseded


def open_thread(tx: Transaction, message_id: str) -> tuple[str, bool]:
    """The thread hanging off a message, created when missing: (thread id, created).

    A message inside a thread names that thread (threads do not nest).
    """
    row = tx.execute(
        "SELECT m.room_id, m.thread_id, m.author_kind, m.author_id, r.kind AS room_kind "
        "FROM messages m JOIN rooms r ON r.id = m.room_id WHERE m.id = ?",
        (message_id,),
    ).fetchone()
    if row is None:
        raise NotFound(f"no message {message_id}")
    room_id, room_kind = row["room_id"], row["room_kind"]
    if room_kind == "thread":
        return room_id, False
    if row["thread_id"] is not None:
        return row["thread_id"], False
    thread_id = new_id()
    tx.execute(
        "INSERT INTO rooms (id, kind, parent_room_id, root_message_id, created_at) "
        "VALUES (?, 'thread', ?, ?, ?)",
        (thread_id, room_id, message_id, tx.now()),
    )
    tx.execute("UPDATE messages SET thread_id = ? WHERE id = ?", (thread_id, message_id))
    # The root's author follows the thread from the start; in a dm (a task's thread),
    # so does its agent: everything in a dm is for it.
    followers = {row["author_id"]} if row["author_kind"] == "agent" else set()
    if room_kind == "dm":
        followers.update(
            r["agent_id"]
            for r in tx.execute("SELECT agent_id FROM room_members WHERE room_id = ?", (room_id,))
        )
    tx.executemany(
        "INSERT INTO positions (agent_id, room_id) VALUES (?, ?) ON CONFLICT DO NOTHING",
        [(a, thread_id) for a in sorted(followers)],
    )
    return thread_id, True


# A reply is held at most this many times in a row in one room; the next one is posted.
HELD_LIMIT = 2


def post(
    tx: Transaction,
    room_id: str,
    author: Actor | None,
    body: str,
    *,
    notice_wakes: Sequence[str] | None = None,
    caused_by: Actor | None = None,
) -> dict[str, Any]:
    """Append a message (a notice when `author` is None) and wake whoever it concerns.

    `caused_by`: the actor whose action the notice reports (a task claimed, moved...). An
    agent has seen the notice of its own action, so it does not hold the agent's next reply
    (upstream.md "HELD": messages *from others*) — when the agent had seen everything before.
    """
    now = tx.now()
    room = room_row(tx, room_id)
    rid, kind = room["id"], room["kind"]
    seq = tx.execute(
        "UPDATE rooms SET last_seq = last_seq + 1 WHERE id = ? RETURNING last_seq", (rid,)
    ).fetchone()["last_seq"]
    mentions: list[str] = []
    people: list[tuple[str, str, str]] = []
    if author is not None:
        people = members(tx, rid)
        mentions = rules.mentioned_ids(body, {h: a for a, h, _ in people})
    message_id = new_id()
    author_kind, author_id = ("system", "system") if author is None else (author.kind, author.id)
    tx.execute(
        "INSERT INTO messages (id, room_id, seq, author_kind, author_id, body, kind, mentions, "
        "created_at, turn_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            message_id,
            rid,
            seq,
            author_kind,
            author_id,
            body,
            "normal" if author is not None else "notice",
            orjson.dumps(mentions).decode(),
            now,
            author.turn_id if author is not None else None,
        ),
    )
    if kind == "thread":
        tx.execute(
            "UPDATE messages SET thread_replies = thread_replies + 1, thread_last_at = ? "
            "WHERE id = ?",
            (now, room["root_message_id"]),
        )
    if author is not None and author.kind == "agent":
        # The author has seen its own message; with nothing pending it is read too.
        tx.execute(
            "INSERT INTO positions (agent_id, room_id, delivered_seq, read_seq) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (agent_id, room_id) DO UPDATE SET "
            "read_seq = CASE WHEN positions.read_seq = positions.delivered_seq "
            "THEN excluded.read_seq ELSE positions.read_seq END, "
            "delivered_seq = excluded.delivered_seq",
            (author.id, rid, seq, seq),
        )
    if author is None and caused_by is not None and caused_by.kind == "agent":
        _seen_own_notice(tx, caused_by.id, rid, seq)
    pause_notice = None
    if author is None:
        woken = list(dict.fromkeys(notice_wakes or ()))
    else:
        woken = rules.woken_by_message(
            _room_facts(tx, rid, kind, people, mentions, now), author.id, mentions
        )
    woken, pause_notice = _loop_guard(tx, rid, seq, author or caused_by, woken)
    if woken and kind == "thread":
        # Whoever a thread message wakes must also get it at the next unread claim.
        tx.executemany(
            "INSERT INTO positions (agent_id, room_id) VALUES (?, ?) ON CONFLICT DO NOTHING",
            [(a, rid) for a in woken],
        )
    tx.wake(woken)
    message = select_messages(tx, "WHERE m.id = ?", (message_id,))[0]
    if pause_notice is not None:
        post(tx, rid, None, pause_notice)
    return message


def _loop_guard(
    tx: Transaction, rid: str, seq: int, actor: Actor | None, woken: list[str]
) -> tuple[list[str], str | None]:
    """Whom the message at `seq` wakes under the room's loop guard, and the notice of the
    pause it starts (`store.loop_guard`). `actor`: its author, or whose action a notice
    reports (None: a reminder, a set-aside notice, the guard's own notice)."""
    if actor is None:
        loop_guard.release_to(tx, rid, seq, woken)
        return woken, None
    if actor.kind != "agent":
        loop_guard.user_wrote(tx, rid)
        return woken, None
    # A notice of an agent's action (a task handed on) counts as that agent's message.
    facts = loop_guard.loop_facts(tx, rid, seq)
    allowed, pause = rules.guarded_wakes(woken, facts)
    loop_guard.agent_wrote(tx, rid, seq, pause)
    return allowed, rules.loop_pause_notice(pause, facts) if pause else None


def _seen_own_notice(tx: Transaction, agent_id: str, room_id: str, seq: int) -> None:
    """Count the notice at `seq` as delivered (and read, when caught up) to the agent whose
    action posted it — only when it had seen everything before it: earlier unseen messages
    stay unseen, and then HELD shows them with this notice."""
    if seq == 1:
        tx.execute(
            "INSERT INTO positions (agent_id, room_id, delivered_seq, read_seq) "
            "VALUES (?, ?, 1, 1) ON CONFLICT DO NOTHING",
            (agent_id, room_id),
        )
        return
    tx.execute(
        "UPDATE positions SET delivered_seq = ?, read_seq = CASE WHEN read_seq = delivered_seq "
        "THEN ? ELSE read_seq END WHERE agent_id = ? AND room_id = ? AND delivered_seq = ?",
        (seq, seq, agent_id, room_id, seq - 1),
    )


def _room_facts(
    tx: Transaction,
    rid: str,
    kind: str,
    people: list[tuple[str, str, str]],
    mentions: list[str],
    now: str,
) -> rules.RoomFacts:
    """Who a message in the room may wake: a thread's followers (the mentioned join them),
    else the room's members less those who muted it."""
    if kind == "thread":
        tx.executemany(
            "INSERT INTO positions (agent_id, room_id) VALUES (?, ?) ON CONFLICT DO NOTHING",
            [(a, rid) for a in mentions],
        )
        followers = frozenset(
            r["agent_id"]
            for r in tx.execute("SELECT agent_id FROM positions WHERE room_id = ?", (rid,))
        )
        return rules.RoomFacts("thread", followers, frozenset())
    muted = (
        frozenset(
            r["agent_id"]
            for r in tx.execute(
                "SELECT agent_id FROM mutes WHERE room_id = ? AND (until IS NULL OR until > ?)",
                (rid, now),
            )
        )
        if kind == "group"
        else frozenset()
    )
    return rules.RoomFacts(kind, frozenset(a for a, _, _ in people), muted)


def check_thread_of(tx: Transaction, room_id: str, message_id: str) -> str:
    """`thread_of` must name a message of a group, in `room_id` (or its thread)."""
    row = tx.execute(
        "SELECT m.room_id, m.thread_id, r.kind FROM messages m "
        "JOIN rooms r ON r.id = m.room_id WHERE m.id = ?",
        (message_id,),
    ).fetchone()
    if row is None:
        raise NotFound(f"no message {message_id}")
    message_room, kind = row["room_id"], row["kind"]
    if room_id not in (message_room, row["thread_id"]):
        raise Invalid(f"message {message_id} is not in room {room_id}")
    if kind == "dm":
        raise Refused(
            "threads hang off group messages; in a direct conversation reply without "
            f"--thread (crew reply {message_room})"
        )
    if kind == "thread":
        raise Refused(
            f"threads do not nest; to answer in this thread reply with crew reply {message_room}"
        )
    return message_id


class Messages(StorePart):
    """Reading a room's messages; the user's posts and the agents' replies."""

    def list_messages(self, room_id: str, after_seq: int, limit: int) -> list[dict[str, Any]]:
        """A room's messages after `after_seq`, by seq, at most `limit`."""
        with self._database.read() as tx:
            room_row(tx, room_id)
            return select_messages(
                tx,
                "WHERE m.room_id = ? AND m.seq > ? ORDER BY m.seq LIMIT ?",
                (room_id, after_seq, limit),
            )

    def list_messages_before(
        self, room_id: str, before_seq: int | None, limit: int
    ) -> list[dict[str, Any]]:
        """A page of a room's messages: the newest `limit` before `before_seq` (None: the
        newest), oldest first. Reads only the page, so a long room opens as fast as a short one."""
        with self._database.read() as tx:
            room_row(tx, room_id)
            page = select_messages(
                tx,
                "WHERE m.room_id = ? AND m.seq < ? ORDER BY m.seq DESC LIMIT ?",
                (room_id, 2**53 if before_seq is None else before_seq, limit),
            )
        page.reverse()
        return page

    def threads_active_since(self, room_id: str, since: str) -> list[dict[str, Any]]:
        """The room's messages whose thread got a reply after `since` (a stored time)."""
        with self._database.read() as tx:
            return select_messages(
                tx,
                "WHERE m.room_id = ? AND m.thread_last_at > ? ORDER BY m.seq",
                (room_id, since),
            )

    def get_message(self, message_id: str) -> dict[str, Any]:
        """One message."""
        with self._database.read() as tx:
            found = select_messages(tx, "WHERE m.id = ?", (message_id,))
        if not found:
            raise NotFound(f"no message {message_id}")
        return found[0]

    def user_post(self, room_id: str, body: str, thread_of: str | None) -> dict[str, Any]:
        """The user posts in a room, or in the thread of `thread_of` (created when missing)."""
        with self._database.write() as tx:
            room_row(tx, room_id)
            target = room_id
            if thread_of is not None:
                target, _ = open_thread(tx, check_thread_of(tx, room_id, thread_of))
            return post(tx, target, USER, body)

    def reply(
        self,
        agent: AgentIdentity,
        room_id: str,
        body: str,
        thread_of: str | None,
        received_at: datetime | None = None,
    ) -> dict[str, Any]:
        """An agent's reply; raises Held (after recording delivery) when it missed messages.
        `received_at`: when the request reached the server (its turn's trace)."""
        received_at = received_at or self.clock.now()
        held: list[dict[str, Any]] | None = None
        with self._database.write() as tx:
            require_member(tx, room_id, agent.agent_id)
            # Checked in the reply's own transaction: a claim committing meanwhile wins.
            refuse_if_superseded(tx, agent.turn_id)
            target, thread_id = room_id, None
            if thread_of is not None:
                target, _ = open_thread(tx, check_thread_of(tx, room_id, thread_of))
                thread_id = target
            row = tx.execute(
                "SELECT delivered_seq, held_count FROM positions WHERE agent_id = ? AND room_id = ?",
                (agent.agent_id, target),
            ).fetchone()
            delivered = row["delivered_seq"] if row is not None else 0
            held_before = row["held_count"] if row is not None else 0
            unseen_sql = (
                "SELECT 1 FROM messages WHERE room_id = ? AND seq > ? AND seq <= ? "
                "AND NOT (author_kind = 'agent' AND author_id = ?) LIMIT 1"
            )
            # Messages a paused room holds back (store.loop_guard) do not hold the reply;
            # like the unseen ones of a reply held twice, they stay undelivered.
            cut = loop_guard.claim_cut(tx, agent.agent_id, target)
            unseen = tx.execute(unseen_sql, (target, delivered, cut, agent.agent_id)).fetchone()
            withheld = (
                cut != loop_guard.NO_CUT
                and tx.execute(
                    unseen_sql, (target, max(delivered, cut), loop_guard.NO_CUT, agent.agent_id)
                ).fetchone()
                is not None
            )
            if unseen is not None and held_before < HELD_LIMIT:
                budget = ClaimBudget(self._claim_max_messages, self._claim_max_chars)
                _, entry = claim_room(tx, agent.agent_id, target, delivered, budget)
                tx.execute(
                    "UPDATE positions SET held_count = held_count + 1 "
                    "WHERE agent_id = ? AND room_id = ?",
                    (agent.agent_id, target),
                )
                # A fresh budget always takes the first unseen message: entry is set.
                held = [entry] if entry is not None else []
                tx.effective = False  # nothing posted: the same request may post later
            else:
                actor = Actor("agent", agent.agent_id, agent.handle, agent.turn_id)
                message = post(tx, target, actor, body)
                # Held twice already (under steady traffic it would be held forever): it
                # is posted with what the agent has seen, and the messages it has not
                # seen stay undelivered, so its next turn gets them.
                tx.execute(
                    "UPDATE positions SET held_count = 0 WHERE agent_id = ? AND room_id = ?",
                    (agent.agent_id, target),
                )
                ack_if_late(tx, agent.agent_id, agent.turn_id)
                note_reply(tx, agent.turn_id, received_at, self.clock.now())
                if unseen is not None or withheld:
                    tx.execute(
                        "UPDATE positions SET delivered_seq = ?, "
                        "read_seq = CASE WHEN read_seq < ? THEN read_seq ELSE ? END "
                        "WHERE agent_id = ? AND room_id = ?",
                        (delivered, delivered, delivered, agent.agent_id, target),
                    )
        if held is not None:
            raise Held(agent.agent_id, held)
        answer = {"message_id": message["id"], "room_id": room_id}
        if thread_id is not None:
            answer["thread_id"] = thread_id
        return answer
