"""The engine's sessions (`engine/session.py`) and the price table a turn copies in.

Sessions: the record's round trip, the plan table, malformed, FIFO and linked
files, a session that cannot be saved (the next turn starts anew).
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import orjson
import pytest

from computer_service.engine.base import SessionPlan
from computer_service.engine.preparation import copy_price_table
from computer_service.engine.session import (
    SessionRecord,
    Sessions,
    agents_md_digest,
    plan_session,
    read_session_record,
    write_session_record,
)
from computer_service.home import AgentHome
from tests.computer_unit.test_home import make_home, mode


def keep(home: AgentHome, session_id: str, model: str, sessions: Sessions | None = None) -> bool:
    """What the pipeline does after a succeeded turn planned for this home's AGENTS.md."""
    sessions = sessions or Sessions()
    plan = sessions.plan(home.paths, model, home.agents_md)
    return sessions.keep(home.paths, plan, model, session_id)


def test_session_roundtrip_and_plan(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    home.prepare("t")
    assert read_session_record(home.paths) is None
    assert keep(home, "ses_abc", "local/m1")
    assert mode(home.paths.session_file) == 0o600
    record = read_session_record(home.paths)
    assert record == SessionRecord(
        "opencode", "local/m1", agents_md_digest(home.agents_md), "ses_abc"
    )
    on_disk = orjson.loads(home.paths.session_file.read_bytes())
    assert on_disk["session_id"] == "ses_abc" and on_disk["engine"] == "opencode"


@pytest.mark.parametrize(
    ("engine", "model", "agents_md", "continues"),
    [
        ("opencode", "local/m1", "AGENTS v1", True),
        ("opencode", "local/m2", "AGENTS v1", False),
        ("opencode", "local/m1", "AGENTS v2", False),
        ("other", "local/m1", "AGENTS v1", False),
    ],
)
def test_plan_session_table(engine: str, model: str, agents_md: str, continues: bool) -> None:
    record = SessionRecord("opencode", "local/m1", agents_md_digest("AGENTS v1"), "ses_1")
    plan = plan_session(record, engine, model, agents_md)
    assert plan.session_id == ("ses_1" if continues else None)
    assert plan.is_new is not continues
    assert plan_session(None, engine, model, agents_md).is_new


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json",
        b"[]",
        b'{"engine":"opencode"}',
        b'{"engine":1,"model":"m","agents_md_sha256":"d","session_id":"s"}',
    ],
)
def test_malformed_session_file_counts_as_none(tmp_path: Path, content: bytes) -> None:
    home = make_home(tmp_path)
    home.prepare("t")
    home.paths.session_file.write_bytes(content)
    assert read_session_record(home.paths) is None


@pytest.mark.timeout(10)
def test_fifo_session_counts_as_none_never_blocks(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    home.prepare("t")
    os.mkfifo(home.paths.session_file)
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(read_session_record(home.paths)))
    t.start()
    t.join(5)
    assert not t.is_alive() and out == [None]
    # Saving replaces the FIFO with a regular file.
    assert keep(home, "ses_new", "m")
    assert stat.S_ISREG(os.lstat(home.paths.session_file).st_mode)


def test_symlinked_session_counts_as_none(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    home.prepare("t")
    real = tmp_path / "real.json"
    real.write_bytes(SessionRecord("opencode", "m", "d", "ses_x").to_json())
    home.paths.session_file.symlink_to(real)
    assert read_session_record(home.paths) is None


def test_symlinked_engines_dir_counts_as_none_and_save_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = make_home(tmp_path)
    home.prepare("t")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    engines = home.paths.agent_dir / "engines"
    os.rename(engines, tmp_path / "old-engines")
    engines.symlink_to(elsewhere)
    assert read_session_record(home.paths) is None
    sessions = Sessions()
    assert not keep(home, "ses_a", "m", sessions)
    assert "symlink" in caplog.text and list(elsewhere.iterdir()) == []
    # Lost: the agent's next turn starts anew, even where a matching record shows up.
    os.unlink(engines)
    os.rename(tmp_path / "old-engines", engines)
    write_session_record(
        home.paths, SessionRecord("opencode", "m", agents_md_digest(home.agents_md), "ses_old")
    )
    assert sessions.plan(home.paths, "m", home.agents_md).is_new
    # Until a session is kept again.
    assert keep(home, "ses_b", "m", sessions)
    assert sessions.plan(home.paths, "m", home.agents_md).session_id == "ses_b"


def test_a_plan_made_by_hand_keeps_nothing(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    home.prepare("t")
    assert Sessions().keep(home.paths, SessionPlan("ses_x"), "m", "ses_y")
    assert read_session_record(home.paths) is None


def test_price_table_copy(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    home.prepare("t")
    src = tmp_path / "models.json"
    assert copy_price_table(home.paths, src) is False  # no source: nothing, no error
    src.write_text('{"prices":1}')
    os.utime(src, (1_000_000, 1_000_000))
    assert copy_price_table(home.paths, src) is True
    dest = home.paths.cache_dir / "opencode" / "models.json"
    assert dest.read_text() == '{"prices":1}'
    assert copy_price_table(home.paths, src) is False  # not older: skipped
    os.utime(src, (2_000_000, 2_000_000))
    assert copy_price_table(home.paths, src) is True


def test_price_table_never_through_a_link_and_failure_only_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = make_home(tmp_path)
    home.prepare("t")
    src = tmp_path / "models.json"
    src.write_text("{}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (home.paths.cache_dir / "opencode").symlink_to(elsewhere)
    assert copy_price_table(home.paths, src) is False
    assert list(elsewhere.iterdir()) == []
    assert "price table not copied" in caplog.text
