"""`crew-computer` as a real process against a real crew-server, the real launcher and the fake engine."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from crew_harness.waiting import wait_until
from crew_testkit.computer_proc import (
    FAKE_OPENCODE,
    Machine,
    bootstrap_for,
    launch,
    launcher_pids,
    machine,
)
from tests.support.ci import required_in_ci
from tests.support.computer import need_sandbox, problem_of, usable
from tests.support.turns import finished

pytestmark = pytest.mark.timeout(120)


def run_dir_entries(m: Machine) -> list[str]:
    runtime = m.crew_home / "runtime"
    return sorted(os.listdir(runtime)) if runtime.exists() else []


def test_messages_before_start_wakes_and_new_agents_then_a_clean_exit(crew_server: Any) -> None:
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        alice = crew_server.create_agent("alice1", computer_id=comp["computer_id"])
        dm = crew_server.create_room("dm", [alice["id"]])
        crew_server.post(
            dm["id"],
            f"posted before the Computer started\nFAKE:RUN echo pong | crew reply {dm['id']}",
        )
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
        try:
            health = usable(c)
            assert health["engine"]["found"]
            [first] = finished(crew_server, alice["id"], 1)
            assert first["status"] == "succeeded", first["failure"]
            assert "posted before the Computer started" in crew_server.turn(first["id"])["input"]
            # The engine's `crew reply`, from inside the sandbox, reached the room.
            replies = [x for x in crew_server.messages(dm["id"]) if x["author"]["kind"] == "agent"]
            assert [x["body"] for x in replies] == ["pong"]
            assert len(run_dir_entries(m)) == 1  # this run's directory, nothing older

            # An SSE wake-up for a new message.
            crew_server.post(dm["id"], "a second message")
            turns = finished(crew_server, alice["id"], 2)
            assert all(t["status"] == "succeeded" for t in turns)

            # The models `opencode models` listed were reported (read from the server's db).
            def reported_models() -> list[str] | None:
                with sqlite3.connect(crew_server.db) as db:
                    row = db.execute(
                        "SELECT models FROM computers WHERE id = ?", (comp["computer_id"],)
                    ).fetchone()
                return orjson.loads(row[0]) if row and row[0] else None

            models = wait_until("the models", reported_models)
            assert models and all("/" in name for name in models)

            # A new agent appears while running.
            bob = crew_server.create_agent("bob1", computer_id=comp["computer_id"])
            bob_dm = crew_server.create_room("dm", [bob["id"]])
            crew_server.post(bob_dm["id"], "hello bob")
            [bob_turn] = finished(crew_server, bob["id"], 1)
            assert bob_turn["status"] == "succeeded"

            # GET /events streams runner states and live engine events.
            seen: list[str] = []
            with c.local() as local, local.stream("GET", "/events") as stream:
                lines = stream.iter_lines()
                assert next(lines).startswith(":")  # subscribed
                crew_server.post(dm["id"], "watch this turn")
                for line in lines:
                    if line.startswith("event: "):
                        seen.append(line.removeprefix("event: "))
                    if "turn" in seen:
                        break
            assert {"state", "engine", "turn"} <= set(seen), seen
            assert seen.index("engine") < seen.index("turn")
            finished(crew_server, alice["id"], 3)

            # The socket answers curl, as the README says.
            out = subprocess.run(
                ["curl", "-s", "--unix-socket", str(c.socket), "http://computer/health"],
                capture_output=True,
                check=True,
                timeout=10,
            )
            assert orjson.loads(out.stdout)["ready"] is True
            rows = {row["handle"]: row for row in c.get("/agents")}
            assert rows["alice1"]["last_result"] == "succeeded"
            assert rows["bob1"]["state"] in ("idle", "running")
            with c.local() as local:
                metrics = local.get("/metrics").text
            assert 'crew_turns_total{result="succeeded"} 4' in metrics
        finally:
            code = c.stop()
        assert code == 0, c.stderr()[-3000:]
        assert run_dir_entries(m) == []
        assert not c.socket.exists()
        assert not list((m.crew_home / "sockets").iterdir())


def test_sigterm_during_a_turn_cancels_it_and_exits_cleanly(crew_server: Any) -> None:
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        agent = crew_server.create_agent("hang1", computer_id=comp["computer_id"])
        dm = crew_server.create_room("dm", [agent["id"]])
        crew_server.post(dm["id"], "think long:\nFAKE:HANG")
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
        try:
            usable(c)
            wait_until("a running turn", lambda: crew_server.turns(agent["id"]))
            wait_until(
                "the engine running",
                lambda: any(r["state"] == "running" for r in c.get("/agents")),
            )
        finally:
            code = c.stop("SIGTERM")
        assert code == 0, c.stderr()[-3000:]
        [turn] = crew_server.turns(agent["id"])
        assert turn["status"] == "cancelled"
        assert run_dir_entries(m) == []


def test_planted_file_is_that_agents_problem_a_planted_link_is_repaired_others_run(
    crew_server: Any,
) -> None:
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        agents = {
            h: crew_server.create_agent(h, computer_id=comp["computer_id"])
            for h in ("filed", "linked", "fifo", "plain")
        }
        rooms = {h: crew_server.create_room("dm", [a["id"]]) for h, a in agents.items()}
        # What an agent could have planted from inside its sandbox in an earlier run.
        elsewhere = m.root / "elsewhere"
        elsewhere.mkdir()
        filed_dir = m.crew_home / "agents" / agents["filed"]["id"]
        filed_dir.mkdir(parents=True)
        (filed_dir / "work").write_text("the agent's data")
        linked_dir = m.crew_home / "agents" / agents["linked"]["id"]
        linked_dir.mkdir(parents=True)
        (linked_dir / "work").symlink_to(elsewhere)
        fifo_dir = m.crew_home / "agents" / agents["fifo"]["id"] / "engines" / "opencode"
        fifo_dir.mkdir(parents=True)
        os.mkfifo(fifo_dir / "session.json")
        for h, room in rooms.items():
            crew_server.post(room["id"], f"hello {h}")
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
        try:
            usable(c)
            assert finished(crew_server, agents["plain"]["id"], 1)[0]["status"] == "succeeded"
            # A FIFO session.json counts as no record: never blocks, the agent runs.
            assert finished(crew_server, agents["fifo"]["id"], 1)[0]["status"] == "succeeded"
            # The link held no data: removed, never followed, the directory made again.
            assert finished(crew_server, agents["linked"]["id"], 1)[0]["status"] == "succeeded"
            assert not list(elsewhere.iterdir())
            reason = wait_until(
                "the problem", lambda: problem_of(crew_server, agents["filed"]["id"])
            )
            assert "work is a file" in reason and str(m.crew_home) not in reason
            assert crew_server.turns(agents["filed"]["id"]) == []
            rows = {row["handle"]: row for row in c.get("/agents")}
            assert rows["filed"]["state"] == "problem"
            assert (filed_dir / "work").read_text() == "the agent's data"

            # Fixed, and the next sync (a settings change) prepares it and clears the problem.
            (filed_dir / "work").unlink()
            crew_server.client().patch(
                f"/api/agents/{agents['filed']['id']}", json={"persona": "Fixed."}
            ).raise_for_status()
            assert finished(crew_server, agents["filed"]["id"], 1)[0]["status"] == "succeeded"
            assert problem_of(crew_server, agents["filed"]["id"]) is None
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]


def test_rm_rf_from_inside_the_sandbox_is_repaired_before_the_next_turn(
    crew_server: Any,
) -> None:
    """The agent deletes its work and cache dirs and plants a link: the next turns still run.

    (Its temp dir cannot be deleted here: with the crew home below /tmp, as in
    these tests, the sandbox's mount points sit inside it. The unit tests of
    `AgentHome.repair` cover it.)
    """
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        agent = crew_server.create_agent("rmrf1", computer_id=comp["computer_id"])
        dm = crew_server.create_room("dm", [agent["id"]])
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
        try:
            usable(c)
            crew_server.post(
                dm["id"],
                "clean up:\nFAKE:RUN "
                'rm -rf "$HOME/work" "$XDG_CACHE_HOME" "$XDG_DATA_HOME"; ln -s / "$XDG_DATA_HOME"; '
                # Replies only when all of it really happened (any wake-up repairs it at once).
                'test ! -e "$HOME/work" && test ! -e "$XDG_CACHE_HOME" && test -L "$XDG_DATA_HOME" '
                f"&& echo bye | crew reply {dm['id']}",
            )
            [first] = finished(crew_server, agent["id"], 1)
            assert first["status"] == "succeeded", first["failure"]
            home = m.crew_home / "agents" / agent["id"]
            data = home / "engines" / "opencode" / "data"
            [runtime] = (m.crew_home / "runtime").glob(f"*/agents/{agent['id']}")
            for n in (2, 3):
                crew_server.post(dm["id"], f"again:\nFAKE:RUN echo turn{n} | crew reply {dm['id']}")
                turns = finished(crew_server, agent["id"], n)
                assert turns[-1]["status"] == "succeeded", (n, turns[-1]["failure"])
            assert (home / "work").is_dir() and (runtime / "cache").is_dir()
            assert data.is_dir() and not data.is_symlink()
            replies = [
                x["body"] for x in crew_server.messages(dm["id"]) if x["author"]["kind"] == "agent"
            ]
            assert replies == ["bye", "turn2", "turn3"]
            assert problem_of(crew_server, agent["id"]) is None
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]


def test_sandbox_unavailable_no_runner_and_every_agent_told(crew_server: Any) -> None:
    """bwrap really missing from the Computer's view: an empty file bound over it."""
    if shutil.which("unshare") is None:
        required_in_ci("unshare (util-linux) to hide bwrap from the Computer")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        required_in_ci(f"user namespaces for `unshare -rm` ({probe.stderr.decode().strip()})")
    bwrap = "/usr/bin/bwrap"
    hide = f'for p in {bwrap} /usr/local/bin/bwrap; do [ -e $p ] && mount --bind /dev/null $p; done; exec "$@"'
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        first = crew_server.create_agent("early1", computer_id=comp["computer_id"])
        room = crew_server.create_room("dm", [first["id"]])
        crew_server.post(room["id"], "will you run?")
        c = launch(
            m,
            bootstrap_for(crew_server.url, comp["token"], m),
            wrap=["unshare", "-rm", "sh", "-c", hide, "sh"],
        )
        try:
            health = wait_until("the launcher's health", c.health_known, 60)
            assert health["sandbox"]["ok"] is False
            assert "bwrap" in health["sandbox"]["reason"]
            reason = wait_until("the problem", lambda: problem_of(crew_server, first["id"]))
            assert reason.startswith("sandbox unavailable:") and "bwrap" in reason
            # An agent that appears later is told too.
            later = crew_server.create_agent("late1", computer_id=comp["computer_id"])
            assert "sandbox unavailable" in wait_until(
                "the later agent's problem", lambda: problem_of(crew_server, later["id"])
            )
            assert crew_server.turns(first["id"]) == []
            rows = c.get("/agents")
            assert {r["state"] for r in rows} == {"problem"} and len(rows) == 2
            assert c.get("/health")["connected"] is True
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]


