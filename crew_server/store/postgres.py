"""The PostgreSQL backend: one database that several `crew-server` processes share.

Like SQLite, each process runs its statements inline on one connection under a
lock (a request's work is a few indexed statements; a process serves more by
being one of several). What several processes need:

- Write transactions are SERIALIZABLE: claims, HELD answers, fencing epochs and
  acks racing for one agent across processes behave as if they ran one after the
  other. The loser of a conflict gets a serialization failure; `attempt` runs the
  whole store operation again (each does at most one write), and answers 503
  `database_unavailable` after `ATTEMPTS` tries.
- SSE ids come from one identity column. A Computer's events must become visible
  in id order (a stream reads after its cursor), so appending them takes that
  Computer's advisory lock until the commit (`Transaction.serialize`).
- Streams in other processes hear of commits by LISTEN/NOTIFY: a write notifies
  `crew_events` with each Computer it appended events for, in the same
  transaction (delivered at the commit); `follow_other_processes` listens.
- Reminders: `fire_due_reminders` serializes on an advisory lock, and the
  serializable write makes a reminder fire exactly once.

Statements are written once for both backends, with `?` placeholders (turned into
psycopg's `%s` here) and `ON CONFLICT` upserts.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, TypeVar

import anyio

from crew_server.clock import Clock
from crew_server.errors import DatabaseUnavailable, StorageFull
from crew_server.store.db import (
    Cursor,
    Database,
    Transaction,
    claim_pending,
    migration_files,
)

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.rows import dict_row
except ImportError as missing:  # pragma: no cover - the package is in the test extras
    raise RuntimeError(
        "--db postgresql:// needs the psycopg package: pip install 'crew-computer[postgresql]'"
    ) from missing

log = logging.getLogger("crew_server.store.postgres")

T = TypeVar("T")

CHANNEL = "crew_events"
# Notified (empty payload) by every write that changed rows: the web's live streams.
CHANGED_CHANNEL = "crew_changed"
# How often one store operation is tried when concurrent writers keep conflicting.
ATTEMPTS = 30
# Advisory lock keys (any constants; one namespace per database).
MIGRATION_LOCK = 7_311_001
STATEMENT_TIMEOUT_MS = 10_000


@lru_cache(maxsize=1024)
def to_psycopg(sql: str) -> str:
    """Our `?` placeholders as psycopg's `%s` (a literal `%` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


class PostgresStatements:
    """Runs the store's SQL on one psycopg connection."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self._connection = connection

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        """Run one statement."""
        return self._connection.execute(to_psycopg(sql), params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Cursor:
        """Run one statement per row of parameters (pipelined by psycopg)."""
        cursor = self._connection.cursor()
        cursor.executemany(to_psycopg(sql), rows)
        return cursor


class PostgresTransaction(Transaction):
    """A write transaction that can wait for other processes' transactions."""

    def __init__(self, database: Database, statements: PostgresStatements) -> None:
        super().__init__(database, statements)
        self._statements = statements

    def serialize(self, name: str) -> None:
        """Wait for (and then hold off) every other transaction naming `name`, until commit."""
        self._statements.execute("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", (name,))


