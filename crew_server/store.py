"""All durable state of the reference server, behind one class: `Store` (SQLite).

One connection guarded by a lock: every request's work is a few indexed
statements, so callers run them inline instead of hopping to a thread pool.
The file database runs in WAL mode; `:memory:` serves the tests. The schema
comes from the numbered files in `migrations/`, applied at open.

A Postgres backend would be a second class with the same public methods; the
rules that need no database live in `crew_server.rules`.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

import orjson

from crew_server import rules
from crew_server.clock import Clock, iso, parse_iso
from crew_server.errors import (
    Conflict,
    Forbidden,
    Held,
    Invalid,
    NotConnected,
    NotFound,
    Refused,
    StaleTurn,
    Unauthorized,
)

log = logging.getLogger("crew_server.store")

USER_AUTHOR: dict[str, Any] = {"kind": "user", "id": "user", "name": "User", "handle": None}
SYSTEM_AUTHOR: dict[str, Any] = {"kind": "system", "id": "system", "name": "Crew", "handle": None}

# How many SSE events are kept for replay after Last-Event-ID (all Computers together).
EVENT_LOG_KEEP = 50_000
_PRUNE_EVERY = 1_000
# The bound of one unread claim (and of one HELD answer): at most this many messages, and
# no more message text (bodies, and the root message of a thread) than this, except that
# a claim always holds at least one message. The rest comes with the next turn.
CLAIM_MAX_MESSAGES = 200
CLAIM_MAX_CHARS = 256 * 1024

_MESSAGE_SELECT = """
SELECT m.id, m.room_id, m.seq, m.author_kind, m.author_id, a.name, a.handle, m.body, m.kind,
       m.mentions, m.thread_id, m.thread_replies, m.thread_last_at, m.created_at,
       t.number, t.title, t.status, ta.handle
FROM messages m
LEFT JOIN agents a ON a.id = m.author_id
LEFT JOIN tasks t ON t.host_message_id = m.id
LEFT JOIN agents ta ON ta.id = t.assignee_id
"""


def hash_token(token: str) -> str:
    """Tokens are random 32-byte secrets, so a plain sha256 is a safe stored form."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(prefix: str) -> str:
    """A fresh bearer token; the prefix tells a reader which kind it is."""
    return f"{prefix}_{secrets.token_urlsafe(32)}"


def new_id() -> str:
    """A fresh UUID (text), the form of every id."""
    return str(uuid.uuid4())


@dataclass(frozen=True)
class Actor:
    """Who acts on the agent/user API: the user, or an agent (with its handle)."""

    kind: str  # "user" | "agent"
    id: str
    handle: str | None = None


USER = Actor("user", "user")


@dataclass(frozen=True)
class AgentIdentity:
    """What an agent token proves."""

    agent_id: str
    handle: str
    computer_id: str


class _ClaimBudget:
    """What is left of one claim's bound while rooms are filled in (at least one message)."""

    def __init__(self, messages: int, chars: int) -> None:
        self.messages = messages
        self.chars = chars
        self.taken = 0

    def left(self) -> bool:
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