def test_cannot_prepare_its_directories_exits_1_with_the_reason(crew_server: Any) -> None:
    with machine() as m:
        comp = crew_server.create_computer()
        m.crew_home.write_text("a file where the crew home should be")
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m), wait_ready=False)
        code = c.proc.wait(timeout=30)
        last = c.stderr().strip().splitlines()[-1]
        assert code == 1
        assert last.startswith("crew-computer: cannot prepare"), last
        assert comp["token"] not in c.stderr()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"garbage\n", "bootstrap is not valid JSON"),
        (b"", "no bootstrap received"),
        (b'{"server_url": "http://127.0.0.1:9"}\n', "token"),
    ],
)
def test_bootstrap_garbage_is_a_clear_error(line: bytes, expected: str) -> None:
    with machine() as m:
        c = launch(m, line, wait_ready=False)
        if not line:
            assert c.proc.stdin is not None
            c.proc.stdin.close()
        assert c.proc.wait(timeout=30) == 1
        assert c.proc.stdout is not None and c.proc.stdout.read() == b""
        last = c.stderr().strip().splitlines()[-1]
        assert last.startswith("crew-computer: ") and expected in last, last


def test_refused_token_or_unreachable_server_exit_1_without_the_token(crew_server: Any) -> None:
    secret = "computer-token-that-must-not-leak"
    with machine() as m:
        for url in (crew_server.url, "http://127.0.0.1:9"):
            c = launch(m, bootstrap_for(url, secret, m), wait_ready=False)
            assert c.proc.wait(timeout=30) == 1
            err = c.stderr()
            assert err.strip().splitlines()[-1].startswith("crew-computer: cannot connect")
            assert secret not in err


