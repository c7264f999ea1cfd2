"""A person's controls of an agent (issue 25): Stop its running turn, Wake it now.

Both are requests on the Computer's event stream, never a write the Computer must
poll for: `stop {agent_id, turn_id}` names the turn, so a stop that arrives late (a
replay after a reconnect, the turn already over) cancels nothing on the Computer;
`wake {agent_id, "now": true}` runs a turn past any retry backoff. The Computer ends
a stopped turn `cancelled` without ack, so its messages stay unread, and that finish
leaves one notice in the turn's rooms (`stopped_notice`): the answer in the room.
"""

from __future__ import annotations

from typing import Any

import orjson

from crew_server.errors import Conflict, NotConnected, NotFound
from crew_server.store.db import StorePart, Transaction
from crew_server.store.messages import post

# What a stop or a wake of an agent whose Computer cannot hear it is told.
NO_COMPUTER = "@{handle} is on no Computer: assign it to one first"
NOT_LISTENING = "@{handle} cannot hear it: its Computer is not connected (start crew-computer)"


def stop_notice(handle: str) -> str:
    """The one line in a room whose turn a person stopped."""
    return f"@{handle} stopped (you asked); your messages wait unread until you Wake it"


class Controls(StorePart):
    """Stop and Wake, sent to the agent's Computer (see the module doc)."""

    def stop_turn(self, agent_id: str, turn_id: str) -> dict[str, Any]:
        """Ask the Computer running `turn_id` to stop it → `{agent_id, turn_id}`.

        404 for an unknown agent or a turn of another agent; 409 when the turn is not
        running (with its status) or its agent's Computer is unknown.
        """
        with self._database.write() as tx:
            handle = _handle(tx, agent_id)
            row = tx.execute(
                "SELECT agent_id, computer_id, status FROM turns WHERE id = ?", (turn_id,)
            ).fetchone()
            if row is None or row["agent_id"] != agent_id:
                raise NotFound(f"no turn {turn_id} of @{handle}")
            if row["status"] != "running":
                raise Conflict(
                    f"turn {turn_id} of @{handle} is {row['status']}, not running: "
                    "there is nothing to stop"
                )
            tx.execute(
                "UPDATE turns SET stop_requested_at = COALESCE(stop_requested_at, ?) WHERE id = ?",
                (tx.now(), turn_id),
            )
            # The Computer running the turn, even when the agent moved meanwhile.
            tx.emit_many([(row["computer_id"], "stop", {"agent_id": agent_id, "turn_id": turn_id})])
        return {"agent_id": agent_id, "turn_id": turn_id}

    def wake_now(self, agent_id: str) -> dict[str, Any]:
        """A person's Wake: the agent's Computer runs a turn now → `{agent_id}`.

        404 for an unknown agent, 409 when it is on no Computer.
        """
        with self._database.write() as tx:
            handle = _handle(tx, agent_id)
            computer_id = tx.execute(
                "SELECT computer_id FROM agents WHERE id = ?", (agent_id,)
            ).fetchone()["computer_id"]
            if computer_id is None:
                raise NotConnected(NO_COMPUTER.format(handle=handle))
            tx.emit_many([(computer_id, "wake", {"agent_id": agent_id, "now": True})])
        return {"agent_id": agent_id}

    def computer_of_agent(self, agent_id: str) -> str | None:
        """The agent's Computer (None: none); 404 for an unknown agent."""
        with self._database.read() as tx:
            row = tx.execute("SELECT computer_id FROM agents WHERE id = ?", (agent_id,)).fetchone()
        if row is None:
            raise NotFound(f"no agent {agent_id}")
        return str(row["computer_id"]) if row["computer_id"] is not None else None

    def running_turn_id(self, agent_id: str) -> str | None:
        """The agent's running turn, the one a Stop names (None: it runs none)."""
        with self._database.read() as tx:
            row = tx.execute(
                "SELECT id FROM turns WHERE agent_id = ? AND status = 'running' "
                "ORDER BY started_at DESC, rowid DESC LIMIT 1",
                (agent_id,),
            ).fetchone()
        return str(row["id"]) if row is not None else None


def stopped_notice(tx: Transaction, turn_id: str) -> None:
    """After a turn finished `cancelled`: when a person had asked to stop it, one notice
    in each room of its claim. It wakes nobody: the agent stays idle until a new
    message or a Wake (the notice is then part of what it reads)."""
    row = tx.execute(
        "SELECT t.rooms, t.stop_requested_at, a.handle FROM turns t "
        "JOIN agents a ON a.id = t.agent_id WHERE t.id = ?",
        (turn_id,),
    ).fetchone()
    if row is None or row["stop_requested_at"] is None:
        return
    for room in orjson.loads(row["rooms"]):
        post(tx, room["room_id"], None, stop_notice(row["handle"]))


def _handle(tx: Transaction, agent_id: str) -> str:
    row = tx.execute("SELECT handle FROM agents WHERE id = ?", (agent_id,)).fetchone()
    if row is None:
        raise NotFound(f"no agent {agent_id}")
    return str(row["handle"])
