"""A `crew reply` is done once when its answer is lost or its server pauses (issue 22).

Real processes: the reference server, the installed `crew`, and for the lost answer a
proxy in between that forwards the request and drops the first reply's answer. Each test
counts the room's messages in the server afterwards: exactly one. The lost answer
also through the whole chain, the real OpenCode in both engines behind the proxy.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from crew_testkit.crew_server_proc import CrewServer, start_crew_server
from tests.faults.engines import ENGINE_MODES, fault_chain, reply_rule
from tests.faults.forwarding_proxy import ForwardingProxy
from tests.shim.world import CREW_BIN, Agent, make_agent
from tests.support.ci import required_in_ci


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[CrewServer, Agent, str]]:
    if not CREW_BIN.exists():
        required_in_ci(f"the installed crew command ({CREW_BIN}; run scripts/setup)")
    server = start_crew_server(tmp_path)
    try:
        computer = server.create_computer()
        alice = make_agent(server, computer, "alice", tmp_path)
        room = server.create_room("dm", [alice.id])
        yield server, alice, str(room["id"])
    finally:
        if server.process.poll() is None:
            os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


def crew_reply(url: str, agent: Agent, room_id: str, body: str) -> subprocess.CompletedProcess[str]:
    env = {
        "CREW_SERVER_URL": url,
        "CREW_TOKEN_FILE": str(agent.token_file),
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
    }
    return subprocess.run(
        [str(CREW_BIN), "reply", room_id],
        input=body,
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )


def bodies(server: CrewServer, room_id: str) -> list[str]:
    return [m["body"] for m in server.messages(room_id) if m["kind"] != "notice"]


def test_a_reply_whose_answer_is_lost_is_retried_and_posted_once(
    served: tuple[CrewServer, Agent, str],
) -> None:
    server, alice, room_id = served
    proxy = ForwardingProxy(int(server.url.rsplit(":", 1)[1]))
    proxy.drop(b"POST /agent/reply ")
    try:
        sent = crew_reply(proxy.url, alice, room_id, "The build is green.")
    finally:
        proxy.close()
    assert len(proxy.dropped) == 1 and len(proxy.forwarded) >= 2  # the retry went through too
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout == f"Message sent to room {room_id}.\n"
    # The agent, unsure, runs the same command again in the same turn: still one.
    again = crew_reply(server.url, alice, room_id, "The build is green.")
    assert again.returncode == 0, again.stderr
    assert bodies(server, room_id) == ["The build is green."]


@pytest.mark.timeout(60)
def test_a_reply_to_a_paused_server_lands_once_when_sent_again(
    served: tuple[CrewServer, Agent, str],
) -> None:
    server, alice, room_id = served
    os.kill(server.process.pid, signal.SIGSTOP)  # a laptop lid, a GC pause
    try:
        late = crew_reply(server.url, alice, room_id, "Deployed.")
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    assert late.returncode == 1 and "again is safe" in late.stderr, late.stderr
    # The agent follows the text and sends the same reply again after the pause.
    again = crew_reply(server.url, alice, room_id, "Deployed.")
    assert again.returncode == 0, again.stderr
    assert bodies(server, room_id) == ["Deployed."]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("engine", ENGINE_MODES)
def test_a_reply_whose_answer_is_lost_on_the_way_to_the_sandbox_answers_once_in_both_engines(
    engine: str,
) -> None:
    """The real OpenCode, both engines, the Computer and its sandboxes' `crew` behind a
    proxy that loses the first reply's answer: `crew` retries with its key, the turn
    succeeds, every message answered once (counted from the database)."""
    with fault_chain(engine, through_proxy=True) as fc:
        assert fc.proxy is not None
        fc.chain.script([reply_rule("LOST", "The build is green.")])
        agent = fc.chain.agent("lostanswer")
        dm = fc.chain.dm(agent["id"])
        fc.proxy.drop(b"POST /agent/reply ")
        fc.chain.post(dm["id"], "LOST: is the build green?")
        [turn] = fc.chain.finished_turns(agent["id"], 1)
        assert len(fc.proxy.dropped) == 1, fc.proxy.forwarded
        assert turn["status"] == "succeeded", (turn["failure"], fc.chain.diagnostics())
        fc.answered_once(1)
        assert fc.agent_replies(dm["id"]) == ["The build is green."]
        fc.chain.check_engine()