def test_a_dead_launcher_fails_the_turn_and_is_replaced(crew_server: Any) -> None:
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        agent = crew_server.create_agent("relaunch1", computer_id=comp["computer_id"])
        dm = crew_server.create_room("dm", [agent["id"]])
        # Hangs the first time only: the message is tried again after the crash.
        crew_server.post(dm["id"], "think long:\nFAKE:ONCE HANG")
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
        try:
            usable(c)
            [running] = wait_until("the turn", lambda: crew_server.turns(agent["id"]))
            wait_until("its first event", lambda: crew_server.turn(running["id"])["events"])
            [launcher] = launcher_pids(c.proc.pid)
            os.kill(launcher, signal.SIGKILL)
            [crashed] = finished(crew_server, agent["id"], 1)
            assert crashed["status"] == "failed"
            assert crashed["failure"]["class"] == "process_crashed"
            # A new launcher takes over; the failed turn's message comes back with the next.
            wait_until(
                "a new launcher", lambda: [p for p in launcher_pids(c.proc.pid) if p != launcher]
            )
            crew_server.post(dm["id"], "are you back?")
            turns = finished(crew_server, agent["id"], 2)
            assert len(turns) >= 2
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]
        assert run_dir_entries(m) == []


def test_an_unusable_replacement_launcher_is_every_agents_problem_until_one_is_usable(
    crew_server: Any,
) -> None:
    """The launcher dies while opencode is gone: the agent says why; back when opencode is."""
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        agent = crew_server.create_agent("unusable1", computer_id=comp["computer_id"])
        dm = crew_server.create_room("dm", [agent["id"]])
        opencode = m.root / "opencode"
        opencode.symlink_to(FAKE_OPENCODE)
        boot = bootstrap_for(crew_server.url, comp["token"], m)
        boot["opencode_path"] = str(opencode)
        c = launch(m, boot)
        try:
            usable(c)
            wait_until("a runner", lambda: [r["state"] for r in c.get("/agents")] == ["idle"])
            opencode.unlink()
            [launcher] = launcher_pids(c.proc.pid)
            os.kill(launcher, signal.SIGKILL)
            reason = wait_until("the problem", lambda: problem_of(crew_server, agent["id"]))
            assert reason.startswith("engine unavailable"), reason
            assert c.get("/health")["engine"]["found"] is False
            assert [(r["state"], r["problem"]) for r in c.get("/agents")] == [("problem", reason)]
            # Messages wait meanwhile: nothing is claimed only to fail.
            crew_server.post(dm["id"], "are you there?")

            opencode.symlink_to(FAKE_OPENCODE)
            [turn] = finished(crew_server, agent["id"], 1)
            assert turn["status"] == "succeeded", turn["failure"]
            assert "are you there?" in crew_server.turn(turn["id"])["input"]
            assert problem_of(crew_server, agent["id"]) is None
            assert c.get("/health")["engine"]["found"] is True
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]
        assert run_dir_entries(m) == []


