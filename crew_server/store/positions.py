"""Delivery and read positions, and the claim that hands an agent what it has not seen.

A claim of one room gives the messages after a position, within a bound, and
moves `delivered_seq` to the last one given. The unread claim at the start of a
turn and the HELD answer to a reply that missed messages both claim through
`claim_room`.
"""

from __future__ import annotations

from typing import Any

from crew_server.errors import NotFound
from crew_server.store import budget_holds
from crew_server.store.answered import sweep_running_turns
from crew_server.store.db import StorePart, Transaction
from crew_server.store.identities import connection_epoch, own_agent
from crew_server.store.loop_guard import claim_cut
from crew_server.store.message_view import select_messages
from crew_server.store.rooms import room_view
from crew_server.store.turn_binding import count_claim

# The bound of one unread claim (and of one HELD answer): at most this many messages, and
# no more message text (bodies, and the root message of a thread) than this, except that
# a claim always holds at least one message. The rest comes with the next turn.
CLAIM_MAX_MESSAGES = 200
CLAIM_MAX_CHARS = 256 * 1024


class ClaimBudget:
    """What is left of one claim's bound while rooms are filled in (at least one message)."""

    def __init__(self, messages: int, chars: int) -> None:
        self.messages = messages
        self.chars = chars
        self.taken = 0

    def left(self) -> bool:
        """Whether another room may still get messages."""
        return self.messages > 0 and (self.taken == 0 or self.chars > 0)

    def take(self, messages: list[dict[str, Any]], extra_chars: int) -> list[dict[str, Any]]:
        """The leading messages that fit (`extra_chars`: the room's root message)."""
        self.chars -= extra_chars
        kept: list[dict[str, Any]] = []
        for message in messages:
            size = len(message["body"])
            if self.messages <= 0 or (self.taken > 0 and size > self.chars):
                break
            kept.append(message)
            self.taken += 1
            self.messages -= 1
            self.chars -= size
        return kept


def claim_room(
    tx: Transaction, agent_id: str, room_id: str, after_seq: int, budget: ClaimBudget
) -> tuple[int, dict[str, Any] | None]:
    """Claim a room's messages after `after_seq` that fit `budget` → (delivered seq, entry).

    The entry is `{"room", "messages"}` (None when nothing fits); the agent's
    `delivered_seq` there becomes the last message given, or `after_seq`.
    """
    entry: dict[str, Any] | None = None
    upto = after_seq
    # A room where agents are paused keeps what came from the pause on (store.loop_guard).
    cut = claim_cut(tx, agent_id, room_id)
    if budget.left():
        view = room_view(tx, room_id, agent_id)
        root = view["root_message"]
        messages = budget.take(
            select_messages(
                tx,
                "WHERE m.room_id = ? AND m.seq > ? AND m.seq <= ? ORDER BY m.seq LIMIT ?",
                (room_id, after_seq, cut, budget.messages),
            ),
            len(root["body"]) if root else 0,
        )
        if messages:
            upto = messages[-1]["seq"]
            entry = {"room": view, "messages": messages}
    # An upsert: a reply into a thread the agent does not follow yet has no row.
    tx.execute(
        "INSERT INTO positions (agent_id, room_id, delivered_seq) VALUES (?, ?, ?) "
        "ON CONFLICT (agent_id, room_id) DO UPDATE SET delivered_seq = excluded.delivered_seq",
        (agent_id, room_id, upto),
    )
    return upto, entry


class Positions(StorePart):
    """The unread claim of a turn, and the positions it leaves."""

    def claim_unread(
        self,
        computer_id: str,
        agent_id: str,
        epoch: int | None = None,
        max_messages: int | None = None,
    ) -> tuple[list[dict[str, Any]], bool]:
        """`claim_turn` without why nothing was handed out."""
        rooms, more, _ = self.claim_turn(computer_id, agent_id, epoch, max_messages)
        return rooms, more

    def claim_turn(
        self,
        computer_id: str,
        agent_id: str,
        epoch: int | None = None,
        max_messages: int | None = None,
    ) -> tuple[list[dict[str, Any]], bool, dict[str, Any] | None]:
        """Unread messages (after the read position) of every room the agent follows → (rooms, more).

        Rooms come in the order of their oldest unread message, messages by seq, within the
        claim bound (`CLAIM_MAX_MESSAGES`, `CLAIM_MAX_CHARS`). `delivered_seq` becomes what
        this claim returned: the last message given in a room, the read position in a room
        left out. `more` says the claim was cut; the ack of the turn then wakes the agent.
        `max_messages` narrows the bound (the Computer isolates a message that keeps
        failing); `epoch` is the caller's connection (`Superseded` when replaced).

        `paused` (the third) says why an agent at 100 % of a budget cap got nothing
        (`budget_hold`): its messages stay unread, delivered to no one.
        """
        with self._database.write() as tx:
            own_agent(tx, computer_id, agent_id)
            connection_epoch(tx, computer_id, epoch)
            # The runner claims only between turns: a turn still running lost its end.
            sweep_running_turns(tx, agent_id)
            count_claim(tx, agent_id)
            rooms = tx.execute(
                "SELECT p.room_id, p.read_seq, r.last_seq FROM positions p "
                "JOIN rooms r ON r.id = p.room_id "
                "JOIN messages m ON m.room_id = p.room_id AND m.seq = p.read_seq + 1 "
                "WHERE p.agent_id = ? AND r.last_seq > p.read_seq "
                "ORDER BY m.created_at, p.room_id",
                (agent_id,),
            ).fetchall()
            paused = budget_holds.budget_hold(tx, agent_id, [r["room_id"] for r in rooms])
            if paused is not None:
                return [], False, paused
            limit = self._claim_max_messages
            if max_messages is not None:
                limit = max(1, min(limit, max_messages))
            budget = ClaimBudget(limit, self._claim_max_chars)
            # A new claim starts the HELD bound afresh.
            tx.execute(
                "UPDATE positions SET held_count = 0 WHERE agent_id = ? AND held_count != 0",
                (agent_id,),
            )
            answer: list[dict[str, Any]] = []
            more = False
            for room in rooms:
                upto, entry = claim_room(tx, agent_id, room["room_id"], room["read_seq"], budget)
                end = min(room["last_seq"], claim_cut(tx, agent_id, room["room_id"]))
                more = more or upto < end
                if entry is not None:
                    answer.append(entry)
            tx.execute("UPDATE agents SET claim_more = ? WHERE id = ?", (int(more), agent_id))
            return answer, more, None

    def positions(self, agent_id: str) -> list[dict[str, Any]]:
        """An agent's delivered and read positions per room."""
        with self._database.read() as tx:
            if (
                tx.execute(
                    "SELECT 1 FROM agents WHERE id = ? AND deleted_at IS NULL", (agent_id,)
                ).fetchone()
                is None
            ):
                raise NotFound(f"no agent {agent_id}")
            rows = tx.execute(
                "SELECT room_id, delivered_seq, read_seq FROM positions WHERE agent_id = ? "
                "ORDER BY room_id",
                (agent_id,),
            ).fetchall()
        return [dict(r) for r in rows]
