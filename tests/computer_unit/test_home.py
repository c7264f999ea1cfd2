"""Agent homes: modes, templates, planted links and FIFOs."""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from computer_service.home import (
    NPM_STUB_LOCK,
    AgentHome,
    AgentHomeError,
)
from computer_service.texts import MEMORY_TEMPLATE, render_agents_md
from crew_common.layout import AgentPaths


@dataclass(frozen=True)
class Agent:
    id: str
    handle: str
    name: str
    persona: str


AGENT = Agent("agent-1", "alice", "Alice", "Writes notes.")


def make_home(tmp_path: Path, agent: Agent = AGENT, run_id: str = "run-1") -> AgentHome:
    paths = AgentPaths(crew_home=tmp_path / "crew", run_id=run_id, agent_id=agent.id)
    return AgentHome(paths, agent, clock=lambda: datetime(2026, 10, 6, 9, 0, tzinfo=UTC))


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_prepare_builds_the_tree_with_modes(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    home.prepare("tok-123")
    p = home.paths
    for d in (
        p.agent_dir,
        p.work_dir,
        p.data_dir,
        p.engine_dir,
        p.runtime_dir,
        p.config_dir,
        p.cache_dir,
        p.state_dir,
        p.tmp_dir,
        p.crew_home / "agents",
        p.run_dir,
    ):
        assert d.is_dir() and not d.is_symlink(), d
        assert mode(d) == 0o700, d
    assert p.token_file.read_text() == "tok-123" and mode(p.token_file) == 0o600
    assert p.agents_md.read_text() == render_agents_md(AGENT) and mode(p.agents_md) == 0o600
    assert p.memory_md.read_text() == MEMORY_TEMPLATE and mode(p.memory_md) == 0o600
    assert (p.config_dir / "opencode" / "package-lock.json").read_bytes() == NPM_STUB_LOCK
    assert (p.config_dir / "opencode" / "node_modules").is_dir()
    assert home.agents_md == render_agents_md(AGENT)


def test_existing_memory_is_left_alone_even_a_fifo(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    home.paths.work_dir.mkdir(parents=True)
    home.paths.memory_md.write_text("my own notes")
    home.prepare("t")
    assert home.paths.memory_md.read_text() == "my own notes"
    home.paths.memory_md.unlink()
    os.mkfifo(home.paths.memory_md)
    home.prepare("t")
    assert stat.S_ISFIFO(os.lstat(home.paths.memory_md).st_mode)
    assert home.memory_size() is None
    home.paths.memory_md.unlink()
    home.paths.memory_md.symlink_to("/etc/passwd")
    home.prepare("t")
    assert home.paths.memory_md.is_symlink()
    assert home.memory_size() is None


def test_symlinked_work_dir_is_removed_and_recreated_nothing_written_through_it(
    tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    home = make_home(tmp_path)
    home.paths.agent_dir.mkdir(parents=True)
    home.paths.work_dir.symlink_to(elsewhere)
    home.prepare("t")
    assert home.paths.work_dir.is_dir() and not home.paths.work_dir.is_symlink()
    assert mode(home.paths.work_dir) == 0o700
    assert list(elsewhere.iterdir()) == []


def test_a_file_where_work_belongs_fails_with_what_to_do_and_is_kept(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    home.paths.agent_dir.mkdir(parents=True)
    home.paths.work_dir.write_text("the agent's notes")
    with pytest.raises(AgentHomeError) as info:
        home.prepare("t")
    msg = str(info.value)
    assert "@alice" in msg and "agents/agent-1/work is a file" in msg
    assert "move it away" in msg and "wake" in msg
    assert str(tmp_path) not in msg  # no absolute paths in a reason sent upstream
    assert home.paths.work_dir.read_text() == "the agent's notes"


def _break_everything_an_agent_can(home: AgentHome, elsewhere: Path) -> None:
    """What one `rm -rf` and a few links from inside the sandbox leave behind."""
    p = home.paths
    subprocess.run(["rm", "-rf", str(p.work_dir), str(p.tmp_dir), str(p.engine_dir)], check=True)
    p.tmp_dir.symlink_to(elsewhere)
    os.mkfifo(p.state_dir / "x")  # inside: the agent's own, left alone
    subprocess.run(["rm", "-rf", str(p.cache_dir)], check=True)
    os.mkfifo(p.cache_dir)
    p.token_file.unlink()
    p.agents_md.unlink()
    p.agents_md.symlink_to(elsewhere / "AGENTS.md")
    p.config_dir.chmod(0o000)


def test_repair_before_a_turn_puts_back_what_the_agent_broke(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    home = make_home(tmp_path)
    home.prepare("tok-1")
    assert home.repair() is None  # nothing to do: nothing changes
    _break_everything_an_agent_can(home, elsewhere)

    assert home.repair() is None
    p = home.paths
    for d in (p.work_dir, p.data_dir, p.tmp_dir, p.cache_dir, p.state_dir, p.config_dir):
        assert d.is_dir() and not d.is_symlink(), d
        assert mode(d) == 0o700, d
    assert (p.config_dir / "opencode" / "node_modules").is_dir()
    assert stat.S_ISFIFO(os.lstat(p.state_dir / "x").st_mode)
    assert p.token_file.read_text() == "tok-1" and mode(p.token_file) == 0o600
    assert p.agents_md.read_text() == render_agents_md(AGENT) and not p.agents_md.is_symlink()
    assert list(elsewhere.iterdir()) == []


def test_repair_says_what_to_do_when_a_file_holds_the_place(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    home.prepare("t")
    subprocess.run(["rm", "-rf", str(home.paths.tmp_dir)], check=True)
    home.paths.tmp_dir.write_text("data")
    reason = home.repair()
    assert reason is not None
    assert "tmp is a file, not a directory" in reason and "move it away" in reason
    assert str(tmp_path) not in reason
    assert home.paths.tmp_dir.read_text() == "data"
    home.paths.tmp_dir.unlink()
    assert home.repair() is None and home.paths.tmp_dir.is_dir()


def test_symlinked_agents_md_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    home = make_home(tmp_path)
    home.paths.agent_dir.mkdir(parents=True)
    home.paths.agents_md.symlink_to(victim)
    home.prepare("t")
    assert victim.read_text() == "keep"
    assert not home.paths.agents_md.is_symlink()


def test_memory_size_and_render_input(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    home.prepare("t")
    home.paths.memory_md.write_bytes(b"x" * 20_000)
    assert home.memory_size() == 20_000
    text = home.render_input([], new_session=True)
    assert text.startswith("It is Tuesday 2026-10-06 09:00 (+00:00).\nThis is a new session")
    assert "over the 16 KB limit" in text
    assert "new session" not in home.render_input([], new_session=False)


def test_before_every_turn_opencodes_config_dirs_hold_only_the_computers_files(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """OpenCode imports `tools/` and takes `opencode.json` from its global config dirs at
    every start: what the agent planted there is gone before its next engine starts."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "tools").mkdir(parents=True)
    (elsewhere / "tools" / "keep.ts").write_text("// the link's target, untouched\n")
    home = make_home(tmp_path)
    home.prepare("tok-1")
    p = home.paths
    config = p.config_dir / "opencode"
    stub = (config / "package-lock.json").read_bytes()
    (config / ".gitignore").write_text("node_modules\n")  # OpenCode writes this itself
    (config / "tools").mkdir()
    (config / "tools" / "evil.ts").write_text("await Bun.write('/tmp/pwned', 'x')\n")
    (config / "opencode.json").write_text('{"shell": "/tmp/evil-shell"}\n')
    (config / "plugins").symlink_to(elsewhere)
    (config / "node_modules" / "evil").mkdir()
    (config / "node_modules" / "evil" / "index.js").write_text("pwned()\n")
    (p.agent_dir / ".opencode" / "tools").mkdir(parents=True)
    (p.agent_dir / ".opencode" / "tools" / "evil.ts").write_text("pwned()\n")

    with caplog.at_level("WARNING"):
        assert home.repair() is None
    assert sorted(x.name for x in config.iterdir()) == [
        ".gitignore",
        "node_modules",
        "package-lock.json",
    ]
    assert (config / "package-lock.json").read_bytes() == stub
    assert list((config / "node_modules").iterdir()) == []
    assert not (p.agent_dir / ".opencode").exists()
    assert (elsewhere / "tools" / "keep.ts").exists()  # the link was removed, not followed
    assert "opencode/tools was removed (OpenCode would load code from it)" in caplog.text
    assert ".opencode was removed" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert home.repair() is None  # nothing planted: nothing said
    assert caplog.text == ""