class PostgresDatabase(Database):
    """One connection per process (under a lock), plus one listening for notifications."""

    dialect = "postgresql"

    def __init__(self, url: str, clock: Clock, *, event_log_keep: int, prune_every: int) -> None:
        super().__init__(clock, event_log_keep=event_log_keep, prune_every=prune_every)
        self.url = url
        self._lock = threading.RLock()
        self._attempting = threading.local()
        self._connection = self._connect()
        self._migrate()

    def _connect(self) -> psycopg.Connection[Any]:
        connection = psycopg.connect(self.url, autocommit=True, row_factory=dict_row)
        # A statement stuck behind another process's lock must not hold the loop forever.
        connection.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
        return connection

    def _live_connection(self) -> psycopg.Connection[Any]:
        """The connection, opened again when the last one broke (a database restart)."""
        if self._connection.closed or self._connection.broken:
            log.warning("the database connection was lost; connecting again")
            self._connection = self._connect()
        return self._connection

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._connection.close()

    def _migrate(self) -> None:
        """Apply the missing migrations; processes starting together take turns."""
        with self._lock:
            db = self._connection
            db.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
            try:
                db.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY)"
                )
                done = {r["version"] for r in db.execute("SELECT version FROM schema_migrations")}
                for version, file in migration_files(self.dialect):
                    if version in done:
                        continue
                    with db.transaction():
                        db.execute(file.read_text(encoding="utf-8").encode())
                        db.execute("INSERT INTO schema_migrations VALUES (%s)", (version,))
                    log.info("applied migration postgresql/%s", file.name)
            finally:
                db.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))

    def attempt(self, call: Callable[[], T]) -> T:
        """Run one store operation; again (after a short random pause) on a conflict."""
        if getattr(self._attempting, "active", False):
            return call()  # an operation calling another: the outer one retries
        self._attempting.active = True
        try:
            for attempt in range(ATTEMPTS):
                try:
                    return call()
                except (pg_errors.SerializationFailure, pg_errors.DeadlockDetected) as exc:
                    conflict = exc
                    # Jittered, growing, and short: the loop of this process waits too.
                    time.sleep(random.uniform(0, min(0.02, 0.0005 * 2**attempt)))
            log.warning("gave up after %d conflicting attempts: %s", ATTEMPTS, conflict)
            raise DatabaseUnavailable(
                "the database is busy with conflicting writes; retry in a moment"
            ) from conflict
        finally:
            self._attempting.active = False

    @contextmanager
    def write(self) -> Iterator[Transaction]:
        """One serializable write transaction; notifications go out with its commit."""
        with self._lock, _database_errors():
            connection = self._live_connection()
            statements = PostgresStatements(connection)
            tx = PostgresTransaction(self, statements)
            connection.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
            try:
                yield tx
                claim_pending(tx)
                if tx.touched:
                    connection.execute(
                        "SELECT pg_notify(%s, c) FROM unnest(%s::text[]) AS c",
                        (CHANNEL, sorted(tx.touched)),
                    )
                if tx.changed:
                    connection.execute("SELECT pg_notify(%s, '')", (CHANGED_CHANNEL,))
                connection.execute("COMMIT")
            except BaseException:
                if not connection.closed and not connection.broken:
                    try:
                        connection.execute("ROLLBACK")
                    except psycopg.Error as failed:
                        # The error that matters is the one being raised; the next
                        # transaction opens a new connection if this one is broken.
                        log.warning("rolling back failed too: %s", failed)
                raise
        if tx.touched and self.listener is not None:
            self.listener(tx.touched)
        if tx.changed and self.changed_listener is not None:
            self.changed_listener()

    @contextmanager
    def read(self) -> Iterator[Transaction]:
        """Reads, each statement seeing every committed write (autocommit)."""
        with self._lock, _database_errors():
            yield Transaction(self, PostgresStatements(self._live_connection()))

    def own_backend_pid(self) -> int:
        """The server process id of our write connection (its notifications are ours)."""
        return int(self._connection.info.backend_pid)

    async def follow_other_processes(
        self, notify: Callable[[set[str]], None], notify_all: Callable[[], None]
    ) -> None:
        """LISTEN for commits of other processes and pass their Computers to `notify`,
        and any change to `changed_listener` (the web's live streams).

        Our own commits are told to the listeners directly (skipped here). After a lost
        connection every stream is woken: notifications in between are gone, and a
        spare wake only makes a stream read its (empty) tail.
        """
        first = True
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True
                ) as listening:
                    await listening.execute(f"LISTEN {CHANNEL}")
                    await listening.execute(f"LISTEN {CHANGED_CHANNEL}")
                    if not first:
                        notify_all()
                        self._changed_elsewhere()
                    first = False
                    async for note in listening.notifies():
                        if note.pid == self.own_backend_pid():
                            continue
                        if note.channel == CHANGED_CHANNEL:
                            self._changed_elsewhere()
                        else:
                            notify({note.payload})
            except psycopg.OperationalError as exc:
                log.warning("listening for other server processes failed (%s); again in 1 s", exc)
                await anyio.sleep(1)

    def _changed_elsewhere(self) -> None:
        """Another process committed a change (or we may have missed some)."""
        if self.changed_listener is not None:
            self.changed_listener()


@contextmanager
def _database_errors() -> Iterator[None]:
    """A full disk or a lost database answers 503 (the request can be sent again)."""
    try:
        yield
    except pg_errors.DiskFull as exc:
        log.error("the database could not be written: %s (the disk is full)", exc)
        raise StorageFull(
            "the database server's disk is full: nothing was stored. Free some space "
            "there; the same request works again then"
        ) from exc
    except (pg_errors.SerializationFailure, pg_errors.DeadlockDetected):
        raise  # `attempt` runs the operation again
    except psycopg.OperationalError as exc:
        log.error("the database failed: %s", exc)
        raise DatabaseUnavailable(
            "the crew server lost its database for a moment; send the request again"
        ) from exc
