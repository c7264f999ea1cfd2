"""The Store's database: the backends, their transactions, migrations, the SSE log.

`open_database(location)` picks the backend: a file path or `:memory:` is SQLite
(this module), a `postgresql://` URL is PostgreSQL (`crew_server.store.postgres`).
The aggregate modules write one SQL for both (`?` placeholders, `ON CONFLICT`
upserts) and run it through a `Transaction`; what differs (locks, notifications,
retries) lives in the backend.

SQLite: one connection guarded by a lock. Every request's work is a few indexed
statements, so callers run them inline instead of hopping to a thread pool. The
file database runs in WAL mode; `:memory:` serves the tests. The schema comes
from the numbered files in `crew_server/migrations/`, applied at open. Rows are
read by column name (`sqlite3.Row` here, dicts on PostgreSQL).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable
from typing import Any, Protocol, TypeVar

import orjson

from crew_server.clock import Clock, iso
from crew_server.errors import StorageFull

log = logging.getLogger("crew_server.store")

# How many SSE events are kept for replay after Last-Event-ID (all Computers together).
EVENT_LOG_KEEP = 50_000
PRUNE_EVERY = 1_000

T = TypeVar("T")


def new_id() -> str:
    """A fresh UUID (text), the form of every id."""
    return str(uuid.uuid4())


def is_postgres_url(location: str) -> bool:
    """Whether `--db` names a PostgreSQL database rather than a SQLite file."""
    return location.startswith(("postgresql://", "postgres://"))


def migration_files(dialect: str) -> list[tuple[int, Traversable]]:
    """(version, file) of the numbered migrations of a dialect, oldest first.

    SQLite's live in `crew_server/migrations/`, PostgreSQL's twins (same numbers) in
    `crew_server/migrations/postgresql/`.
    """
    folder = resources.files("crew_server.migrations")
    if dialect == "postgresql":
        folder = folder.joinpath("postgresql")
    files = [f for f in folder.iterdir() if f.name.endswith(".sql")]
    return sorted(((int(f.name.split("_", 1)[0]), f) for f in files), key=lambda vf: vf[0])


class Cursor(Protocol):
    """What a statement gives back, on either backend."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Statements(Protocol):
    """Runs SQL on one connection (sqlite3's connection, or the PostgreSQL adapter)."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Cursor: ...


class Database:
    """A backend: hands out read and write transactions; tells the listener of commits."""

    dialect = ""

    def __init__(self, clock: Clock, *, event_log_keep: int, prune_every: int) -> None:
        self.clock = clock
        self.event_log_keep = event_log_keep
        self.prune_every = prune_every
        self.events_since_prune = 0
        # Called after a commit with the ids of Computers that have new SSE events.
        self.listener: Callable[[set[str]], None] | None = None
        # Called after a commit that changed rows (in any process): the web's live
        # streams look at the store again (crew_server/web/live.py).
        self.changed_listener: Callable[[], None] | None = None

    def write(self) -> AbstractContextManager[Transaction]:
        """One write transaction; SSE listeners hear about new events after the commit."""
        raise NotImplementedError

    def read(self) -> AbstractContextManager[Transaction]:
        """Reads that see every committed write."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the connections."""
        raise NotImplementedError

    def attempt(self, call: Callable[[], T]) -> T:
        """Run one store operation; a backend with conflicting writers retries it here."""
        return call()

    async def follow_other_processes(
        self, notify: Callable[[set[str]], None], notify_all: Callable[[], None]
    ) -> None:
        """Tell `notify` of commits by other server processes until cancelled; `notify_all`
        when some may have gone unheard. SQLite has one process: nothing to do."""


def open_database(
    location: str, clock: Clock, *, event_log_keep: int, prune_every: int
) -> Database:
    """The backend `location` names: a PostgreSQL URL, else a SQLite file or `:memory:`."""
    if is_postgres_url(location):
        from crew_server.store.postgres import PostgresDatabase

        return PostgresDatabase(
            location, clock, event_log_keep=event_log_keep, prune_every=prune_every
        )
    return SqliteDatabase(location, clock, event_log_keep=event_log_keep, prune_every=prune_every)


