"""Deleting agents, rooms and Computers; renaming a group and changing its members (issue 25).

Agents and Computers are deleted softly (migration 014): turns and approvals name them,
and a turn's history should outlive its agent. A deleted one vanishes from every list
(`deleted_at IS NULL` in `identities`), its tokens stop working, and a deleted agent's
handle is freed (`~<id>`, which no handle can be) while its name stays on its messages in
groups. Rooms are deleted for good, with their threads, messages, tasks, reminders,
positions and mutes: nothing else refers to a room once its approvals are gone.

Each operation is one write transaction, so a deletion is never half done. What the
Computers must hear comes with it: `agents` (an agent left them: the runner stops and its
running turn with it) and, for a deleted Computer, a wake of its open event stream, which
ends (`api.stream`) so that the Computer reconnects, is refused (401) and stops with the
reason.
"""

from __future__ import annotations

from typing import Any

from crew_server.errors import Invalid, NotFound
from crew_server.store.answered import ack_answered_rooms
from crew_server.store.approval_state import close_turn_approvals, nudge
from crew_server.store.db import StorePart, Transaction
from crew_server.store.rooms import room_row, room_view

AGENT_DELETED = "the turn ended (its agent was deleted)"
COMPUTER_DELETED = "the turn ended (its Computer was deleted)"
ROOM_DELETED = "the room was deleted"


def live_agent(tx: Transaction, agent_id: str) -> Any:
    """The row of an agent that is not deleted; NotFound otherwise."""
    row = tx.execute(
        "SELECT id, handle, name, computer_id FROM agents WHERE id = ? AND deleted_at IS NULL",
        (agent_id,),
    ).fetchone()
    if row is None:
        raise NotFound(f"no agent {agent_id}")
    return row


def live_computer(tx: Transaction, computer_id: str) -> Any:
    """The row of a Computer that is not deleted; NotFound otherwise."""
    row = tx.execute(
        "SELECT id, name FROM computers WHERE id = ? AND deleted_at IS NULL", (computer_id,)
    ).fetchone()
    if row is None:
        raise NotFound(f"no computer {computer_id}")
    return row


def room_and_threads(tx: Transaction, room_id: str) -> list[str]:
    """The room's id and its threads' (the threads first: they point at the room)."""
    threads = [
        str(r["id"])
        for r in tx.execute("SELECT id FROM rooms WHERE parent_room_id = ?", (room_id,))
    ]
    return [*threads, room_id]


def marks(ids: list[str]) -> str:
    """`?, ?, …` for an `IN (…)` of `ids`."""
    return ", ".join("?" * len(ids))


def delete_room_rows(tx: Transaction, room_id: str) -> None:
    """Delete a dm or group with its threads and everything in them.

    A pending approval card in it ends `expired` first (its Computer's wait hears that),
    then goes with the room; the agents stay, their turns too (a turn's `rooms` is text).
    """
    ids = room_and_threads(tx, room_id)
    where = f"room_id IN ({marks(ids)})"
    closed = tx.execute(
        f"UPDATE approvals SET state = 'expired', reason = ?, decided_at = ? "
        f"WHERE state = 'pending' AND {where} RETURNING computer_id",
        (ROOM_DELETED, tx.now(), *ids),
    ).fetchall()
    nudge(tx, {str(r["computer_id"]) for r in closed})
    tx.execute(f"DELETE FROM approvals WHERE {where}", ids)
    tx.execute(f"DELETE FROM tasks WHERE {where} OR thread_id IN ({marks(ids)})", [*ids, *ids])
    for table in ("reminders", "mutes", "positions", "room_members", "user_reads", "messages"):
        tx.execute(f"DELETE FROM {table} WHERE {where}", ids)
    for rid in ids:
        tx.execute("DELETE FROM rooms WHERE id = ?", (rid,))


def leave_room(tx: Transaction, agent_id: str, room_id: str) -> None:
    """The agent is no member of the group any more: nothing there wakes it (its positions,
    mutes and reminders in the group and its threads go); its messages stay."""
    ids = room_and_threads(tx, room_id)
    tx.execute("DELETE FROM room_members WHERE room_id = ? AND agent_id = ?", (room_id, agent_id))
    for table in ("positions", "mutes", "reminders"):
        tx.execute(
            f"DELETE FROM {table} WHERE agent_id = ? AND room_id IN ({marks(ids)})",
            (agent_id, *ids),
        )


