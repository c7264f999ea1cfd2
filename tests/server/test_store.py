"""The storage module: migrations once, data kept across restarts, tokens stored hashed."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from crew_server.clock import Clock
from crew_server.store import Store, hash_token


def test_a_file_database_keeps_everything_across_restarts(tmp_path: Path) -> None:
    db = tmp_path / "crew.db"
    store = Store(str(db), Clock())
    computer_id, token = store.create_computer("box")
    agent = store.create_agent("alice", "Alice", "", "m/x", "opencode", computer_id)
    room, _ = store.create_room("dm", None, [agent["id"]])
    store.user_post(room["id"], "hello", None)
    store.close()

    again = Store(str(db), Clock())
    assert again.computer_by_token(token) == computer_id
    assert [m["body"] for m in again.list_messages(room["id"], 0, 10)] == ["hello"]
    assert again.user_post(room["id"], "again", None)["seq"] == 2
    again.close()
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT version FROM schema_migrations").fetchall() == [(1,)]
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_tokens_are_stored_hashed(tmp_path: Path) -> None:
    db = tmp_path / "crew.db"
    store = Store(str(db), Clock())
    user_token = store.ensure_user_token()
    computer_id, computer_token = store.create_computer("box")
    agent = store.create_agent("alice", "Alice", "", "m/x", "opencode", computer_id)
    agent_token = store.issue_agent_token(computer_id, agent["id"])
    store.close()
    raw = b"".join(path.read_bytes() for path in tmp_path.glob("crew.db*"))
    assert user_token is not None
    for token in (user_token, computer_token, agent_token):
        assert token.encode() not in raw
        assert hash_token(token).encode() in raw