class SqliteDatabase(Database):
    """One SQLite connection and its lock (one server process)."""

    dialect = "sqlite"

    def __init__(self, path: str, clock: Clock, *, event_log_keep: int, prune_every: int) -> None:
        super().__init__(clock, event_log_keep=event_log_keep, prune_every=prune_every)
        self._lock = threading.RLock()
        self.connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.connection.row_factory = sqlite3.Row
        self.connection.execute("PRAGMA foreign_keys = ON")
        self.connection.execute("PRAGMA busy_timeout = 5000")
        if path != ":memory:":
            self.connection.execute("PRAGMA journal_mode = WAL")
            # WAL + NORMAL: a crash may lose the last commits but never corrupts the file.
            self.connection.execute("PRAGMA synchronous = NORMAL")
        self._migrate()

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self.connection.close()

    def _migrate(self) -> None:
        with self._lock:
            db = self.connection
            db.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY)")
            done = {r["version"] for r in db.execute("SELECT version FROM schema_migrations")}
            for version, file in migration_files(self.dialect):
                if version in done:
                    continue
                script = file.read_text(encoding="utf-8")
                # executescript commits on its own; the version row goes in the same script.
                db.executescript(
                    f"BEGIN;\n{script}\nINSERT INTO schema_migrations VALUES ({version});\nCOMMIT;"
                )
                log.info("applied migration %s", file.name)

    @contextmanager
    def write(self) -> Iterator[Transaction]:
        """One write transaction; SSE listeners hear about new events after the commit."""
        with self._lock, _disk_full_is_503():
            tx = Transaction(self, self.connection)
            self.connection.execute("BEGIN IMMEDIATE")
            try:
                yield tx
                claim_pending(tx)
                self.connection.execute("COMMIT")
            except BaseException:
                # SQLite rolls back by itself on some errors (a full disk among them):
                # a second ROLLBACK would fail and hide the error that matters.
                if self.connection.in_transaction:
                    self.connection.execute("ROLLBACK")
                raise
        if tx.touched and self.listener is not None:
            self.listener(tx.touched)
        if tx.changed and self.changed_listener is not None:
            self.changed_listener()

    @contextmanager
    def read(self) -> Iterator[Transaction]:
        """Reads under the lock (they see every committed write)."""
        with self._lock, _disk_full_is_503():
            yield Transaction(self, self.connection)


@contextmanager
def _disk_full_is_503() -> Iterator[None]:
    """A full disk is the machine's state, not a bug: say so (503), and keep serving."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_FULL:
            raise
        log.error("the database could not be written: %s (the disk is full)", exc)
        raise StorageFull(
            "the crew server's disk is full: nothing was stored. Free some space on the "
            "server; the same request works again then"
        ) from exc


class Transaction:
    """Statements run inside one `Database.write` (or `read`), and the SSE events they add."""

    def __init__(self, database: Database, statements: Statements) -> None:
        self._database = database
        self._db = statements
        # Computers with new SSE events, told to the listener after the commit.
        self.touched: set[str] = set()
        # False when the operation commits without doing what was asked (a HELD reply
        # records delivery only): its idempotency key is not taken, a retry runs again.
        self.effective = True
        # Whether a statement changed rows: only then are the web's streams told.
        self.changed = False

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        """Run one statement."""
        cursor = self._db.execute(sql, params)
        if cursor.rowcount > 0 and sql.lstrip()[:6].upper() != "SELECT":
            self.changed = True
        return cursor

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Cursor:
        """Run one statement per row of parameters."""
        self.changed = True
        return self._db.executemany(sql, rows)

    def now(self) -> str:
        """The clock's time as stored text."""
        return iso(self._database.clock.now())

    def serialize(self, name: str) -> None:
        """Transactions naming the same `name` run one after the other (SQLite: all do)."""

    def emit(self, computer_id: str, event: str, data: dict[str, Any]) -> None:
        """Append one SSE event for a Computer."""
        self.emit_many([(computer_id, event, data)])

    def emit_many(self, events: Sequence[tuple[str, str, dict[str, Any]]]) -> None:
        """Append SSE events (computer id, event, data) to the log, in order."""
        # A Computer's events must commit in id order (a stream reads after its cursor).
        for computer_id in sorted({c for c, _, _ in events} - self.touched):
            self.serialize(f"events:{computer_id}")
        now = self.now()
        self._db.executemany(
            "INSERT INTO computer_events (computer_id, event, data, created_at) VALUES (?, ?, ?, ?)",
            [(c, e, orjson.dumps(d).decode(), now) for c, e, d in events],
        )
        self.touched.update(c for c, _, _ in events)
        database = self._database
        database.events_since_prune += len(events)
        if database.events_since_prune >= database.prune_every:
            database.events_since_prune = 0
            self._prune(database.event_log_keep)

    def _prune(self, keep: int) -> None:
        through = self._db.execute("SELECT MAX(id) AS newest FROM computer_events").fetchone()
        through = through["newest"] - keep
        if through > 0:
            self._db.execute("DELETE FROM computer_events WHERE id <= ?", (through,))
            # Remembered so a stream resuming from before it knows it missed events.
            row = self._db.execute(
                "SELECT value FROM settings WHERE key = 'events_pruned_through'"
            ).fetchone()
            if row is None or int(row["value"]) < through:
                self._db.execute(
                    "INSERT INTO settings VALUES ('events_pruned_through', ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (str(through),),
                )

    def wake(self, agent_ids: Iterable[str]) -> None:
        """A `wake` to the Computer of each agent (agents on no Computer wait unread)."""
        ids = list(agent_ids)
        if not ids:
            return
        marks = ",".join("?" * len(ids))
        rows = self._db.execute(
            f"SELECT id, computer_id FROM agents WHERE id IN ({marks}) AND computer_id IS NOT NULL",
            ids,
        ).fetchall()
        woken = sorted((r["id"], r["computer_id"]) for r in rows)
        self.emit_many([(c, "wake", {"agent_id": a}) for a, c in woken])