def join_room(tx: Transaction, agent_id: str, room_id: str) -> None:
    """The agent becomes a member of the group. It starts at the room's newest message:
    what was said before it joined wakes nobody (it can read it with `crew read`)."""
    last_seq = tx.execute("SELECT last_seq FROM rooms WHERE id = ?", (room_id,)).fetchone()
    tx.execute("INSERT INTO room_members VALUES (?, ?)", (room_id, agent_id))
    tx.execute(
        "INSERT INTO positions (agent_id, room_id, delivered_seq, read_seq) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (agent_id, room_id) DO NOTHING",
        (agent_id, room_id, last_seq["last_seq"], last_seq["last_seq"]),
    )


def group_only(tx: Transaction, room_id: str) -> None:
    """Invalid (422, why) unless the room is a group: a dm is the user and one agent, a
    thread follows its group."""
    kind = room_row(tx, room_id)["kind"]
    if kind == "dm":
        raise Invalid(
            "a dm is between you and one agent: it has no name to change and its members "
            "stay; make a group for several agents"
        )
    if kind == "thread":
        raise Invalid("a thread follows its group: rename the group or change its members")


class Removals(StorePart):
    """Deleting agents, rooms and Computers; a group's name and members."""

    def delete_agent(self, agent_id: str) -> None:
        """Delete an agent: its dm goes, its messages in groups stay (with its name).

        Its tokens stop working, it leaves every group (positions, mutes, reminders go),
        its tasks are unassigned, its running turn ends `cancelled` (the Computer's stop
        then meets a stale turn) and its Computer hears `agents`, so the runner stops.
        """
        with self._database.write() as tx:
            agent = live_agent(tx, agent_id)
            dms = tx.execute(
                "SELECT r.id FROM rooms r JOIN room_members rm ON rm.room_id = r.id "
                "WHERE r.kind = 'dm' AND rm.agent_id = ?",
                (agent_id,),
            ).fetchall()
            for dm in dms:
                delete_room_rows(tx, str(dm["id"]))
            running = tx.execute(
                "UPDATE turns SET status = 'cancelled', finished_at = ? "
                "WHERE agent_id = ? AND status = 'running' RETURNING id",
                (tx.now(), agent_id),
            ).fetchall()
            close_turn_approvals(tx, [str(t["id"]) for t in running], AGENT_DELETED)
            for table in (
                "agent_tokens",
                "room_members",
                "positions",
                "mutes",
                "reminders",
                "agent_writes",
                "budget_notices",
            ):
                tx.execute(f"DELETE FROM {table} WHERE agent_id = ?", (agent_id,))
            tx.execute("UPDATE tasks SET assignee_id = NULL WHERE assignee_id = ?", (agent_id,))
            tx.execute(
                "UPDATE agents SET deleted_at = ?, handle = ?, computer_id = NULL, "
                "problem = NULL, budget_held_until = NULL WHERE id = ?",
                (tx.now(), f"~{agent_id}", agent_id),
            )
            if agent["computer_id"] is not None:
                tx.emit(agent["computer_id"], "agents", {"agent_id": agent_id})

    def delete_room(self, room_id: str) -> None:
        """Delete a dm or a group with its threads, messages, tasks, reminders, positions
        and mutes (its agents stay). A thread goes only with its group."""
        with self._database.write() as tx:
            if room_row(tx, room_id)["kind"] == "thread":
                raise Invalid("a thread goes with its group: delete the group")
            delete_room_rows(tx, room_id)

    def delete_computer(self, computer_id: str) -> None:
        """Delete a Computer: its token is revoked (401 from now on), its agents' tokens
        too, its agents are left without a Computer, its running turns end `interrupted`
        (what they answered is read, as after a crash), and its open event stream ends."""
        with self._database.write() as tx:
            live_computer(tx, computer_id)
            now = tx.now()
            lost = tx.execute(
                "UPDATE turns SET status = 'interrupted', finished_at = ? "
                "WHERE computer_id = ? AND status = 'running' RETURNING id, agent_id",
                (now, computer_id),
            ).fetchall()
            for turn in lost:
                ack_answered_rooms(tx, str(turn["agent_id"]), str(turn["id"]))
            close_turn_approvals(tx, [str(t["id"]) for t in lost], COMPUTER_DELETED)
            tx.execute("DELETE FROM agent_tokens WHERE computer_id = ?", (computer_id,))
            tx.execute("UPDATE agents SET computer_id = NULL WHERE computer_id = ?", (computer_id,))
            # A new epoch fences every request of the old connection; the nudge wakes its
            # open stream, which sees the change and ends (`computer_revoked`).
            tx.execute(
                "UPDATE computers SET deleted_at = ?, epoch = epoch + 1 WHERE id = ?",
                (now, computer_id),
            )
            nudge(tx, {computer_id})

    def computer_revoked(self, computer_id: str) -> str | None:
        """Why a Computer's token no longer works (it was deleted), or None."""
        with self._database.read() as tx:
            row = tx.execute(
                "SELECT name, deleted_at FROM computers WHERE id = ?", (computer_id,)
            ).fetchone()
        if row is None or row["deleted_at"] is None:
            return None
        return revoked_reason(row["name"], row["deleted_at"])

    def update_room(
        self, room_id: str, title: str | None, agent_ids: list[str] | None
    ) -> dict[str, Any]:
        """Rename a group (`title`, the rules of `create_room`) and/or make `agent_ids` its
        members (None: unchanged). A removed agent stops being woken there (`leave_room`),
        an added one starts at the newest message (`join_room`). A dm or a thread: Invalid."""
        with self._database.write() as tx:
            group_only(tx, room_id)
            if title is not None:
                if not title.strip():
                    raise Invalid("a group needs a title")
                tx.execute("UPDATE rooms SET title = ? WHERE id = ?", (title, room_id))
            if agent_ids is not None:
                wanted = list(dict.fromkeys(agent_ids))
                for agent_id in wanted:
                    live_agent(tx, agent_id)
                current = {
                    str(r["agent_id"])
                    for r in tx.execute(
                        "SELECT agent_id FROM room_members WHERE room_id = ?", (room_id,)
                    )
                }
                for agent_id in sorted(current - set(wanted)):
                    leave_room(tx, agent_id, room_id)
                for agent_id in wanted:
                    if agent_id not in current:
                        join_room(tx, agent_id, room_id)
            return room_view(tx, room_id, None)

    def removal_preview(self, kind: str, item_id: str) -> dict[str, int]:
        """What deleting an agent, a room or a Computer takes with it, counted (for the
        confirmation page): messages, threads, tasks, reminders, agents, groups."""
        with self._database.read() as tx:
            if kind == "agent":
                return agent_preview(tx, item_id)
            if kind == "room":
                return room_preview(tx, item_id)
            live_computer(tx, item_id)
            return {"agents": count(tx, "agents WHERE computer_id = ?", item_id)}


