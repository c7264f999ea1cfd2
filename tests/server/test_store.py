"""The storage module: migrations once, data kept across restarts, tokens stored hashed."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from crew_server.clock import Clock
from crew_server.store import Store, hash_token

MIGRATIONS = sorted(
    int(f.name.split("_", 1)[0])
    for f in (Path(__file__).resolve().parents[2] / "crew_server" / "migrations").glob("*.sql")
)


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
        assert raw.execute("SELECT version FROM schema_migrations").fetchall() == [
            (v,) for v in MIGRATIONS
        ]
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


def test_a_database_of_an_older_schema_is_migrated_at_open_and_keeps_its_data(
    tmp_path: Path,
) -> None:
    assert MIGRATIONS[:3] == [1, 2, 3]
    db = tmp_path / "crew.db"
    store = Store(str(db), Clock())
    computer_id, token = store.create_computer("box")
    store.create_agent("alice", "Alice", "", "m/x", "opencode", computer_id)
    store.close()
    with sqlite3.connect(db) as raw:  # back to schema 1, as an older server left it
        raw.execute("ALTER TABLE agents DROP COLUMN claim_more")
        raw.execute("DROP INDEX turns_running_by_agent")
        raw.execute("ALTER TABLE positions DROP COLUMN held_count")
        raw.execute("ALTER TABLE agents DROP COLUMN turn_time_limit_s")
        raw.execute("DROP TABLE user_reads")
        raw.execute("DROP TABLE agent_writes")
        raw.execute("DROP INDEX turns_by_secret")
        raw.execute("ALTER TABLE turns DROP COLUMN secret_hash")
        raw.execute("ALTER TABLE turns DROP COLUMN claim_no")
        raw.execute("DROP INDEX messages_by_turn")
        raw.execute("ALTER TABLE messages DROP COLUMN turn_id")
        raw.execute("ALTER TABLE agents DROP COLUMN claims")
        raw.execute("ALTER TABLE agents DROP COLUMN egress")
        raw.execute("ALTER TABLE turns DROP COLUMN gateway_usage")
        raw.execute("DROP INDEX messages_by_room_author")
        for column in (
            "agent_hop_limit",
            "agent_rate_limit",
            "agent_run",
            "agents_paused_seq",
            "agents_paused_at",
            "agents_paused_reason",
        ):
            raw.execute(f"ALTER TABLE rooms DROP COLUMN {column}")
        raw.execute("ALTER TABLE positions DROP COLUMN loop_release_seq")
        raw.execute("ALTER TABLE agents DROP COLUMN budget")
        raw.execute("ALTER TABLE agents DROP COLUMN budget_extra_turns")
        raw.execute("ALTER TABLE agents DROP COLUMN budget_held_until")
        raw.execute("DROP TABLE budget_notices")
        raw.execute("ALTER TABLE agents DROP COLUMN permission")
        raw.execute("DROP TABLE approvals")
        raw.execute("ALTER TABLE turns DROP COLUMN stop_requested_at")
        raw.execute("DROP TABLE room_status_dismissals")
        raw.execute("ALTER TABLE agents DROP COLUMN deleted_at")
        raw.execute("ALTER TABLE computers DROP COLUMN deleted_at")
        raw.execute("ALTER TABLE agents DROP COLUMN capabilities")
        raw.execute("ALTER TABLE agents DROP COLUMN capabilities_state")
        raw.execute("ALTER TABLE turns DROP COLUMN trace")
        raw.execute("DELETE FROM schema_migrations WHERE version >= 2")
    again = Store(str(db), Clock())
    assert again.computer_by_token(token) == computer_id
    [agent] = again.computer_agents(computer_id)
    assert agent["egress"] == {"mode": "public", "allow": []}  # an older agent is public
    assert agent["budget"]["daily_usd"] is None  # and has no budget
    assert agent["permission"]["preset"] == "autonomous"  # and runs everything, as before
    assert agent["capabilities"] == {"mcp_servers": [], "skills": []}  # and has no tools of its own
    again.connect(computer_id, "h", "linux", "1", 1)
    assert again.claim_unread(computer_id, agent["id"]) == ([], False)  # uses claim_more
    again.close()
    with sqlite3.connect(db) as raw:
        versions = [r[0] for r in raw.execute("SELECT version FROM schema_migrations")]
    assert versions == MIGRATIONS