class StorePart:
    """What every part of the `Store` shares: the database, the clock, the claim bound."""

    clock: Clock
    _database: Database
    _claim_max_messages: int
    _claim_max_chars: int


class EventLog(StorePart):
    """The bounded log of SSE events per Computer, replayed after Last-Event-ID."""

    def events_after(
        self, computer_id: str, after_id: int, limit: int = 500
    ) -> list[tuple[int, str, str]]:
        """(id, event, JSON data) of this Computer's events after `after_id`, oldest first."""
        with self._database.read() as tx:
            rows = tx.execute(
                "SELECT id, event, data FROM computer_events WHERE computer_id = ? AND id > ? "
                "ORDER BY id LIMIT ?",
                (computer_id, after_id, limit),
            ).fetchall()
        return [(r["id"], r["event"], r["data"]) for r in rows]

    def replay_start(self, computer_id: str, last_id: int | None) -> tuple[int, list[str] | None]:
        """Where a stream resuming after `last_id` starts, and whom it must wake first.

        Without `last_id` (or with one newer than any event: a reset database) the stream
        starts at now. When the log was pruned past `last_id`, events of this Computer may
        be gone: the answer then lists every agent of this Computer (maybe none), so the
        stream resyncs and wakes them all (a spare wake costs one empty claim; a lost one
        leaves messages unread). None: nothing was lost.
        """
        with self._database.read() as tx:
            row = tx.execute("SELECT MAX(id) AS newest FROM computer_events").fetchone()
            newest = int(row["newest"] or 0)
            if last_id is None or last_id > newest:
                # This Computer's newest, not everyone's: with several server processes
                # an event of this Computer may hold a smaller id yet commit later.
                row = tx.execute(
                    "SELECT MAX(id) AS newest FROM computer_events WHERE computer_id = ?",
                    (computer_id,),
                ).fetchone()
                return int(row["newest"] or 0), None
            row = tx.execute(
                "SELECT value FROM settings WHERE key = 'events_pruned_through'"
            ).fetchone()
            if row is None or last_id >= int(row["value"]):
                return last_id, None
            agents = [
                r["id"]
                for r in tx.execute(
                    "SELECT id FROM agents WHERE computer_id = ? ORDER BY handle", (computer_id,)
                )
            ]
            return int(row["value"]), agents

    def last_event_id(self) -> int:
        """The newest SSE event id of all Computers (0 when none)."""
        with self._database.read() as tx:
            row = tx.execute("SELECT MAX(id) AS newest FROM computer_events").fetchone()
        return int(row["newest"] or 0)


# ------------------------------------------------ idempotency keys (store/writes.py)


@dataclass
class PendingWrite:
    """The key of the agent write the current request makes (set by the API)."""

    agent_id: str
    turn_id: str
    key: str
    fingerprint: str


class DuplicateWrite(Exception):
    """The key is already taken (another request with it committed first)."""


PENDING: ContextVar[PendingWrite | None] = ContextVar("pending_write", default=None)


def claim_pending(tx: Transaction) -> None:
    """Take the current request's key inside its write transaction (both backends call
    this before COMMIT); DuplicateWrite rolls the write back when the key is taken."""
    pending = PENDING.get()
    if pending is None or not tx.effective:
        return
    now = tx.now()
    taken = tx.execute(
        "INSERT INTO agent_writes (agent_id, turn_id, key, fingerprint, created_at) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (agent_id, turn_id, key) DO NOTHING",
        (pending.agent_id, pending.turn_id, pending.key, pending.fingerprint, now),
    )
    if taken.rowcount == 0:
        raise DuplicateWrite(pending.key)
