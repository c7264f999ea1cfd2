"""A hostile agent inside the sandbox, run by the real Computer, next to an innocent one.

The Computer is a real process against the real server, with the real
launcher (bwrap) and the fake engine's `HOSTILE` mode, which tries what the
sandbox must deny and writes what happened into its own agent directory. Each
test runs with both engines: cold (`opencode run` per turn) and warm (the fake
`opencode serve`, whose prompts run as processes of the server's sandbox). Each
attempt fails or is contained, the Computer keeps running, and the other
agent's next turn succeeds and continues its own session.
(The same probes straight against a launcher, in both modes: tests/launcher/test_hostile.py.)
(A hostile MCP server, started by the real OpenCode from the agent's capabilities, in both
modes: tests/e2e/test_capabilities.py::test_a_hostile_mcp_server_is_contained_like_any_tool.)
"""

from __future__ import annotations

import errno
import json
import random
import stat
from pathlib import Path
from typing import Any

import orjson
import pytest

from crew_harness.waiting import wait_until
from crew_testkit.computer_proc import bootstrap_for, launch, machine
from tests.faults.chain import read_positions
from tests.launcher.helpers import processes_with
from tests.support.computer import need_sandbox, usable
from tests.support.turns import finished

pytestmark = pytest.mark.timeout(150)

SSH_KEY = "-----BEGIN FAKE KEY-----\n"
BASHRC = "# the user's own bashrc\n"
HIDDEN = (errno.EACCES, errno.ENOENT)


def _dumps(work: Path) -> list[dict[str, Any]]:
    """What the fake engine recorded of each run started in `work` (oldest first)."""
    folder = work / ".fake-opencode"
    if not folder.is_dir():
        return []
    return [orjson.loads(p.read_bytes()) for p in sorted(folder.glob("*.json"))]


def assert_engine(c: Any, engine: str) -> None:
    """Every turn ran on the engine the test is about (a warm turn may fall back to cold)."""
    with c.local() as local:
        metrics = local.get("/metrics").text
    counts = {
        name: float(line.split()[1])
        for line in metrics.splitlines()
        for name in ("crew_warm_turns_total", "crew_cold_turns_total")
        if line.startswith(name + " ")
    }
    if engine == "cold":
        assert "crew_warm_turns_total" not in counts, metrics  # no warm engine at all
    else:
        assert counts["crew_warm_turns_total"] > 0, counts
        assert counts["crew_cold_turns_total"] == 0, (
            counts,
            "\n".join(x for x in c.stderr().splitlines() if "warm" in x or "cold" in x),
        )


def _tree(root: Path) -> dict[str, bytes | str]:
    """Every entry under `root` (not following links) with its bytes, for before/after checks."""
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = f"-> {path.readlink()}"
        elif path.is_file():
            out[rel] = path.read_bytes()
        else:
            out[rel] = "dir"
    return out