def test_the_bootstraps_turn_time_limit_ends_a_hanging_turn(crew_server: Any) -> None:
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        agent = crew_server.create_agent("limit1", computer_id=comp["computer_id"])
        dm = crew_server.create_room("dm", [agent["id"]])
        crew_server.post(dm["id"], "think forever:\nFAKE:HANG")
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m, turn_time_limit_s=2))
        try:
            usable(c)
            [turn] = finished(crew_server, agent["id"], 1)
            assert turn["status"] == "failed"
            assert turn["failure"]["class"] == "engine_error"
            assert "wall-clock limit (2 s)" in turn["failure"]["reason"]
            assert "turn_time_limit_s" in turn["failure"]["reason"]
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]


def test_an_agents_own_turn_time_limit_ends_its_slow_turn_under_a_long_default(
    crew_server: Any,
) -> None:
    """The server's per-agent limit (10 s, its least) reaches the runner through the agent
    sync; another agent's equally slow turn runs to its end under the bootstrap's hour."""
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        quick = crew_server.create_agent(
            "limit2", computer_id=comp["computer_id"], turn_time_limit_s=10
        )
        patient = crew_server.create_agent("limit3", computer_id=comp["computer_id"])
        for agent in (quick, patient):
            dm = crew_server.create_room("dm", [agent["id"]])
            crew_server.post(dm["id"], "a slow build:\nFAKE:SLOW 13")
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m, turn_time_limit_s=3600))
        try:
            usable(c)
            [ended] = finished(crew_server, quick["id"], 1, timeout=60)
            assert ended["status"] == "failed", ended
            assert ended["failure"]["class"] == "engine_error"
            assert "wall-clock limit (10 s)" in ended["failure"]["reason"]
            assert "PATCH /api/agents/{id}" in ended["failure"]["reason"]
            [done] = finished(crew_server, patient["id"], 1, timeout=60)
            assert done["status"] == "succeeded", done["failure"]
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]