def revoked_reason(name: str, deleted_at: str) -> str:
    """What a deleted Computer is told (its stream's end, every 401 after)."""
    return (
        f"the Computer {name!r} was deleted on the crew server ({deleted_at}) and its token "
        "revoked; create a new Computer there and start crew-computer with its token"
    )


def count(tx: Transaction, where: str, *params: Any) -> int:
    """`SELECT COUNT(*) FROM <where>`."""
    return int(tx.execute(f"SELECT COUNT(*) AS n FROM {where}", params).fetchone()["n"])


def agent_preview(tx: Transaction, agent_id: str) -> dict[str, int]:
    """What goes with an agent: its dm (and its messages), its reminders, the tasks it
    holds, and the groups it leaves (its messages there stay)."""
    live_agent(tx, agent_id)
    dm_messages = count(
        tx,
        "messages m JOIN room_members rm ON rm.room_id = m.room_id JOIN rooms r ON r.id = "
        "m.room_id WHERE r.kind = 'dm' AND rm.agent_id = ?",
        agent_id,
    )
    groups = count(
        tx,
        "room_members rm JOIN rooms r ON r.id = rm.room_id WHERE r.kind = 'group' "
        "AND rm.agent_id = ?",
        agent_id,
    )
    dms = count(
        tx,
        "room_members rm JOIN rooms r ON r.id = rm.room_id WHERE r.kind = 'dm' AND rm.agent_id = ?",
        agent_id,
    )
    return {
        "dms": dms,
        "dm_messages": dm_messages,
        "groups": groups,
        "reminders": count(tx, "reminders WHERE agent_id = ?", agent_id),
        "tasks": count(tx, "tasks WHERE assignee_id = ?", agent_id),
    }


def room_preview(tx: Transaction, room_id: str) -> dict[str, int]:
    """What goes with a room: its messages (threads' too), threads and tasks."""
    room_row(tx, room_id)
    ids = room_and_threads(tx, room_id)
    return {
        "messages": count(tx, f"messages WHERE room_id IN ({marks(ids)})", *ids),
        "threads": len(ids) - 1,
        "tasks": count(tx, f"tasks WHERE room_id IN ({marks(ids)})", *ids),
    }