@pytest.mark.parametrize("engine", ["cold", "warm"])
@pytest.mark.parametrize("mode", ["hybrid", "tmpfs"])
def test_hostile_agent_is_contained_and_the_other_agent_carries_on(
    crew_server: Any, mode: str, engine: str
) -> None:
    need_sandbox()
    with machine() as m:
        m.log_in()
        (m.home / ".ssh").mkdir(mode=0o700)
        (m.home / ".ssh" / "id_rsa").write_text(SSH_KEY)
        (m.home / ".bashrc").write_text(BASHRC)
        comp = crew_server.create_computer()
        evil = crew_server.create_agent(f"evil{mode}{engine}", computer_id=comp["computer_id"])
        good = crew_server.create_agent(f"good{mode}{engine}", computer_id=comp["computer_id"])
        evil_dm = crew_server.create_room("dm", [evil["id"]])
        good_dm = crew_server.create_room("dm", [good["id"]])
        bootstrap = bootstrap_for(
            crew_server.url, comp["token"], m, sandbox_mode=mode, engine_mode=engine
        )
        c = launch(m, bootstrap)
        try:
            usable(c)
            # The innocent agent has a turn first: a session, a memory, files to aim at.
            crew_server.post(good_dm["id"], "hello good")
            [first] = finished(crew_server, good["id"], 1)
            assert first["status"] == "succeeded", first
            good_dir = m.crew_home / "agents" / good["id"]
            evil_dir = m.crew_home / "agents" / evil["id"]
            good_session = orjson.loads(
                (good_dir / "engines" / "opencode" / "session.json").read_bytes()
            )["session_id"]
            [run_id] = [p.name for p in (m.crew_home / "runtime").iterdir()]
            [launcher_sock] = (m.crew_home / "sockets").glob("launcher-*.sock")
            good_before = _tree(good_dir)
            marker = f"{300 + random.random():.6f}"
            probe = {
                "phases": ["probe", "links"],
                # A failed turn saves no session: the FIFO stays for the next turn to meet.
                "fail_after": ["probe"],
                "user_home": str(m.home),
                "other_agent_dir": str(good_dir),
                "other_token": str(
                    m.crew_home / "runtime" / run_id / "agents" / good["id"] / "token"
                ),
                "bin_crew": str(m.crew_home / "runtime" / run_id / "bin" / "crew"),
                "computer_sock": str(c.socket),
                "launcher_sock": str(launcher_sock),
                "computer_pid": c.proc.pid,
                "marker": marker,
            }

            crew_server.post(evil_dm["id"], "be bad:\nFAKE:HOSTILE " + json.dumps(probe))
            [probed] = finished(crew_server, evil["id"], 1)
            results = orjson.loads((evil_dir / "hostile-probe.json").read_bytes())

            def denied(name: str, *errnos: int) -> None:
                assert not results[name]["worked"], f"{name} was NOT denied: {results[name]}"
                if errnos:
                    assert results[name]["errno"] in errnos, f"{name}: {results[name]}"

            # The probes ran in a working sandbox: its own token is readable there.
            assert results["read_own_token"]["worked"], results
            denied("read_ssh_key", *HIDDEN)
            denied("read_user_auth", *HIDDEN)  # the file; the turn gets its content by design
            denied("write_bashrc", errno.EROFS, errno.EACCES, errno.ENOENT)
            denied("read_other_token", *HIDDEN)
            denied("read_other_memory", *HIDDEN)
            denied("write_other_work", errno.EROFS, errno.EACCES, errno.ENOENT)
            denied("write_bin_crew", errno.EROFS, errno.EACCES)
            # seccomp refuses socket(AF_UNIX) before any path is looked at (issue 12)
            denied("connect_computer_socket", errno.EPERM)
            denied("connect_launcher_socket", errno.EPERM)
            # The PID namespace hides the Computer: no such process in there.
            denied("kill_0_computer", errno.ESRCH)
            denied("kill_term_computer", errno.ESRCH)
            denied("shell_kill_computer")
            # Its own session.json may become a FIFO: it is its own directory; contained below.
            assert results["session_fifo"]["worked"], results

            # On the host: nothing escaped, the Computer runs, nothing was left running.
            assert probed["status"] == "failed", probed  # it gave up (exit 1): no save, no ack
            assert (m.home / ".bashrc").read_text() == BASHRC
            assert c.proc.poll() is None
            assert c.get("/health")["connected"] is True
            wait_until(
                "the turn's background processes to end", lambda: not processes_with(marker), 5
            )
            session_file = evil_dir / "engines" / "opencode" / "session.json"
            assert stat.S_ISFIFO(session_file.lstat().st_mode)

            # The runner tries its message again by itself (a failed turn keeps it): that
            # turn meets the FIFO: no record, a new session, no hang. Then it swaps its
            # directories for links.
            _, linked = finished(crew_server, evil["id"], 2)
            assert "FAKE:HOSTILE" in crew_server.turn(linked["id"])["input"]
            swapped = orjson.loads((evil_dir / "hostile-links.json").read_bytes())
            assert swapped["link_work"]["worked"] and swapped["link_engine_dir"]["worked"]
            evil_runs = _dumps(evil_dir / "work.old")
            assert len(evil_runs) == 2
            assert "--session" not in evil_runs[1]["argv"], evil_runs[1]["argv"]
            # Saving the session would go through the link: refused and logged. Its reply
            # went out, so the turn still succeeds and is acked (issue 10, item 4).
            assert linked["status"] == "succeeded", linked
            [saving] = [x for x in c.stderr().splitlines() if "could not be saved" in x]
            assert "symlink" in saving and str(m.crew_home) not in saving
            delivered, read = read_positions(crew_server, evil["id"])[evil_dm["id"]]
            assert read > 0  # the turn's messages were marked read

            # A wake-up with the links in place: before the turn the Computer removes them
            # (never following them: the other agent's tree is checked below) and makes the
            # directories again; the turn runs in a fresh work/ of its own.
            crew_server.post(evil_dm["id"], "and again")

            def healed_turn() -> dict[str, Any] | None:
                turns = finished(crew_server, evil["id"], 3)
                return next(
                    (t for t in turns if "and again" in crew_server.turn(t["id"])["input"]), None
                )

            healed = wait_until("the turn with the new message", healed_turn)
            assert healed["status"] == "succeeded", healed
            for name in ("work", "engines/opencode"):
                assert (evil_dir / name).is_dir() and not (evil_dir / name).is_symlink(), name
            assert any("and again" in d["stdin"] for d in _dumps(evil_dir / "work"))
            assert len(_dumps(evil_dir / "work.old")) == 2  # what it moved aside is kept
            acked = read
            delivered, read = read_positions(crew_server, evil["id"])[evil_dm["id"]]
            assert read == delivered > acked

            # The other agent is untouched, and its next turn continues its own session.
            assert _tree(good_dir) == good_before
            # …and its `crew` (the shared bin/crew) still works.
            crew_server.post(
                good_dm["id"], f"still fine?\nFAKE:RUN echo all good | crew reply {good_dm['id']}"
            )
            _, second = finished(crew_server, good["id"], 2)
            assert second["status"] == "succeeded", second
            dumps = _dumps(good_dir / "work")
            assert len(dumps) == 2, [d["env"].get("CREW_TOKEN_FILE") for d in dumps]
            assert all(good["id"] in d["env"]["CREW_TOKEN_FILE"] for d in dumps)
            assert dumps[1]["argv"][dumps[1]["argv"].index("--session") + 1] == good_session
            replies = [
                x["body"]
                for x in crew_server.messages(good_dm["id"])
                if x["author"]["kind"] == "agent"
            ]
            assert replies == ["all good"]
            assert c.proc.poll() is None
            assert_engine(c, engine)
        finally:
            code = c.stop()
        assert code == 0, c.stderr()[-3000:]