class Store:
    """The server's durable state and the operations on it (see module docstring)."""

    def __init__(
        self,
        path: str,
        clock: Clock,
        *,
        event_log_keep: int = EVENT_LOG_KEEP,
        prune_every: int = _PRUNE_EVERY,
        claim_max_messages: int = CLAIM_MAX_MESSAGES,
        claim_max_chars: int = CLAIM_MAX_CHARS,
    ) -> None:
        self.clock = clock
        self._claim_max_messages = claim_max_messages
        self._claim_max_chars = claim_max_chars
        self._event_log_keep = event_log_keep
        self._prune_every = prune_every
        self._lock = threading.RLock()
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.execute("PRAGMA busy_timeout = 5000")
        if path != ":memory:":
            self._db.execute("PRAGMA journal_mode = WAL")
            # WAL + NORMAL: a crash may lose the last commits but never corrupts the file.
            self._db.execute("PRAGMA synchronous = NORMAL")
        self._touched: set[str] = set()
        self._events_since_prune = 0
        # Called after a commit with the ids of Computers that have new SSE events.
        self.listener: Callable[[set[str]], None] | None = None
        self._migrate()

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------------ plumbing

    def _migrate(self) -> None:
        with self._lock:
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY)"
            )
            done = {r[0] for r in self._db.execute("SELECT version FROM schema_migrations")}
            files = sorted(
                (
                    f
                    for f in resources.files("crew_server.migrations").iterdir()
                    if f.name.endswith(".sql")
                ),
                key=lambda f: f.name,
            )
            for file in files:
                version = int(file.name.split("_", 1)[0])
                if version in done:
                    continue
                script = file.read_text(encoding="utf-8")
                # executescript commits on its own; the version row goes in the same script.
                self._db.executescript(
                    f"BEGIN;\n{script}\nINSERT INTO schema_migrations VALUES ({version});\nCOMMIT;"
                )
                log.info("applied migration %s", file.name)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; SSE listeners hear about new events after the commit."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                self._touched.clear()
                raise
            touched, self._touched = self._touched, set()
        if touched and self.listener is not None:
            self.listener(touched)

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._db

    def _now(self) -> str:
        return iso(self.clock.now())

    def _emit(
        self, db: sqlite3.Connection, computer_id: str, event: str, data: dict[str, Any]
    ) -> None:
        self._emit_many(db, [(computer_id, event, data)])

    def _emit_many(
        self, db: sqlite3.Connection, events: Sequence[tuple[str, str, dict[str, Any]]]
    ) -> None:
        """Append SSE events (computer id, event, data) to the log, in order."""
        now = self._now()
        db.executemany(
            "INSERT INTO computer_events (computer_id, event, data, created_at) VALUES (?, ?, ?, ?)",
            [(c, e, orjson.dumps(d).decode(), now) for c, e, d in events],
        )
        self._touched.update(c for c, _, _ in events)
        self._events_since_prune += len(events)
        if self._events_since_prune >= self._prune_every:
            self._events_since_prune = 0
            through = db.execute("SELECT MAX(id) FROM computer_events").fetchone()[0]
            through -= self._event_log_keep
            if through > 0:
                db.execute("DELETE FROM computer_events WHERE id <= ?", (through,))
                # Remembered so a stream resuming from before it knows it missed events.
                db.execute(
                    "INSERT INTO settings VALUES ('events_pruned_through', ?) ON CONFLICT (key) "
                    "DO UPDATE SET value = MAX(CAST(value AS INTEGER), excluded.value)",
                    (through,),
                )

    def _wake(self, db: sqlite3.Connection, agent_ids: Iterable[str]) -> None:
        """A `wake` to the Computer of each agent (agents on no Computer wait unread)."""
        ids = list(agent_ids)
        if not ids:
            return
        marks = ",".join("?" * len(ids))
        rows = db.execute(
            f"SELECT id, computer_id FROM agents WHERE id IN ({marks}) AND computer_id IS NOT NULL",
            ids,
        ).fetchall()
        self._emit_many(db, [(c, "wake", {"agent_id": a}) for a, c in sorted(rows)])

    # ------------------------------------------------------------------ identities

    def ensure_user_token(self) -> str | None:
        """Create the user token at first start; returns it then (once), else None."""
        with self._write() as db:
            row = db.execute("SELECT 1 FROM settings WHERE key = 'user_token_hash'").fetchone()
            if row is not None:
                return None
            token = new_token("cru")
            db.execute("INSERT INTO settings VALUES ('user_token_hash', ?)", (hash_token(token),))
            return token

    def reset_user_token(self) -> str:
        """Replace the user token (the old one stops working) and return the new one."""
        token = new_token("cru")
        with self._write() as db:
            db.execute(
                "INSERT OR REPLACE INTO settings VALUES ('user_token_hash', ?)",
                (hash_token(token),),
            )
        return token

    def check_user_token(self, token: str) -> bool:
        """Whether `token` is the user token."""
        with self._read() as db:
            row = db.execute("SELECT value FROM settings WHERE key = 'user_token_hash'").fetchone()
        return row is not None and secrets.compare_digest(row[0], hash_token(token))

    def computer_by_token(self, token: str) -> str:
        """The Computer id a computer token belongs to; Unauthorized when none."""
        with self._read() as db:
            row = db.execute(
                "SELECT id FROM computers WHERE token_hash = ?", (hash_token(token),)
            ).fetchone()
        if row is None:
            raise Unauthorized(
                "the computer token is not valid; check the credential you were given"
            )
        return str(row[0])

    def agent_by_token(self, token: str) -> AgentIdentity:
        """The agent an agent token belongs to, while its Computer still hosts it."""
        with self._read() as db:
            row = db.execute(
                "SELECT t.agent_id, a.handle, t.computer_id FROM agent_tokens t "
                "JOIN agents a ON a.id = t.agent_id AND a.computer_id = t.computer_id "
                "WHERE t.token_hash = ?",
                (hash_token(token),),
            ).fetchone()
        if row is None:
            raise Unauthorized(
                "the agent token is not valid (it expires when the Computer reconnects)"
            )
        return AgentIdentity(row[0], row[1], row[2])

    # ------------------------------------------------------------------ computers

    def create_computer(self, name: str) -> tuple[str, str]:
        """A new Computer credential: (computer_id, token). The token is shown only now."""
        computer_id, token = new_id(), new_token("crc")
        with self._write() as db:
            db.execute(
                "INSERT INTO computers (id, name, token_hash, created_at) VALUES (?, ?, ?, ?)",
                (computer_id, name, hash_token(token), self._now()),
            )
        return computer_id, token

    def list_computers(self) -> list[dict[str, Any]]:
        """Every Computer with what it last reported (connect, models)."""
        with self._read() as db:
            rows = db.execute(
                "SELECT id, name, epoch, hostname, platform, version, capacity, models, connected_at "
                "FROM computers ORDER BY created_at, id"
            ).fetchall()
        return [
            {
                "id": r[0],
                "name": r[1],
                "epoch": r[2],
                "hostname": r[3],
                "platform": r[4],
                "version": r[5],
                "capacity": r[6],
                "models": orjson.loads(r[7]),
                "connected_at": r[8],
            }
            for r in rows
        ]

    def connect(
        self, computer_id: str, hostname: str, platform: str, version: str, capacity: int
    ) -> dict[str, Any]:
        """A new connection epoch; turns of older connections become interrupted."""
        now = self._now()
        with self._write() as db:
            epoch = db.execute(
                "UPDATE computers SET epoch = epoch + 1, hostname = ?, platform = ?, version = ?, "
                "capacity = ?, connected_at = ? WHERE id = ? RETURNING epoch",
                (hostname, platform, version, capacity, now, computer_id),
            ).fetchone()[0]
            interrupted = db.execute(
                "UPDATE turns SET status = 'interrupted', finished_at = ? "
                "WHERE computer_id = ? AND status = 'running' AND fence < ?",
                (now, computer_id, epoch),
            ).rowcount
            db.execute(
                "DELETE FROM agent_tokens WHERE computer_id = ? AND epoch < ?", (computer_id, epoch)
            )
        if interrupted:
            log.info(
                "computer %s connected (epoch %d): %d turns interrupted",
                computer_id,
                epoch,
                interrupted,
            )
        return {"computer_id": computer_id, "epoch": epoch, "server_time": now}

    def set_models(self, computer_id: str, models: list[str]) -> None:
        """Record the models a Computer can run."""
        with self._write() as db:
            db.execute(
                "UPDATE computers SET models = ? WHERE id = ?",
                (orjson.dumps(models).decode(), computer_id),
            )

    # ------------------------------------------------------------------ agents

    _AGENT_COLS = "id, handle, name, persona, engine, model, computer_id"

    @staticmethod
    def _agent_of(row: Sequence[Any]) -> dict[str, Any]:
        return {
            "id": row[0],
            "handle": row[1],
            "name": row[2],
            "persona": row[3],
            "engine": row[4],
            "model": row[5],
            "computer_id": row[6],
        }

    def _check_computer(self, db: sqlite3.Connection, computer_id: str | None) -> None:
        if (
            computer_id is not None
            and db.execute("SELECT 1 FROM computers WHERE id = ?", (computer_id,)).fetchone()
            is None
        ):
            raise NotFound(f"no computer {computer_id}; create it with POST /api/computers first")

    def create_agent(
        self, handle: str, name: str, persona: str, model: str, engine: str, computer_id: str | None
    ) -> dict[str, Any]:
        """A new agent; its Computer (if any) hears `agents`. Handles are unique."""
        agent_id = new_id()
        with self._write() as db:
            self._check_computer(db, computer_id)
            if db.execute("SELECT 1 FROM agents WHERE handle = ?", (handle,)).fetchone():
                raise Conflict(f"the handle @{handle} is taken; choose another handle")
            db.execute(
                "INSERT INTO agents (id, handle, name, persona, engine, model, computer_id, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (agent_id, handle, name, persona, engine, model, computer_id, self._now()),
            )
            if computer_id is not None:
                self._emit(db, computer_id, "agents", {"agent_id": agent_id})
        return self.get_agent(agent_id)

    def get_agent(self, agent_id: str) -> dict[str, Any]:
        """One agent (without status)."""
        with self._read() as db:
            row = db.execute(
                f"SELECT {self._AGENT_COLS} FROM agents WHERE id = ?", (agent_id,)
            ).fetchone()
        if row is None:
            raise NotFound(f"no agent {agent_id}")
        return self._agent_of(row)

    def update_agent(self, agent_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Change an agent's settings; its Computer (old and new) hears `agents`."""
        allowed = {"name", "persona", "model", "engine", "computer_id"}
        fields = {k: v for k, v in changes.items() if k in allowed}
        with self._write() as db:
            row = db.execute("SELECT computer_id FROM agents WHERE id = ?", (agent_id,)).fetchone()
            if row is None:
                raise NotFound(f"no agent {agent_id}")
            old_computer = row[0]
            if "computer_id" in fields:
                self._check_computer(db, fields["computer_id"])
            if fields:
                sets = ", ".join(f"{k} = ?" for k in fields)
                db.execute(f"UPDATE agents SET {sets} WHERE id = ?", [*fields.values(), agent_id])
            new_computer = fields.get("computer_id", old_computer)
            for computer_id in {old_computer, new_computer} - {None}:
                self._emit(db, computer_id, "agents", {"agent_id": agent_id})
        return self.get_agent(agent_id)

    def list_agents(self) -> list[dict[str, Any]]:
        """Every agent with its status (derived from its latest turn) and problem."""
        with self._read() as db:
            rows = db.execute(
                f"SELECT {self._AGENT_COLS}, problem, "
                "(SELECT status FROM turns t WHERE t.agent_id = agents.id "
                " ORDER BY started_at DESC, rowid DESC LIMIT 1) "
                "FROM agents ORDER BY handle"
            ).fetchall()
        return [
            {**self._agent_of(r), "status": rules.agent_status(r[8]), "problem": r[7]} for r in rows
        ]

    def computer_agents(self, computer_id: str) -> list[dict[str, Any]]:
        """The agents assigned to a Computer, by handle."""
        with self._read() as db:
            rows = db.execute(
                f"SELECT {self._AGENT_COLS} FROM agents WHERE computer_id = ? ORDER BY handle",
                (computer_id,),
            ).fetchall()
        return [self._agent_of(r) for r in rows]

    def _own_agent(self, db: sqlite3.Connection, computer_id: str, agent_id: str) -> None:
        """A Computer sees only its own agents: anything else is 'not found'."""
        row = db.execute("SELECT computer_id FROM agents WHERE id = ?", (agent_id,)).fetchone()
        if row is None or row[0] != computer_id:
            raise NotFound(f"no agent {agent_id} on this computer")

    def set_problem(self, computer_id: str, agent_id: str, reason: str | None) -> None:
        """Set (or with None clear) why an agent of this Computer cannot run."""
        with self._write() as db:
            self._own_agent(db, computer_id, agent_id)
            db.execute("UPDATE agents SET problem = ? WHERE id = ?", (reason, agent_id))

    def issue_agent_token(self, computer_id: str, agent_id: str) -> str:
        """A new token for an agent of this Computer, valid until the Computer reconnects."""
        token = new_token("cra")
        with self._write() as db:
            self._own_agent(db, computer_id, agent_id)
            epoch = db.execute(
                "SELECT epoch FROM computers WHERE id = ?", (computer_id,)
            ).fetchone()[0]
            db.execute(
                "INSERT INTO agent_tokens VALUES (?, ?, ?, ?, ?)",
                (hash_token(token), agent_id, computer_id, epoch, self._now()),
            )
        return token

    # ------------------------------------------------------------------ rooms

    def _room_row(
        self, db: sqlite3.Connection, room_id: str
    ) -> tuple[str, str, str | None, str | None, str | None, int]:
        row = db.execute(
            "SELECT id, kind, title, parent_room_id, root_message_id, last_seq FROM rooms WHERE id = ?",
            (room_id,),
        ).fetchone()
        if row is None:
            raise NotFound(f"no room {room_id}")
        return row

    def _member_room(self, db: sqlite3.Connection, room_id: str) -> str:
        """The room whose members count: a thread's group, else the room itself."""
        row = self._room_row(db, room_id)
        return row[3] if row[1] == "thread" and row[3] else row[0]

    def _members(self, db: sqlite3.Connection, room_id: str) -> list[tuple[str, str, str]]:
        """(agent id, handle, name) of a room's agents (a thread's: its group's), by handle."""
        base = self._member_room(db, room_id)
        return db.execute(
            "SELECT a.id, a.handle, a.name FROM room_members rm JOIN agents a ON a.id = rm.agent_id "
            "WHERE rm.room_id = ? ORDER BY a.handle",
            (base,),
        ).fetchall()

    def _is_member(self, db: sqlite3.Connection, room_id: str, agent_id: str) -> bool:
        base = self._member_room(db, room_id)
        return (
            db.execute(
                "SELECT 1 FROM room_members WHERE room_id = ? AND agent_id = ?", (base, agent_id)
            ).fetchone()
            is not None
        )

    def _require_member(self, db: sqlite3.Connection, room_id: str, agent_id: str) -> None:
        row = self._room_row(db, room_id)
        if self._is_member(db, room_id, agent_id):
            return
        if row[1] == "dm":
            raise Forbidden("that room is a direct conversation between the user and another agent")
        raise Forbidden("you are not a member of that room; answer only in rooms you were given")

    def create_room(
        self, kind: str, title: str | None, agent_ids: list[str]
    ) -> tuple[dict[str, Any], bool]:
        """A dm (the user and one agent; reused when it exists) or a group. (room, created)."""
        ids = list(dict.fromkeys(agent_ids))
        if kind == "dm" and len(ids) != 1:
            raise Invalid("a dm has exactly one agent; give one id in agent_ids")
        if kind == "group" and not (title and title.strip()):
            raise Invalid("a group needs a title")
        with self._write() as db:
            for agent_id in ids:
                if db.execute("SELECT 1 FROM agents WHERE id = ?", (agent_id,)).fetchone() is None:
                    raise NotFound(f"no agent {agent_id}; create it first")
            if kind == "dm":
                row = db.execute(
                    "SELECT r.id FROM rooms r JOIN room_members rm ON rm.room_id = r.id "
                    "WHERE r.kind = 'dm' AND rm.agent_id = ?",
                    (ids[0],),
                ).fetchone()
                if row is not None:
                    return self._room_view(db, row[0], None), False
            room_id = new_id()
            db.execute(
                "INSERT INTO rooms (id, kind, title, created_at) VALUES (?, ?, ?, ?)",
                (room_id, kind, title if kind == "group" else None, self._now()),
            )
            db.executemany("INSERT INTO room_members VALUES (?, ?)", [(room_id, a) for a in ids])
            db.executemany(
                "INSERT INTO positions (agent_id, room_id) VALUES (?, ?)",
                [(a, room_id) for a in ids],
            )
            return self._room_view(db, room_id, None), True

    def get_room(self, room_id: str) -> dict[str, Any]:
        """One room as the user sees it."""
        with self._read() as db:
            return self._room_view(db, room_id, None)

    def list_rooms(self) -> list[dict[str, Any]]:
        """Every dm and group, oldest first."""
        with self._read() as db:
            ids = [
                r[0]
                for r in db.execute(
                    "SELECT id FROM rooms WHERE kind != 'thread' ORDER BY created_at, id"
                )
            ]
            return [self._room_view(db, i, None) for i in ids]

    def _room_view(
        self, db: sqlite3.Connection, room_id: str, for_agent: str | None
    ) -> dict[str, Any]:
        rid, kind, title, parent_id, root_id, _ = self._room_row(db, room_id)
        members: list[dict[str, Any]] = [dict(USER_AUTHOR)]
        members += [
            {"kind": "agent", "id": a, "name": n, "handle": h} for a, h, n in self._members(db, rid)
        ]
        parent_title = parent_kind = None
        root_message = None
        if kind == "thread" and parent_id is not None:
            parent_title, parent_kind = db.execute(
                "SELECT title, kind FROM rooms WHERE id = ?", (parent_id,)
            ).fetchone()
            if root_id is not None:
                found = self._messages(db, "WHERE m.id = ?", (root_id,))
                root_message = found[0] if found else None
        muted, until = False, None
        if for_agent is not None and kind == "group":
            row = db.execute(
                "SELECT until FROM mutes WHERE agent_id = ? AND room_id = ? "
                "AND (until IS NULL OR until > ?)",
                (for_agent, rid, self._now()),
            ).fetchone()
            if row is not None:
                muted, until = True, row[0]
        return {
            "id": rid,
            "kind": kind,
            "title": title,
            "members": members,
            "parent_room_id": parent_id,
            "root_message_id": root_id,
            "parent_title": parent_title,
            "parent_kind": parent_kind,
            "root_message": root_message,
            "muted": muted,
            "muted_until": until,
        }

    # ------------------------------------------------------------------ messages

    @staticmethod
    def _message_of(r: Sequence[Any]) -> dict[str, Any]:
        if r[3] == "agent":
            author = {"kind": "agent", "id": r[4], "name": r[5], "handle": r[6]}
        elif r[3] == "user":
            author = USER_AUTHOR
        else:
            author = SYSTEM_AUTHOR
        return {
            "id": r[0],
            "room_id": r[1],
            "seq": r[2],
            "author": author,
            "body": r[7],
            "kind": r[8],
            "mentions": orjson.loads(r[9]),
            "task": (
                {"number": r[14], "title": r[15], "status": r[16], "assignee": r[17]}
                if r[14] is not None
                else None
            ),
            "thread": (
                {"id": r[10], "replies": r[11], "last_at": r[12]} if r[10] is not None else None
            ),
            "created_at": r[13],
        }

    def _messages(
        self, db: sqlite3.Connection, where: str, params: Sequence[Any]
    ) -> list[dict[str, Any]]:
        return [self._message_of(r) for r in db.execute(_MESSAGE_SELECT + where, params)]

    def list_messages(self, room_id: str, after_seq: int, limit: int) -> list[dict[str, Any]]:
        """A room's messages after `after_seq`, by seq, at most `limit`."""
        with self._read() as db:
            self._room_row(db, room_id)
            return self._messages(
                db,
                "WHERE m.room_id = ? AND m.seq > ? ORDER BY m.seq LIMIT ?",
                (room_id, after_seq, limit),
            )

    def get_message(self, message_id: str) -> dict[str, Any]:
        """One message."""
        with self._read() as db:
            found = self._messages(db, "WHERE m.id = ?", (message_id,))
        if not found:
            raise NotFound(f"no message {message_id}")
        return found[0]

    def _thread_of(self, db: sqlite3.Connection, message_id: str) -> tuple[str, bool]:
        """The thread hanging off a message, created when missing: (thread id, created).

        A message inside a thread names that thread (threads do not nest).
        """
        row = db.execute(
            "SELECT m.room_id, m.thread_id, m.author_kind, m.author_id, r.kind "
            "FROM messages m JOIN rooms r ON r.id = m.room_id WHERE m.id = ?",
            (message_id,),
        ).fetchone()
        if row is None:
            raise NotFound(f"no message {message_id}")
        room_id, thread_id, author_kind, author_id, room_kind = row
        if room_kind == "thread":
            return room_id, False
        if thread_id is not None:
            return thread_id, False
        thread_id = new_id()
        db.execute(
            "INSERT INTO rooms (id, kind, parent_room_id, root_message_id, created_at) "
            "VALUES (?, 'thread', ?, ?, ?)",
            (thread_id, room_id, message_id, self._now()),
        )
        db.execute("UPDATE messages SET thread_id = ? WHERE id = ?", (thread_id, message_id))
        # The root's author follows the thread from the start; in a dm (a task's thread),
        # so does its agent: everything in a dm is for it.
        followers = {author_id} if author_kind == "agent" else set()
        if room_kind == "dm":
            followers.update(
                r[0]
                for r in db.execute(
                    "SELECT agent_id FROM room_members WHERE room_id = ?", (room_id,)
                )
            )
        db.executemany(
            "INSERT OR IGNORE INTO positions (agent_id, room_id) VALUES (?, ?)",
            [(a, thread_id) for a in sorted(followers)],
        )
        return thread_id, True

    def _post(
        self,
        db: sqlite3.Connection,
        room_id: str,
        author: Actor | None,
        body: str,
        *,
        notice_wakes: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """Append a message (a notice when `author` is None) and wake whoever it concerns."""
        now = self._now()
        rid, kind, _, _, root_id, _ = self._room_row(db, room_id)
        seq = db.execute(
            "UPDATE rooms SET last_seq = last_seq + 1 WHERE id = ? RETURNING last_seq", (rid,)
        ).fetchone()[0]
        mentions: list[str] = []
        members: list[tuple[str, str, str]] = []
        if author is not None:
            members = self._members(db, rid)
            mentions = rules.mentioned_ids(body, {h: a for a, h, _ in members})
        message_id = new_id()
        author_kind, author_id = (
            ("system", "system") if author is None else (author.kind, author.id)
        )
        db.execute(
            "INSERT INTO messages (id, room_id, seq, author_kind, author_id, body, kind, mentions, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
            ),
        )
        if kind == "thread":
            db.execute(
                "UPDATE messages SET thread_replies = thread_replies + 1, thread_last_at = ? "
                "WHERE id = ?",
                (now, root_id),
            )
        if author is not None and author.kind == "agent":
            # The author has seen its own message; with nothing pending it is read too.
            db.execute(
                "INSERT INTO positions (agent_id, room_id, delivered_seq, read_seq) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (agent_id, room_id) DO UPDATE SET "
                "read_seq = CASE WHEN read_seq = delivered_seq THEN excluded.read_seq "
                "ELSE read_seq END, delivered_seq = excluded.delivered_seq",
                (author.id, rid, seq, seq),
            )
        if author is None:
            woken = list(dict.fromkeys(notice_wakes or ()))
        else:
            if kind == "thread":
                db.executemany(
                    "INSERT OR IGNORE INTO positions (agent_id, room_id) VALUES (?, ?)",
                    [(a, rid) for a in mentions],
                )
                followers = frozenset(
                    r[0]
                    for r in db.execute("SELECT agent_id FROM positions WHERE room_id = ?", (rid,))
                )
                facts = rules.RoomFacts("thread", followers, frozenset())
            else:
                muted = (
                    frozenset(
                        r[0]
                        for r in db.execute(
                            "SELECT agent_id FROM mutes WHERE room_id = ? AND (until IS NULL OR until > ?)",
                            (rid, now),
                        )
                    )
                    if kind == "group"
                    else frozenset()
                )
                facts = rules.RoomFacts(kind, frozenset(a for a, _, _ in members), muted)
            woken = rules.woken_by_message(facts, author.id, mentions)
        if woken and kind == "thread":
            # Whoever a thread message wakes must also get it at the next unread claim.
            db.executemany(
                "INSERT OR IGNORE INTO positions (agent_id, room_id) VALUES (?, ?)",
                [(a, rid) for a in woken],
            )
        self._wake(db, woken)
        return self._messages(db, "WHERE m.id = ?", (message_id,))[0]

    def user_post(self, room_id: str, body: str, thread_of: str | None) -> dict[str, Any]:
        """The user posts in a room, or in the thread of `thread_of` (created when missing)."""
        with self._write() as db:
            self._room_row(db, room_id)
            target = room_id
            if thread_of is not None:
                target, _ = self._thread_of(db, self._check_thread_of(db, room_id, thread_of))
            return self._post(db, target, USER, body)

    def _check_thread_of(self, db: sqlite3.Connection, room_id: str, message_id: str) -> str:
        """`thread_of` must name a message of a group, in `room_id` (or its thread)."""
        row = db.execute(
            "SELECT m.room_id, m.thread_id, r.kind FROM messages m "
            "JOIN rooms r ON r.id = m.room_id WHERE m.id = ?",
            (message_id,),
        ).fetchone()
        if row is None:
            raise NotFound(f"no message {message_id}")
        message_room, thread_id, kind = row
        if room_id not in (message_room, thread_id):
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

    def reply(
        self, agent: AgentIdentity, room_id: str, body: str, thread_of: str | None
    ) -> dict[str, Any]:
        """An agent's reply; raises Held (after recording delivery) when it missed messages."""
        held: list[dict[str, Any]] | None = None
        with self._write() as db:
            self._require_member(db, room_id, agent.agent_id)
            target, thread_id = room_id, None
            if thread_of is not None:
                target, _ = self._thread_of(db, self._check_thread_of(db, room_id, thread_of))
                thread_id = target
            row = db.execute(
                "SELECT delivered_seq FROM positions WHERE agent_id = ? AND room_id = ?",
                (agent.agent_id, target),
            ).fetchone()
            delivered = row[0] if row is not None else 0
            unseen = db.execute(
                "SELECT 1 FROM messages WHERE room_id = ? AND seq > ? "
                "AND NOT (author_kind = 'agent' AND author_id = ?) LIMIT 1",
                (target, delivered, agent.agent_id),
            ).fetchone()
            if unseen is not None:
                budget = _ClaimBudget(self._claim_max_messages, self._claim_max_chars)
                view = self._room_view(db, target, agent.agent_id)
                root = view["root_message"]
                messages = budget.take(
                    self._messages(
                        db,
                        "WHERE m.room_id = ? AND m.seq > ? ORDER BY m.seq LIMIT ?",
                        (target, delivered, budget.messages),
                    ),
                    len(root["body"]) if root else 0,
                )
                db.execute(
                    "INSERT INTO positions (agent_id, room_id, delivered_seq) VALUES (?, ?, ?) "
                    "ON CONFLICT (agent_id, room_id) DO UPDATE SET delivered_seq = excluded.delivered_seq",
                    (agent.agent_id, target, messages[-1]["seq"]),
                )
                held = [{"room": view, "messages": messages}]
            else:
                actor = Actor("agent", agent.agent_id, agent.handle)
                message = self._post(db, target, actor, body)
        if held is not None:
            raise Held(agent.agent_id, held)
        answer = {"message_id": message["id"], "room_id": room_id}
        if thread_id is not None:
            answer["thread_id"] = thread_id
        return answer

    # ------------------------------------------------------------------ positions

    def claim_unread(self, computer_id: str, agent_id: str) -> tuple[list[dict[str, Any]], bool]:
        """Unread messages (after the read position) of every room the agent follows → (rooms, more).

        Rooms come in the order of their oldest unread message, messages by seq, within the
        claim bound (`CLAIM_MAX_MESSAGES`, `CLAIM_MAX_CHARS`). `delivered_seq` becomes what
        this claim returned: the last message given in a room, the read position in a room
        left out. `more` says the claim was cut; the ack of the turn then wakes the agent.
        """
        with self._write() as db:
            self._own_agent(db, computer_id, agent_id)
            rooms = db.execute(
                "SELECT p.room_id, p.read_seq, r.last_seq FROM positions p "
                "JOIN rooms r ON r.id = p.room_id "
                "JOIN messages m ON m.room_id = p.room_id AND m.seq = p.read_seq + 1 "
                "WHERE p.agent_id = ? AND r.last_seq > p.read_seq "
                "ORDER BY m.created_at, p.room_id",
                (agent_id,),
            ).fetchall()
            budget = _ClaimBudget(self._claim_max_messages, self._claim_max_chars)
            answer: list[dict[str, Any]] = []
            given: list[tuple[int, str, str]] = []
            more = False
            for room_id, read_seq, last_seq in rooms:
                messages: list[dict[str, Any]] = []
                view: dict[str, Any] | None = None
                if budget.left():
                    view = self._room_view(db, room_id, agent_id)
                    root = view["root_message"]
                    messages = budget.take(
                        self._messages(
                            db,
                            "WHERE m.room_id = ? AND m.seq > ? ORDER BY m.seq LIMIT ?",
                            (room_id, read_seq, budget.messages),
                        ),
                        len(root["body"]) if root else 0,
                    )
                upto = messages[-1]["seq"] if messages else read_seq
                more = more or upto < last_seq
                given.append((upto, agent_id, room_id))
                if messages and view is not None:
                    answer.append({"room": view, "messages": messages})
            db.executemany(
                "UPDATE positions SET delivered_seq = ? WHERE agent_id = ? AND room_id = ?", given
            )
            db.execute("UPDATE agents SET claim_more = ? WHERE id = ?", (int(more), agent_id))
            return answer, more

    def positions(self, agent_id: str) -> list[dict[str, Any]]:
        """An agent's delivered and read positions per room."""
        with self._read() as db:
            if db.execute("SELECT 1 FROM agents WHERE id = ?", (agent_id,)).fetchone() is None:
                raise NotFound(f"no agent {agent_id}")
            rows = db.execute(
                "SELECT room_id, delivered_seq, read_seq FROM positions WHERE agent_id = ? "
                "ORDER BY room_id",
                (agent_id,),
            ).fetchall()
        return [{"room_id": r[0], "delivered_seq": r[1], "read_seq": r[2]} for r in rows]

    # ------------------------------------------------------------------ turns

    def register_turn(
        self,
        computer_id: str,
        agent_id: str,
        rooms: list[dict[str, Any]],
        input_text: str,
        engine: str,
        model: str,
        session_id: str | None,
    ) -> dict[str, Any]:
        """Record a running turn of an agent of this Computer → `{turn_id, fence}`."""
        turn_id = new_id()
        with self._write() as db:
            self._own_agent(db, computer_id, agent_id)
            epoch = db.execute(
                "SELECT epoch FROM computers WHERE id = ?", (computer_id,)
            ).fetchone()[0]
            if epoch == 0:
                raise NotConnected(
                    "this computer has not connected; call POST /computer/connect first"
                )
            # Turns of one agent never overlap: one still `running` when the next is
            # registered lost its end (the finish never arrived, or the answer to its
            # registration was lost). Without this it would stay running forever.
            db.execute(
                "UPDATE turns SET status = 'interrupted', finished_at = ? "
                "WHERE agent_id = ? AND status = 'running'",
                (self._now(), agent_id),
            )
            db.execute(
                "INSERT INTO turns (id, agent_id, computer_id, fence, status, rooms, input, engine, "
                "model, session_id, started_at) VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, ?)",
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
                    self._now(),
                ),
            )
        return {"turn_id": turn_id, "fence": epoch}

    def _fenced_turn(
        self, db: sqlite3.Connection, computer_id: str, turn_id: str, fence: int
    ) -> tuple[str, int]:
        """Check a write for a turn carries a live fence: (agent id, next event index)."""
        row = db.execute(
            "SELECT t.agent_id, t.computer_id, t.fence, t.status, t.next_index, c.epoch "
            "FROM turns t JOIN computers c ON c.id = t.computer_id WHERE t.id = ?",
            (turn_id,),
        ).fetchone()
        if row is None or row[1] != computer_id:
            raise NotFound(f"no turn {turn_id} on this computer")
        agent_id, _, turn_fence, status, next_index, epoch = row
        if status != "running":
            raise StaleTurn(
                f"turn {turn_id} is {status}, no longer running; stop it without acking"
            )
        if fence != turn_fence or epoch != turn_fence:
            raise StaleTurn(
                f"turn {turn_id} belongs to an older connection of this computer; stop it without acking"
            )
        return agent_id, next_index

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
        with self._write() as db:
            _, next_index = self._fenced_turn(db, computer_id, turn_id, fence)
            if first_index > next_index:
                gaps = orjson.loads(
                    db.execute("SELECT gaps FROM turns WHERE id = ?", (turn_id,)).fetchone()[0]
                )
                gaps.append({"from_index": next_index, "to_index": first_index - 1})
                db.execute(
                    "UPDATE turns SET gaps = ? WHERE id = ?", (orjson.dumps(gaps).decode(), turn_id)
                )
            db.executemany(
                "INSERT OR IGNORE INTO turn_events (turn_id, idx, type, at, data) VALUES (?, ?, ?, ?, ?)",
                [
                    (turn_id, first_index + i, e["type"], e["at"], e["data_json"])
                    for i, e in enumerate(events)
                ],
            )
            db.execute(
                "UPDATE turns SET next_index = MAX(next_index, ?) WHERE id = ?",
                (first_index + len(events), turn_id),
            )

    def finish_turn(
        self,
        computer_id: str,
        turn_id: str,
        fence: int,
        status: str,
        failure: dict[str, Any] | None,
        usage: dict[str, Any] | None,
    ) -> None:
        """Record a turn's result; usage summed from `step_finish` events when absent."""
        with self._write() as db:
            self._fenced_turn(db, computer_id, turn_id, fence)
            if usage is None:
                events = [
                    {"type": r[0], "data": orjson.loads(r[1])}
                    for r in db.execute(
                        "SELECT type, data FROM turn_events WHERE turn_id = ? AND type = 'step_finish'",
                        (turn_id,),
                    )
                ]
                usage = rules.usage_from_events(events)
            db.execute(
                "UPDATE turns SET status = ?, failure = ?, usage = ?, finished_at = ? WHERE id = ?",
                (
                    status,
                    orjson.dumps(failure).decode() if failure else None,
                    orjson.dumps(usage).decode(),
                    self._now(),
                    turn_id,
                ),
            )

    def ack(self, computer_id: str, agent_id: str, turn_id: str, fence: int) -> None:
        """Read := delivered in every room of the agent (the turn handled what it was given)."""
        with self._write() as db:
            self._own_agent(db, computer_id, agent_id)
            turn_agent, _ = self._fenced_turn(db, computer_id, turn_id, fence)
            if turn_agent != agent_id:
                raise Invalid(f"turn {turn_id} is not a turn of agent {agent_id}")
            db.execute(
                "UPDATE positions SET read_seq = delivered_seq "
                "WHERE agent_id = ? AND read_seq != delivered_seq",
                (agent_id,),
            )
            # The turn's claim was cut at its bound: wake the agent for the rest.
            if db.execute(
                "UPDATE agents SET claim_more = 0 WHERE id = ? AND claim_more = 1", (agent_id,)
            ).rowcount:
                self._wake(db, [agent_id])

    _TURN_COLS = (
        "id, agent_id, computer_id, fence, status, failure, rooms, input, engine, model, "
        "session_id, usage, gaps, started_at, finished_at"
    )

    @staticmethod
    def _turn_of(r: Sequence[Any]) -> dict[str, Any]:
        return {
            "id": r[0],
            "agent_id": r[1],
            "computer_id": r[2],
            "fence": r[3],
            "status": r[4],
            "failure": orjson.loads(r[5]) if r[5] else None,
            "rooms": orjson.loads(r[6]),
            "input": r[7],
            "engine": r[8],
            "model": r[9],
            "session_id": r[10],
            "usage": orjson.loads(r[11]) if r[11] else None,
            "gaps": orjson.loads(r[12]),
            "started_at": r[13],
            "finished_at": r[14],
        }

    def list_turns(self, agent_id: str | None, limit: int) -> list[dict[str, Any]]:
        """Turns without events, newest first (of one agent when given)."""
        with self._read() as db:
            if agent_id is None:
                rows = db.execute(
                    f"SELECT {self._TURN_COLS} FROM turns ORDER BY started_at DESC, rowid DESC LIMIT ?",
                    (limit,),
                ).fetchall()
            else:
                rows = db.execute(
                    f"SELECT {self._TURN_COLS} FROM turns WHERE agent_id = ? "
                    "ORDER BY started_at DESC, rowid DESC LIMIT ?",
                    (agent_id, limit),
                ).fetchall()
        return [self._turn_of(r) for r in rows]

    def get_turn(self, turn_id: str) -> dict[str, Any]:
        """A turn with its events in index order."""
        with self._read() as db:
            row = db.execute(
                f"SELECT {self._TURN_COLS} FROM turns WHERE id = ?", (turn_id,)
            ).fetchone()
            if row is None:
                raise NotFound(f"no turn {turn_id}")
            events = [
                {"index": e[0], "type": e[1], "at": e[2], "data": orjson.loads(e[3])}
                for e in db.execute(
                    "SELECT idx, type, at, data FROM turn_events WHERE turn_id = ? ORDER BY idx",
                    (turn_id,),
                )
            ]
        return {**self._turn_of(row), "events": events}

    # ------------------------------------------------------------------ SSE log

    def events_after(
        self, computer_id: str, after_id: int, limit: int = 500
    ) -> list[tuple[int, str, str]]:
        """(id, event, JSON data) of this Computer's events after `after_id`, oldest first."""
        with self._read() as db:
            return db.execute(
                "SELECT id, event, data FROM computer_events WHERE computer_id = ? AND id > ? "
                "ORDER BY id LIMIT ?",
                (computer_id, after_id, limit),
            ).fetchall()

    def replay_start(self, computer_id: str, last_id: int | None) -> tuple[int, list[str] | None]:
        """Where a stream resuming after `last_id` starts, and whom it must wake first.

        Without `last_id` (or with one newer than any event: a reset database) the stream
        starts at now. When the log was pruned past `last_id`, events of this Computer may
        be gone: the answer then lists every agent of this Computer (maybe none), so the
        stream resyncs and wakes them all (a spare wake costs one empty claim; a lost one
        leaves messages unread). None: nothing was lost.
        """
        with self._read() as db:
            newest = int(db.execute("SELECT MAX(id) FROM computer_events").fetchone()[0] or 0)
            if last_id is None or last_id > newest:
                return newest, None
            row = db.execute(
                "SELECT value FROM settings WHERE key = 'events_pruned_through'"
            ).fetchone()
            if row is None or last_id >= int(row[0]):
                return last_id, None
            agents = [
                r[0]
                for r in db.execute(
                    "SELECT id FROM agents WHERE computer_id = ? ORDER BY handle", (computer_id,)
                )
            ]
            return int(row[0]), agents

    def last_event_id(self) -> int:
        """The newest SSE event id of all Computers (0 when none)."""
        with self._read() as db:
            row = db.execute("SELECT MAX(id) FROM computer_events").fetchone()
        return int(row[0] or 0)

    # ------------------------------------------------------------------ tasks

    _TASK_SELECT = (
        "SELECT t.number, t.title, t.status, a.handle, t.room_id, t.host_message_id, t.thread_id, "
        "t.assignee_id FROM tasks t LEFT JOIN agents a ON a.id = t.assignee_id "
    )

    @staticmethod
    def _task_of(r: Sequence[Any]) -> dict[str, Any]:
        return {
            "number": r[0],
            "title": r[1],
            "status": r[2],
            "assignee": r[3],
            "room_id": r[4],
            "host_message_id": r[5],
            "thread_id": r[6],
        }

    def _task_row(
        self, db: sqlite3.Connection, number: int, room_id: str | None = None
    ) -> Sequence[Any]:
        """The task; when the caller names a room, it must be the task's room or thread."""
        row = db.execute(self._TASK_SELECT + "WHERE t.number = ?", (number,)).fetchone()
        if row is None:
            raise NotFound(f"no task #{number}")
        if room_id is not None and room_id not in (row[4], row[6]):
            raise NotFound(f"task #{number} is not in room {room_id}; list that room's tasks first")
        return row

    def _agent_by_handle(self, db: sqlite3.Connection, room_id: str, handle: str) -> str:
        handle = handle.removeprefix("@")
        row = db.execute("SELECT id FROM agents WHERE handle = ?", (handle,)).fetchone()
        if row is None:
            raise Refused(f"there is no agent @{handle}; check the handle")
        if not self._is_member(db, room_id, row[0]):
            raise Refused(f"@{handle} is not a member of this room; assign the task to a member")
        return str(row[0])

    def _check_actor_in(self, db: sqlite3.Connection, actor: Actor, room_id: str) -> None:
        if actor.kind == "agent":
            self._require_member(db, room_id, actor.id)
        else:
            self._room_row(db, room_id)

    def _task_room(self, db: sqlite3.Connection, room_id: str) -> str:
        """Tasks live in dms and groups; a thread stands for its group."""
        row = self._room_row(db, room_id)
        return row[3] if row[1] == "thread" and row[3] else row[0]

    def list_tasks(self, actor: Actor, room_id: str | None) -> list[dict[str, Any]]:
        """Tasks of a room (a thread stands for its group), or all the actor can see."""
        with self._read() as db:
            if room_id is None:
                if actor.kind == "agent":
                    rows = db.execute(
                        self._TASK_SELECT + "JOIN room_members rm ON rm.room_id = t.room_id "
                        "WHERE rm.agent_id = ? ORDER BY t.number",
                        (actor.id,),
                    ).fetchall()
                else:
                    rows = db.execute(self._TASK_SELECT + "ORDER BY t.number").fetchall()
            else:
                self._check_actor_in(db, actor, room_id)
                rows = db.execute(
                    self._TASK_SELECT + "WHERE t.room_id = ? ORDER BY t.number",
                    (self._task_room(db, room_id),),
                ).fetchall()
        return [self._task_of(r) for r in rows]

    def _new_task(
        self,
        db: sqlite3.Connection,
        actor: Actor,
        room_id: str,
        host_id: str,
        title: str,
        assignee: str | None,
    ) -> dict[str, Any]:
        assignee_id = self._agent_by_handle(db, room_id, assignee) if assignee else None
        thread_id, _ = self._thread_of(db, host_id)
        now = self._now()
        number = db.execute(
            "INSERT INTO tasks (title, status, assignee_id, room_id, host_message_id, thread_id, "
            "created_at, updated_at) VALUES (?, 'todo', ?, ?, ?, ?, ?, ?) RETURNING number",
            (title, assignee_id, room_id, host_id, thread_id, now, now),
        ).fetchone()[0]
        actor_text = rules.actor_text(actor.handle)
        detail = ""
        if assignee_id is not None:
            detail = f", assigned to @{assignee.removeprefix('@') if assignee else ''}"
        wakes = [assignee_id] if assignee_id and assignee_id != actor.id else []
        self._post(
            db,
            thread_id,
            None,
            rules.task_notice("created", number, actor_text, detail=detail),
            notice_wakes=wakes,
        )
        return self._task_of(self._task_row(db, number))

    def create_task(
        self, actor: Actor, room_id: str, title: str, assignee: str | None
    ) -> dict[str, Any]:
        """A task hosted on a new message (its title) in the room; its thread gets a notice."""
        with self._write() as db:
            self._check_actor_in(db, actor, room_id)
            room = self._task_room(db, room_id)
            host = self._post(db, room, actor if actor.kind == "agent" else USER, title)
            return self._new_task(db, actor, room, host["id"], title, assignee)

    def convert_task(self, actor: Actor, message_id: str, assignee: str | None) -> dict[str, Any]:
        """Turn an existing message into a task hosted on it (title: its first line)."""
        with self._write() as db:
            row = db.execute(
                "SELECT m.room_id, m.body, r.kind FROM messages m JOIN rooms r ON r.id = m.room_id "
                "WHERE m.id = ?",
                (message_id,),
            ).fetchone()
            if row is None:
                raise NotFound(f"no message {message_id}")
            room_id, body, kind = row
            self._check_actor_in(db, actor, room_id)
            if kind == "thread":
                raise Refused(
                    "a message inside a thread cannot become a task; convert the thread's first message"
                )
            existing = db.execute(
                "SELECT number FROM tasks WHERE host_message_id = ?", (message_id,)
            ).fetchone()
            if existing is not None:
                raise Refused(f"that message is already task #{existing[0]}")
            title = (body.strip().splitlines() or [""])[0][:200] or "(untitled)"
            return self._new_task(db, actor, room_id, message_id, title, assignee)

    def claim_task(self, actor: Actor, number: int, room_id: str | None = None) -> dict[str, Any]:
        """The actor takes the task (refused when someone else holds it)."""
        with self._write() as db:
            row = self._task_row(db, number, room_id)
            self._check_actor_in(db, actor, row[4])
            if row[7] is not None and row[7] != actor.id:
                raise Refused(
                    f"task #{number} is assigned to @{row[3]}; only @{row[3]} or the user can hand "
                    "it over — ask them to assign it to you"
                )
            status = "in_progress" if row[2] == "todo" else row[2]
            db.execute(
                "UPDATE tasks SET assignee_id = ?, status = ?, updated_at = ? WHERE number = ?",
                (actor.id, status, self._now(), number),
            )
            self._post(
                db,
                row[6],
                None,
                rules.task_notice("claimed", number, rules.actor_text(actor.handle)),
            )
            return self._task_of(self._task_row(db, number))

    def set_task_status(
        self, actor: Actor, number: int, status: str, note: str | None, room_id: str | None = None
    ) -> dict[str, Any]:
        """Move a task (agents: only their own) and post the notice in its thread."""
        with self._write() as db:
            row = self._task_row(db, number, room_id)
            self._check_actor_in(db, actor, row[4])
            if actor.kind == "agent":
                if row[7] is None:
                    raise Refused(
                        f"task #{number} has no assignee; claim it first (crew task claim {number})"
                    )
                if row[7] != actor.id:
                    raise Refused(
                        f"only the assignee (@{row[3]}) or the user can move task #{number}"
                    )
            db.execute(
                "UPDATE tasks SET status = ?, updated_at = ? WHERE number = ?",
                (status, self._now(), number),
            )
            wakes = [row[7]] if row[7] is not None and row[7] != actor.id else []
            text = rules.task_notice(
                "status",
                number,
                rules.actor_text(actor.handle),
                detail=status,
                note=(note or "").strip(),
            )
            self._post(db, row[6], None, text, notice_wakes=wakes)
            return self._task_of(self._task_row(db, number))

    def assign_task(
        self, actor: Actor, number: int, assignee: str, room_id: str | None = None
    ) -> dict[str, Any]:
        """Hand a task to a member (agents: when unassigned or their own)."""
        with self._write() as db:
            row = self._task_row(db, number, room_id)
            self._check_actor_in(db, actor, row[4])
            if actor.kind == "agent" and row[7] is not None and row[7] != actor.id:
                raise Refused(
                    f"task #{number} is assigned to @{row[3]}; only @{row[3]} or the user can reassign it"
                )
            assignee_id = self._agent_by_handle(db, row[4], assignee)
            db.execute(
                "UPDATE tasks SET assignee_id = ?, updated_at = ? WHERE number = ?",
                (assignee_id, self._now(), number),
            )
            wakes = [assignee_id] if assignee_id != actor.id else []
            text = rules.task_notice(
                "assigned",
                number,
                rules.actor_text(actor.handle),
                detail=f"@{assignee.removeprefix('@')}",
            )
            self._post(db, row[6], None, text, notice_wakes=wakes)
            return self._task_of(self._task_row(db, number))

    # ------------------------------------------------------------------ reminders

    _REMINDER_COLS = (
        "id, agent_id, room_id, title, next_at, every, daily, weekly_day, weekly_time, tz"
    )

    @staticmethod
    def _reminder_of(r: Sequence[Any]) -> dict[str, Any]:
        return {
            "id": r[0],
            "agent_id": r[1],
            "room_id": r[2],
            "title": r[3],
            "next_at": r[4],
            "every": r[5],
            "daily": r[6],
            "weekly": {"day": r[7], "time": r[8]} if r[7] is not None else None,
            "tz": r[9],
        }

    def create_reminder(
        self, agent: AgentIdentity, room_id: str, title: str, schedule: rules.Schedule
    ) -> dict[str, Any]:
        """A reminder of an agent in a room it belongs to."""
        reminder_id = new_id()
        with self._write() as db:
            self._require_member(db, room_id, agent.agent_id)
            next_at = rules.first_fire(schedule, self.clock.now())
            db.execute(
                f"INSERT INTO reminders ({self._REMINDER_COLS}, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    reminder_id,
                    agent.agent_id,
                    room_id,
                    title,
                    iso(next_at),
                    schedule.every,
                    schedule.daily,
                    schedule.weekly_day,
                    schedule.weekly_time,
                    schedule.tz,
                    self._now(),
                ),
            )
            row = db.execute(
                f"SELECT {self._REMINDER_COLS} FROM reminders WHERE id = ?", (reminder_id,)
            ).fetchone()
        return self._reminder_of(row)

    def list_reminders(self, agent_id: str) -> list[dict[str, Any]]:
        """An agent's reminders, soonest first."""
        with self._read() as db:
            rows = db.execute(
                f"SELECT {self._REMINDER_COLS} FROM reminders WHERE agent_id = ? ORDER BY next_at, id",
                (agent_id,),
            ).fetchall()
        return [self._reminder_of(r) for r in rows]

    def delete_reminder(self, agent_id: str, reminder_id: str) -> None:
        """Cancel one of the agent's reminders."""
        with self._write() as db:
            gone = db.execute(
                "DELETE FROM reminders WHERE id = ? AND agent_id = ?", (reminder_id, agent_id)
            ).rowcount
        if not gone:
            raise NotFound(f"no reminder {reminder_id} of yours; list them with crew remind list")

    def next_reminder_at(self) -> datetime | None:
        """When the next reminder is due, or None."""
        with self._read() as db:
            row = db.execute("SELECT MIN(next_at) FROM reminders").fetchone()
        return parse_iso(row[0]) if row and row[0] else None

    def fire_due_reminders(self) -> int:
        """Post the notice of every due reminder, wake its agent, reschedule or drop it."""
        now = self.clock.now()
        fired = 0
        qualified = ", ".join(f"r.{c.strip()}" for c in self._REMINDER_COLS.split(","))
        with self._write() as db:
            due = db.execute(
                f"SELECT {qualified}, a.handle FROM reminders r "
                "JOIN agents a ON a.id = r.agent_id WHERE r.next_at <= ? ORDER BY r.next_at, r.id",
                (iso(now),),
            ).fetchall()
            for r in due:
                reminder = self._reminder_of(r)
                self._post(
                    db,
                    reminder["room_id"],
                    None,
                    rules.reminder_notice(r[10], reminder["title"]),
                    notice_wakes=[reminder["agent_id"]],
                )
                schedule = rules.Schedule(
                    at=None if (r[5] or r[6] or r[7]) else parse_iso(r[4]),
                    every=r[5],
                    daily=r[6],
                    weekly_day=r[7],
                    weekly_time=r[8],
                    tz=r[9],
                )
                following = rules.next_fire(schedule, parse_iso(r[4]), now)
                if following is None:
                    db.execute("DELETE FROM reminders WHERE id = ?", (r[0],))
                else:
                    db.execute(
                        "UPDATE reminders SET next_at = ? WHERE id = ?", (iso(following), r[0])
                    )
                fired += 1
        return fired

    # ------------------------------------------------------------------ mutes

    def mute(self, agent: AgentIdentity, room_id: str, until: datetime | None) -> dict[str, Any]:
        """Mute a group for an agent until `until` (15 minutes – 7 days ahead) or until unmuted."""
        with self._write() as db:
            self._require_member(db, room_id, agent.agent_id)
            kind = self._room_row(db, room_id)[1]
            if kind != "group":
                raise Refused(
                    f"only groups can be muted; a {kind} always wakes you (you can leave it unanswered)"
                )
            try:
                rules.check_mute_until(until, self.clock.now())
            except ValueError as exc:
                raise Refused(str(exc)) from exc
            until_text = iso(until) if until is not None else None
            db.execute(
                "INSERT OR REPLACE INTO mutes VALUES (?, ?, ?)",
                (agent.agent_id, room_id, until_text),
            )
        return {"room_id": room_id, "until": until_text}

    def unmute(self, agent_id: str, room_id: str) -> None:
        """Lift a mute. Wakes nobody: what arrived meanwhile waits for the next wake-up."""
        with self._write() as db:
            if db.execute("SELECT 1 FROM agents WHERE id = ?", (agent_id,)).fetchone() is None:
                raise NotFound(f"no agent {agent_id}")
            self._room_row(db, room_id)
            db.execute("DELETE FROM mutes WHERE agent_id = ? AND room_id = ?", (agent_id, room_id))
