"""A private PostgreSQL cluster for tests and benchmarks: `initdb` into a temporary
directory, listening only on a Unix socket there, stopped and removed at the end.

Debian's server binaries live in `/usr/lib/postgresql/<major>/bin` (not on PATH).
PostgreSQL refuses to run as root, so as root the cluster belongs to the `postgres`
user (created by Debian's package); the server process is that user, our clients
connect over the socket as the database superuser `postgres`.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

_COMMON_SETTINGS = "-c max_connections=200 -c shared_buffers=64MB -c listen_addresses=''"
# Durability is not what tests measure: no fsync makes each CREATE DATABASE cheap.
TEST_SETTINGS = f"-c fsync=off -c synchronous_commit=off -c full_page_writes=off {_COMMON_SETTINGS}"
# Benchmarks: what SQLite's WAL + synchronous=NORMAL promises (a crash may lose the last
# commits, never corrupts), so the two backends are measured alike.
BENCH_SETTINGS = f"-c synchronous_commit=off {_COMMON_SETTINGS}"


class PostgresMissing(RuntimeError):
    """Debian's PostgreSQL server is not installed (scripts/setup installs it)."""


def server_binaries() -> Path:
    """The directory with `initdb`, `pg_ctl` and `postgres` (the newest major installed)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4])
    )
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(on_path).parent
    raise PostgresMissing(
        "PostgreSQL's server is not installed (no pg_ctl); run scripts/setup, or "
        "apt-get install postgresql"
    )


class PostgresCluster:
    """One running cluster; `new_database()` hands out fresh, empty databases."""

    def __init__(self, root: Path, bin_dir: Path, owner: str | None) -> None:
        self.root = root
        self.data = root / "data"
        self.socket_dir = root
        self._bin = bin_dir
        self._owner = owner
        self._count = 0
        self._schemas_database = False
        self._lock = threading.Lock()

    @classmethod
    def start(cls, settings: str = TEST_SETTINGS) -> PostgresCluster:
        """initdb + pg_ctl start in a new temporary directory (`settings`: server options)."""
        bin_dir = server_binaries()
        root = Path(tempfile.mkdtemp(prefix="crew-pg-"))
        owner = "postgres" if os.geteuid() == 0 else None
        if owner is not None:
            try:
                entry = pwd.getpwnam(owner)
            except KeyError:
                shutil.rmtree(root, ignore_errors=True)
                raise PostgresMissing(
                    "running as root, the cluster needs the unprivileged user 'postgres' "
                    "(Debian's postgresql package creates it; scripts/setup installs that)"
                ) from None
            os.chown(root, entry.pw_uid, entry.pw_gid)
        cluster = cls(root, bin_dir, owner)
        cluster._run(
            "initdb", "-D", str(cluster.data), "-U", "postgres", "--auth=trust",
            "--no-locale", "--encoding=UTF8", "--no-sync",
        )  # fmt: skip
        cluster._run(
            "pg_ctl", "-D", str(cluster.data), "-l", str(root / "server.log"), "-w",
            "-o", f"{settings} -k {root}", "start",
        )  # fmt: skip
        return cluster

    def url(self, database: str = "postgres") -> str:
        """A libpq URL of `database` over the cluster's Unix socket."""
        return f"postgresql://postgres@/{database}?host={quote(str(self.socket_dir), safe='')}"

    def new_database(self, template: str = "template0") -> str:
        """Create an empty database (a copy of `template`) and return its URL."""
        with self._lock:
            self._count += 1
            name = f"crew_{os.getpid()}_{self._count}"
        self.sql(f"CREATE DATABASE {name} TEMPLATE {template} STRATEGY FILE_COPY")
        return self.url(name)

    def new_schema(self) -> str:
        """A URL of a fresh, empty schema in the shared test database (cheaper than a
        database: one `CREATE SCHEMA`); the store creates its tables there."""
        with self._lock:
            if not self._schemas_database:
                self.sql("CREATE DATABASE crew_tests TEMPLATE template0")
                self._schemas_database = True
            self._count += 1
            name = f"crew_{os.getpid()}_{self._count}"
        self.sql(f"CREATE SCHEMA {name}", "crew_tests")
        return self.url("crew_tests") + "&options=" + quote(f"-c search_path={name}", safe="")

    def copy_schema(self, url: str) -> str:
        """A new schema holding a copy of the tables and rows of the schema `url` names
        (without foreign keys: a snapshot to try things on)."""
        import psycopg

        source = _schema_of(url)
        copy = self.new_schema()
        target = _schema_of(copy)
        with psycopg.connect(self.url("crew_tests"), autocommit=True) as conn, conn.transaction():
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = %s", (source,)
                )
            ]
            for table in tables:
                conn.execute(
                    f"CREATE TABLE {target}.{table} (LIKE {source}.{table} INCLUDING ALL)".encode()
                )
                conn.execute(
                    f"INSERT INTO {target}.{table} OVERRIDING SYSTEM VALUE "
                    f"SELECT * FROM {source}.{table}".encode()
                )
            identities = conn.execute(
                "SELECT table_name, column_name FROM information_schema.columns "
                "WHERE table_schema = %s AND is_identity = 'YES'",
                (target,),
            ).fetchall()
            for table, column in identities:
                # The copied rows keep their numbers: new ones continue after them.
                conn.execute(
                    f"SELECT setval(pg_get_serial_sequence('{target}.{table}', '{column}'), "
                    f"COALESCE(MAX({column}), 0) + 1, false) FROM {target}.{table}".encode()
                )
        return copy

    def sql(self, statement: str, database: str = "postgres") -> None:
        """Run one statement as the superuser (outside any transaction)."""
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            conn.execute(statement.encode())

    def stop(self) -> None:
        """Stop the server (fast: open connections are ended) and remove its files."""
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self._bin / tool), *args]
        done = subprocess.run(
            command, user=self._owner, capture_output=True, text=True, cwd=self.root, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{tool} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}"
            )


def _schema_of(url: str) -> str:
    """The schema a `new_schema` URL puts first on the search path."""
    options = parse_qs(urlsplit(url).query)["options"][0]
    return options.removeprefix("-c search_path=")