def test_a_vanished_session_is_restarted_and_its_turn_records_what_the_engine_got(
    crew_server: Any,
) -> None:
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        agent = crew_server.create_agent("vanish1", computer_id=comp["computer_id"])
        dm = crew_server.create_room("dm", [agent["id"]])
        crew_server.post(dm["id"], "remember this")
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
        try:
            usable(c)
            [first] = finished(crew_server, agent["id"], 1)
            assert first["status"] == "succeeded", first["failure"]
            agent_dir = m.crew_home / "agents" / agent["id"]
            # OpenCode's own store loses the session the Computer saved (the fake keeps
            # its sessions where OpenCode keeps its data).
            sessions = agent_dir / "engines" / "opencode" / "data" / "fake-opencode" / "sessions"
            assert any(sessions.iterdir())
            shutil.rmtree(sessions)
            crew_server.post(dm["id"], "what did I say?")
            second = finished(crew_server, agent["id"], 2)[-1]
            assert second["status"] == "succeeded", second["failure"]
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]
        dumps = sorted((agent_dir / "work" / ".fake-opencode").glob("*.json"))
        runs = [orjson.loads(d.read_bytes()) for d in dumps]
        assert len(runs) == 3  # the first turn, the vanished session, the new one
        assert "--session" in runs[1]["argv"] and "--session" not in runs[2]["argv"]
        recorded = crew_server.turn(second["id"])["input"]
        assert recorded == runs[2]["stdin"] != runs[1]["stdin"]
        assert "This is a new session" in recorded and "what did I say?" in recorded


def test_kill_9_mid_turn_then_restart_handles_the_messages_again(crew_server: Any) -> None:
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        agent = crew_server.create_agent("killed1", computer_id=comp["computer_id"])
        dm = crew_server.create_room("dm", [agent["id"]])
        crew_server.post(dm["id"], "take your time:\nFAKE:SLOW 3")
        first = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
        try:
            usable(first)
            # Mid-turn: registered on the server and its engine started (the runner's
            # `running` state starts earlier, at the claim).
            wait_until(
                "the turn registered",
                lambda: any(t["status"] == "running" for t in crew_server.turns(agent["id"])),
            )
            wait_until(
                "the engine running",
                lambda: any(r["state"] == "running" for r in first.get("/agents")),
            )
            launchers = launcher_pids(first.proc.pid)
            first.proc.kill()
            first.proc.wait(timeout=10)
            # The launcher dies with it (parent-death signal / stdin closed).
            wait_until(
                "the launcher gone",
                lambda: not any(os.path.exists(f"/proc/{p}") for p in launchers),
                15,
            )
        finally:
            first.stop()
        # Left behind: a stale socket and a run directory; the next Computer copes.
        second = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
        try:
            usable(second)
            turns = finished(crew_server, agent["id"], 2)
            statuses = [t["status"] for t in turns]
            assert statuses[0] == "interrupted", statuses
            assert statuses[-1] == "succeeded", statuses
            assert len(run_dir_entries(m)) == 1  # the dead run's directory was cleaned
        finally:
            assert second.stop() == 0, second.stderr()[-3000:]
        assert run_dir_entries(m) == []


def test_engine_not_found_no_runner_and_every_agent_told(crew_server: Any) -> None:
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        agent = crew_server.create_agent("noengine1", computer_id=comp["computer_id"])
        boot = bootstrap_for(crew_server.url, comp["token"], m)
        boot["opencode_path"] = str(m.root / "no-such-opencode")
        c = launch(m, boot)
        try:
            health = wait_until("the launcher's health", c.health_known, 60)
            assert health["engine"]["found"] is False
            reason = wait_until("the problem", lambda: problem_of(crew_server, agent["id"]))
            assert reason.startswith("engine unavailable"), reason
            assert [r["state"] for r in c.get("/agents")] == ["problem"]
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]


