"""A Computer replaced by another with its token, and a second one on its crew home
(issue 10, item 1); real crew-server, real `crew-computer`s, real launcher and sandbox.

What used to happen: a second `crew-computer` with the same token connected and
the first one stayed "healthy". Its turns went on, every `crew reply` they made
was refused ("token expired"), yet the turn succeeded and its ack (made with the
server's newest epoch, not its own) marked the messages read: lost, 3 of 3.
A second `crew-computer` on the same crew home connected too (replacing the
first one upstream) before it noticed anything was wrong.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from crew_harness.waiting import wait_until
from crew_testkit.computer_proc import ComputerProc, bootstrap_for, launch, machine
from tests.faults.chain import read_positions
from tests.support.computer import need_sandbox, usable
from tests.support.turns import finished

pytestmark = pytest.mark.timeout(180)


def _exit_status(c: ComputerProc, timeout: float = 60) -> int:
    """Wait for the process to end by itself; its exit status."""
    try:
        return c.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"crew-computer still runs after {timeout:g} s:\n{c.stderr()[-3000:]}"
        ) from None


def _reason_lines(c: ComputerProc) -> list[str]:
    """The stderr lines that give the exit reason (`crew-computer: …`); logs are the rest."""
    return [line for line in c.stderr().splitlines() if line.startswith("crew-computer:")]


def _epoch(server: Any, computer_id: str) -> int:
    [row] = [r for r in server.client().get("/api/computers").json() if r["id"] == computer_id]
    return int(row["epoch"])


def _agent_replies(server: Any, room_id: str) -> list[str]:
    return [x["body"] for x in server.messages(room_id) if x["author"]["kind"] == "agent"]


def _work_dir(crew_home: Path, agent_id: str) -> Path:
    return crew_home / "agents" / agent_id / "work"


def test_a_computer_replaced_by_another_with_its_token_exits_and_nothing_is_lost(
    crew_server: Any,
) -> None:
    """The first Computer is mid-turn when a second one connects with the same token.

    Before the fix the first one stayed up, its turn's reply was refused and the
    message was acked anyway (lost). Now the server ends its stream with
    `superseded`: it stops without ack and exits 1 with one line, and the second
    one answers that message and the next, each exactly once.
    """
    need_sandbox()
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("replaced1", computer_id=comp["computer_id"])
    dm = crew_server.create_room("dm", [agent["id"]])
    with machine() as first_machine, machine() as second_machine:
        for m in (first_machine, second_machine):
            m.log_in()
        first = launch(first_machine, bootstrap_for(crew_server.url, comp["token"], first_machine))
        second: ComputerProc | None = None
        try:
            usable(first)
            # The engine answers only once `go` is in its work dir: the test puts it
            # there for the second Computer only, so the first one is replaced mid-turn.
            in_flight = crew_server.post(
                dm["id"],
                "in flight while replaced\n"
                f"FAKE:RUN while [ ! -e go ]; do sleep 0.1; done; echo answer | crew reply {dm['id']}",
            )
            [running] = wait_until("the first turn", lambda: crew_server.turns(agent["id"]))
            wait_until("its first event", lambda: crew_server.turn(running["id"])["events"])
            epoch_before = _epoch(crew_server, comp["computer_id"])

            second = launch(
                second_machine, bootstrap_for(crew_server.url, comp["token"], second_machine)
            )
            assert _epoch(crew_server, comp["computer_id"]) == epoch_before + 1

            assert _exit_status(first) == 1, first.stderr()[-3000:]
            [reason] = _reason_lines(first)
            assert "another Computer connected" in reason and "token" in reason, reason
            assert first.proc.stdout is not None
            assert first.proc.stdout.read() == b""  # nothing after `ready`

            usable(second)
            work = _work_dir(second_machine.crew_home, agent["id"])
            wait_until("the agent's work dir on the second Computer", work.is_dir)
            (work / "go").touch()
            turns = finished(crew_server, agent["id"], 2, timeout=60)
            assert turns[0]["id"] == running["id"] and turns[0]["status"] != "succeeded", turns
            assert turns[-1]["status"] == "succeeded", turns[-1]
            assert _agent_replies(crew_server, dm["id"]) == ["answer"]
            assert read_positions(crew_server, agent["id"])[dm["id"]][1] >= in_flight["seq"]

            # A message posted afterwards: answered once, by the second Computer.
            after = crew_server.post(
                dm["id"], f"after the replacement\nFAKE:RUN echo again | crew reply {dm['id']}"
            )
            count = len(turns) + 1
            newest = finished(crew_server, agent["id"], count, timeout=60)[-1]
            assert newest["status"] == "succeeded", newest
            assert "after the replacement" in crew_server.turn(newest["id"])["input"]
            assert _agent_replies(crew_server, dm["id"]) == ["answer", "again"]
            assert read_positions(crew_server, agent["id"])[dm["id"]][1] >= after["seq"]
            assert len(crew_server.turns(agent["id"])) == count
            assert _epoch(crew_server, comp["computer_id"]) == epoch_before + 1
        finally:
            first.stop(timeout=10)
            if second is not None:
                assert second.stop() == 0, second.stderr()[-3000:]


def test_a_second_computer_on_the_same_crew_home_refuses_before_it_connects(
    crew_server: Any,
) -> None:
    """A second `crew-computer` on a crew home in use exits 1 without connecting.

    Before the fix it connected first (the server gave its token a new epoch,
    replacing the running Computer upstream) and only failed later, on the
    socket in use. Now it refuses on the crew home's lock: the first Computer
    keeps its connection (same epoch) and goes on answering.
    """
    need_sandbox()
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("samehome1", computer_id=comp["computer_id"])
    dm = crew_server.create_room("dm", [agent["id"]])
    with machine() as m:
        m.log_in()
        first = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
        try:
            usable(first)
            epoch_before = _epoch(crew_server, comp["computer_id"])

            second = launch(m, bootstrap_for(crew_server.url, comp["token"], m), wait_ready=False)
            assert _exit_status(second) == 1, second.stderr()[-3000:]
            assert second.proc.stdout is not None
            assert second.proc.stdout.read() == b""  # never said `ready`
            [reason] = _reason_lines(second)
            assert str(m.crew_home) in reason and f"pid {first.proc.pid}" in reason, reason
            assert "connected as computer" not in second.stderr(), second.stderr()

            # The first one is untouched: same connection, still answering.
            assert _epoch(crew_server, comp["computer_id"]) == epoch_before
            health = first.get("/health")
            assert health["connected"] and health["ready"], health
            message = crew_server.post(
                dm["id"], f"still there?\nFAKE:RUN echo still here | crew reply {dm['id']}"
            )
            [turn] = finished(crew_server, agent["id"], 1)
            assert turn["status"] == "succeeded", turn
            assert _agent_replies(crew_server, dm["id"]) == ["still here"]
            assert read_positions(crew_server, agent["id"])[dm["id"]][1] >= message["seq"]
            assert _epoch(crew_server, comp["computer_id"]) == epoch_before
        finally:
            code = first.stop()
        assert code == 0, first.stderr()[-3000:]