@pytest.mark.parametrize("engine", ["cold", "warm"])
def test_a_planted_session_id_does_not_wedge_the_agent(crew_server: Any, engine: str) -> None:
    """An agent rewrites its session.json with an id no engine run accepts, then crashes
    its turn (so nothing overwrites it). Its next turn starts a new session instead of
    failing forever at the launcher's door."""
    need_sandbox()
    comp = crew_server.create_computer()
    agent = crew_server.create_agent(f"wedge{engine}", computer_id=comp["computer_id"])
    dm = crew_server.create_room("dm", [agent["id"]])
    plant = (
        "python3 -c \"import json, os; p = os.environ['HOME'] + '/engines/opencode/session.json'; "
        "d = json.load(open(p)); d['session_id'] = '--model=evil/x'; "
        "open(p + '.t', 'w').write(json.dumps(d)); os.rename(p + '.t', p)\"; kill -9 $PPID"
    )
    with machine() as m:
        m.log_in()
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m, engine_mode=engine))
        try:
            usable(c)
            crew_server.post(dm["id"], "hello")
            finished(crew_server, agent["id"], 1)
            crew_server.post(dm["id"], f"plant it:\nFAKE:ONCE RUN {plant}")
            _, planted = finished(crew_server, agent["id"], 2)
            assert planted["failure"]["class"] == "process_crashed", planted["failure"]
            session = m.crew_home / "agents" / agent["id"] / "engines" / "opencode" / "session.json"
            assert orjson.loads(session.read_bytes())["session_id"] == "--model=evil/x"
            crew_server.post(dm["id"], "are you ok?")
            *_, last = finished(crew_server, agent["id"], 3)
            assert last["status"] == "succeeded", last["failure"]
            assert orjson.loads(session.read_bytes())["session_id"].startswith("ses_")
            runs = _dumps(m.crew_home / "agents" / agent["id"] / "work")
            assert "--session" not in runs[-1]["argv"], runs[-1]["argv"]
            assert_engine(c, engine)
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]