def test_opencode_2_is_refused_with_its_reason_and_runs_no_turn(crew_server: Any) -> None:
    """OpenCode 2.x moved its server API: /health and every agent say so; no turn fails."""
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        agent = crew_server.create_agent("oc2one", computer_id=comp["computer_id"])
        dm = crew_server.create_room("dm", [agent["id"]])
        crew_server.post(dm["id"], "FAKE:RUN echo pong | crew reply " + dm["id"])
        opencode = m.root / "opencode"
        opencode.write_text(
            f'#!/bin/sh\n[ "$1" = --version ] && {{ echo 2.0.0; exit 0; }}\nexec {FAKE_OPENCODE} "$@"\n'
        )
        opencode.chmod(0o755)
        boot = bootstrap_for(crew_server.url, comp["token"], m)
        boot["opencode_path"] = str(opencode)
        c = launch(m, boot)
        try:
            health = wait_until("the launcher's health", c.health_known, 60)
            assert health["engine"]["found"] is True and health["engine"]["version"] == "2.0.0"
            assert "OpenCode 2.0.0 is not supported" in health["engine"]["reason"], health
            reason = wait_until("the problem", lambda: problem_of(crew_server, agent["id"]))
            assert reason == f"engine unavailable: {health['engine']['reason']}"
            assert [(r["state"], r["problem"]) for r in c.get("/agents")] == [("problem", reason)]
            assert crew_server.turns(agent["id"]) == []  # no runner: nothing claimed to fail
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]


def test_a_stop_while_opencode_models_runs_is_quiet(crew_server: Any) -> None:
    """Ctrl+C during the slow first `opencode models`: an orderly stop, no WARNING or ERROR
    (the launcher used to wait out the listing past the Computer's grace, then cancel it)."""
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        crew_server.create_agent("quietstop1", computer_id=comp["computer_id"])
        opencode = m.root / "opencode"
        opencode.write_text(
            f'#!/bin/sh\n[ "$1" = models ] && exec sleep 120\nexec {FAKE_OPENCODE} "$@"\n'
        )
        opencode.chmod(0o755)
        boot = bootstrap_for(crew_server.url, comp["token"], m)
        boot["opencode_path"] = str(opencode)
        c = launch(m, boot)
        try:
            usable(c)
            wait_until("a runner", lambda: [r["state"] for r in c.get("/agents")] == ["idle"])
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]
        noisy = [ln for ln in c.stderr().splitlines() if " WARNING " in ln or " ERROR " in ln]
        assert noisy == [], c.stderr()[-3000:]


def _launchers_of(crew_home: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
        except OSError:
            continue
        if b"sandbox_launcher" in cmdline and str(crew_home).encode() in cmdline:
            found.append(int(entry.name))
    return found


def test_sigint_right_after_ready_stops_in_order(crew_server: Any) -> None:
    """Ctrl+C while the launcher may still be starting: exit 0, nothing left behind."""
    with machine() as m:
        comp = crew_server.create_computer()
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
        code = c.stop("SIGINT")
        assert code == 0, c.stderr()[-3000:]
        assert "SIGINT received: stopping" in c.stderr()
        assert run_dir_entries(m) == []
        assert not list((m.crew_home / "sockets").iterdir())
        wait_until("no launcher left", lambda: not _launchers_of(m.crew_home), 10)


def test_opencode_models_failing_ends_the_run_with_exit_1(crew_server: Any) -> None:
    """Step 5 fails for good: stop in order, then exit 1 with the reason (computer.md §1)."""
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        opencode = m.root / "opencode-without-models"
        opencode.write_text(
            "#!/bin/sh\n"
            'if [ "$1" = models ]; then echo "no models today" >&2; exit 3; fi\n'
            f'exec "{sys.executable}" "{FAKE_OPENCODE}" "$@"\n'
        )
        opencode.chmod(0o755)
        boot = bootstrap_for(crew_server.url, comp["token"], m, opencode_path=str(opencode))
        c = launch(m, boot)
        try:
            code = c.proc.wait(timeout=60)
        finally:
            c.stop()
        last = c.stderr().strip().splitlines()[-1]
        assert code == 1, c.stderr()[-3000:]
        assert last.startswith("crew-computer: cannot read the available models:"), last
        assert "no models today" in last and comp["token"] not in c.stderr()
        assert run_dir_entries(m) == []
        assert not list((m.crew_home / "sockets").iterdir())
