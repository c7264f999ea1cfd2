"""Which turn an agent's write belongs to (issue 22): the turn identity `crew` presents.

Registering a turn gives the Computer a secret for it (`new_turn_secret`; only its
sha256 is kept, in `turns.secret_hash`). The Computer hands it to that turn's `crew`
alone, which sends it with each write (the `Crew-Turn` header). The server binds the
write to that turn (`bound_turn`): a message records it (`messages.turn_id`), an
idempotency key is scoped by it. So a reply that lands after its turn ended — a paused
server, a second server process taking it late — still counts for the turn that sent
it, whatever turn runs by then.

A write without the header (a `crew` older than the server) belongs to the agent's
latest turn, as before.

A write of a turn that is over once a newer turn has claimed the agent's messages is
refused (`refuse_if_superseded`): the newer turn was given those messages and answers
them, so taking the late write too would answer them twice. A claim counts
(`agents.claims`, the count a turn is registered with in `turns.claim_no`), not a time:
several server processes' clocks need not agree.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

import orjson

from crew_server.clock import iso
from crew_server.errors import ApiError, Refused
from crew_server.store.db import Transaction

HEADER = "Crew-Turn"
# Past this a turn's identity binds nothing: its idempotency keys are gone
# (`store.writes.KEEP`), so a write sent again could no longer be done once.
BINDS_FOR = timedelta(hours=48)


class TurnOver(Refused):
    """The write's turn has ended and a newer turn has its messages."""

    code = "turn_over"


class WrongTurn(ApiError):
    """The turn identity is not one of the calling agent's turns (or is too old)."""

    status = 403
    code = "wrong_turn"


def new_turn_secret() -> tuple[str, str]:
    """A fresh turn identity and the hash the server keeps of it."""
    secret = f"crt_{secrets.token_urlsafe(32)}"
    return secret, secret_hash(secret)


def secret_hash(secret: str) -> str:
    """A turn secret is 32 random bytes, so a plain sha256 is a safe stored form."""
    return hashlib.sha256(secret.strip().encode()).hexdigest()


def bound_turn(tx: Transaction, agent_id: str, secret: str | None, now: datetime) -> str | None:
    """The turn a write of `agent_id` belongs to: the one `secret` names, else the agent's
    latest turn (None before its first).

    A secret of no turn of this agent — made up, another agent's, a wiped database's —
    is refused, not ignored: an honest `crew` only ever holds its own turn's, so
    anything else is a forgery or a broken Computer, and binding it elsewhere would
    acknowledge rooms for the wrong turn. An older turn's secret of the same agent binds
    to that older turn (a late write is exactly that); it can only ever speak for a turn
    the agent was given, never for one still to come or another agent's.
    """
    if secret is None:
        row = tx.execute(
            "SELECT id FROM turns WHERE agent_id = ? ORDER BY started_at DESC, rowid DESC LIMIT 1",
            (agent_id,),
        ).fetchone()
        return str(row["id"]) if row is not None else None
    row = tx.execute(
        "SELECT id, agent_id, finished_at FROM turns WHERE secret_hash = ?",
        (secret_hash(secret),),
    ).fetchone()
    if row is None or row["agent_id"] != agent_id:
        raise WrongTurn(
            f"the {HEADER} header names no turn of this agent, so nothing was done. "
            "crew sends the identity of the turn it runs in; tell the user."
        )
    if row["finished_at"] is not None and row["finished_at"] < iso(now - BINDS_FOR):
        raise WrongTurn(
            f"the turn in the {HEADER} header ended more than 48 hours ago, so nothing was "
            "done. Stop here; you will be woken again when there is something new."
        )
    return str(row["id"])


def refuse_if_superseded(tx: Transaction, turn_id: str | None) -> None:
    """Refuse a write of `turn_id` when that turn is over and its agent claimed its
    messages again since it was registered (the newer turn answers them)."""
    if turn_id is None:
        return
    row = tx.execute(
        "SELECT t.status, t.claim_no, a.claims FROM turns t JOIN agents a ON a.id = t.agent_id "
        "WHERE t.id = ?",
        (turn_id,),
    ).fetchone()
    if row is None or row["status"] == "running" or row["claim_no"] is None:
        return
    if int(row["claims"]) > int(row["claim_no"]):
        raise TurnOver(
            "this turn is over and a newer turn has its messages, so this was not done "
            "(the newer turn answers them). Stop here."
        )


def count_claim(tx: Transaction, agent_id: str) -> None:
    """An unread claim of the agent: writes of its turns that are over stop being taken."""
    tx.execute("UPDATE agents SET claims = claims + 1 WHERE id = ?", (agent_id,))


def epoch_ms(moment: datetime) -> int:
    """A time as a trace step holds it: milliseconds since the epoch."""
    return int(moment.timestamp() * 1000)


def note_reply(tx: Transaction, turn_id: str | None, received: datetime, stored: datetime) -> None:
    """The first reply of a turn in its trace: when it reached the server and when it was
    written (its write transaction, just before the commit). Later replies change nothing:
    the first is the one a person waits for."""
    if turn_id is None:
        return
    row = tx.execute("SELECT trace FROM turns WHERE id = ?", (turn_id,)).fetchone()
    if row is None:
        return
    trace = orjson.loads(row["trace"]) if row["trace"] else {}
    if "reply_received" in trace:
        return
    trace["reply_received"] = epoch_ms(received)
    trace["reply_stored"] = epoch_ms(stored)
    tx.execute("UPDATE turns SET trace = ? WHERE id = ?", (orjson.dumps(trace).decode(), turn_id))
