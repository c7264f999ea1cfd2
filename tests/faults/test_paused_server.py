"""crew-server SIGSTOPped for 25 s right as the agent's `crew reply` goes out: answered once.

Real processes: crew-server, the Computer with its launcher and sandbox, the fake engine
running the real `crew` — cold (`opencode run` per turn) and warm (`opencode serve`,
whose environment is fixed at its start, so the turn identity reaches `crew` through the
turn file). The agent's reply reaches a paused server; `crew` gives up after its 10 s,
the turn fails as `reply_refused` and its end waits for the server too. When the server
resumes it takes the reply late: the reply counts for the turn that sent it (by the
`Crew-Turn` identity) and the server acknowledges that room for it, so the retry of the
failed turn finds nothing to answer again. Before issue 22 the message was answered
twice. Counted from the server's database.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from crew_harness.waiting import wait_until
from crew_testkit.computer_proc import bootstrap_for, launch, machine
from crew_testkit.crew_server_proc import CrewServer, start_crew_server
from tests.faults.test_hostile_agent import assert_engine
from tests.support.computer import need_sandbox, usable
from tests.support.turns import finished

pytestmark = pytest.mark.timeout(240)

PAUSE_S = 25.0


def agent_answers(server: CrewServer, room_id: str) -> list[tuple[str, str | None]]:
    """The agent's messages in the room with the turn each is recorded for, from the database."""
    with sqlite3.connect(server.db) as db:
        return list(
            db.execute(
                "SELECT body, turn_id FROM messages WHERE room_id = ? AND author_kind = 'agent' "
                "ORDER BY seq",
                (room_id,),
            )
        )


@pytest.mark.parametrize("engine", ["cold", "warm"])
def test_a_server_paused_25_s_as_crew_reply_goes_out_answers_once(
    tmp_path: Path, engine: str
) -> None:
    need_sandbox()
    server = start_crew_server(tmp_path / "server")
    try:
        with machine() as m:
            m.log_in()
            comp = server.create_computer()
            agent = server.create_agent(f"paused{engine}", computer_id=comp["computer_id"])
            dm = server.create_room("dm", [agent["id"]])
            home = m.crew_home / "agents" / agent["id"]
            # The agent says it is about to reply, then waits for the test's go: the test
            # pauses the server in between, so the reply goes to a stopped server.
            server.post(
                dm["id"],
                'reply once:\nFAKE:RUN cp "$CREW_TURN_FILE" "$HOME/turn-seen"; '
                'touch "$HOME/replying"; '
                'for i in $(seq 200); do [ -e "$HOME/go" ] && break; sleep 0.05; done; '
                f"printf 'answered once' | crew reply {dm['id']}",
            )
            c = launch(m, bootstrap_for(server.url, comp["token"], m, engine_mode=engine))
            try:
                usable(c)
                wait_until("the agent about to reply", (home / "replying").exists, 60)
                os.kill(server.process.pid, signal.SIGSTOP)  # a laptop lid, a GC pause
                paused_at = time.monotonic()
                try:
                    (home / "go").touch()
                    # crew gives up after its 10 s; the turn's end waits for the server.
                    time.sleep(max(0.0, PAUSE_S - (time.monotonic() - paused_at)))
                finally:
                    os.kill(server.process.pid, signal.SIGCONT)
                [first] = finished(server, agent["id"], 1, 90)
                assert first["status"] == "failed", first
                assert first["failure"]["class"] == "reply_refused", first
                # A later message gets its own turn; the first must not come back with it.
                server.post(dm["id"], f"and now?\nFAKE:RUN printf 'second' | crew reply {dm['id']}")
                turns = wait_until(
                    "the later message answered",
                    lambda: (
                        done
                        if any(b == "second" for b, _ in agent_answers(server, dm["id"]))
                        and (done := finished(server, agent["id"], 2, 60))
                        else None
                    ),
                    90,
                )
                assert_engine(c, engine)
            finally:
                assert c.stop() == 0, c.stderr()[-3000:]
            answers = agent_answers(server, dm["id"])
            assert [b for b, _ in answers] == ["answered once", "second"], answers
            # The late reply counts for the turn whose crew sent it (its Crew-Turn identity).
            assert answers[0][1] == first["id"], (answers, turns)
            # That identity reached crew through the turn file, in both engines.
            with sqlite3.connect(server.db) as db:
                [(kept,)] = db.execute(
                    "SELECT secret_hash FROM turns WHERE id = ?", (first["id"],)
                ).fetchall()
            seen = (home / "turn-seen").read_bytes().strip()
            assert hashlib.sha256(seen).hexdigest() == kept
            assert not any("reply once" in t["input"] for t in turns[1:]), turns
    finally:
        if server.process.poll() is None:
            os.kill(server.process.pid, signal.SIGCONT)
        server.stop()
