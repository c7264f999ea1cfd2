"""`crew-computer status` and `crew-computer follow` against a real Computer process.

The console script as a person runs it: `status` prints the Computer and its
agents (or JSON), `follow @agent` prints a live turn readably and survives the
Computer restarting, Ctrl+C ends it with status 0 and no traceback, and both
say clearly when no Computer runs.
"""

from __future__ import annotations

import io
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import anyio
import orjson
import pytest

from computer_service.event_bus import EventBus
from computer_service.introspection import Health, IntrospectionServer, create_app
from computer_service.watch import ComputerUnavailable, status
from crew_harness.waiting import wait_until
from crew_testkit.computer_proc import ComputerProc, Machine, bootstrap_for, launch, machine
from tests.computer.static_view import StaticView
from tests.support.ci import required_in_ci
from tests.support.computer import need_sandbox, usable
from tests.support.turns import finished

pytestmark = pytest.mark.timeout(180)

# Starts the Computer with a soft open file limit of 256 (its hard limit unchanged).
LOW_SOFT_FILE_LIMIT = [
    sys.executable,
    "-c",
    "import os, resource, sys\n"
    "_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n",
]


def crew_computer() -> str:
    path = Path(sys.executable).parent / "crew-computer"
    if not path.exists():
        required_in_ci("the crew-computer console script (scripts/setup)")
    return str(path)


def watch(m: Machine, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [crew_computer(), *args, "--crew-home", str(m.crew_home)],
        capture_output=True,
        text=True,
        timeout=60,
        env=m.env(),
    )


class LineReader:
    """Lines of a child's stdout, waited for with select (no sleeps)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.lines: list[str] = []
        self._buffer = b""

    def until(self, what: str, found: Any, count: int = 1, timeout: float = 60) -> str:
        """The `count`th line for which `found` is true, once it was printed."""
        deadline = time.monotonic() + timeout
        while True:
            matching = [line for line in self.lines if found(line)]
            if len(matching) >= count:
                return matching[count - 1]
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line with {what}; got:\n" + "\n".join(self.lines))
            ready, _, _ = select.select([self.stream], [], [], left)
            if ready:
                chunk = os.read(self.stream.fileno(), 65536)
                if not chunk:
                    raise AssertionError(f"stdout closed before {what}:\n" + "\n".join(self.lines))
                self._buffer += chunk
                *complete, self._buffer = self._buffer.split(b"\n")
                self.lines += [line.decode() for line in complete]


def test_status_shows_the_computer_and_its_agents(crew_server: Any) -> None:
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        alice = crew_server.create_agent("alice7", computer_id=comp["computer_id"])
        dm = crew_server.create_room("dm", [alice["id"]])
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m), wrap=LOW_SOFT_FILE_LIMIT)
        try:
            usable(c)
            wait_until("connected", lambda: c.get("/health")["connected"])
            # The Computer took the whole open file limit it may have (soft raised to hard).
            limits = Path(f"/proc/{c.proc.pid}/limits").read_text()
            [files] = [line for line in limits.splitlines() if line.startswith("Max open files")]
            soft, hard = files.split()[3:5]
            assert soft == hard != "256", files
            crew_server.post(dm["id"], f"run this\nFAKE:RUN echo pong | crew reply {dm['id']}")
            [turn] = finished(crew_server, alice["id"], 1)
            assert turn["status"] == "succeeded", turn["failure"]
            wait_until("the turn counted", lambda: c.get("/agents")[0]["today"]["turns"] == 1)

            text = watch(m, "status")
            assert text.returncode == 0, text.stderr
            out = text.stdout
            assert f"Server:   {crew_server.url}, connected since" in out
            assert "sandbox bwrap (ok)" in out and "engine opencode 0.0.0-fake" in out
            header, row = [
                line for line in out.splitlines() if "@alice7" in line or "AGENT" in line
            ]
            assert header.split() == [
                "AGENT", "STATE", "TURN", "AGE", "LAST", "RESULT", "TOKENS", "TODAY", "COST", "TODAY",
                "EGRESS",
            ]  # fmt: skip
            # The fake engine's two steps (the command, then "ok") report 100 in / 20 out
            # tokens and $0.001 each.
            assert row.split()[:5] == ["@alice7", "idle", "-", "-", "succeeded"]
            assert "240 (200 in, 40 out)" in row and "$0.0020" in row
            assert row.split()[-1] == "public"  # the default egress policy

            answer = orjson.loads(watch(m, "status", "--json").stdout)
            assert answer["health"]["connected_since"] is not None
            assert answer["health"]["server_url"] == crew_server.url
            [agent] = answer["agents"]
            assert agent["today"]["input_tokens"] == 200 and agent["today"]["cost"] > 0

            with c.local() as local:
                metrics = local.get("/metrics").text
            labels = f'agent_id="{alice["id"]}",handle="alice7"'
            assert f"crew_agent_input_tokens_total{{{labels}}} 200" in metrics
            assert f"crew_agent_output_tokens_total{{{labels}}} 40" in metrics
            assert f"crew_agent_cost_total{{{labels}}} 0.002000" in metrics
            assert 'crew_computer_build_info{version="' in metrics
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]


def test_status_and_follow_say_when_no_computer_runs() -> None:
    with machine() as m:
        for args in (("status",), ("status", "--json"), ("follow",)):
            done = watch(m, *args)
            assert done.returncode == 1, args
            assert done.stdout == ""
            assert done.stderr.count("\n") == 1, done.stderr
            assert done.stderr.startswith(f"crew-computer: no Computer is running on {m.crew_home}")
            assert "crew-computer run --config" in done.stderr


def test_follow_prints_a_live_turn_survives_a_restart_and_ctrl_c_exits_0(
    crew_server: Any,
) -> None:
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        alice = crew_server.create_agent("alice8", computer_id=comp["computer_id"])
        bob = crew_server.create_agent("bob8", computer_id=comp["computer_id"])
        dm = crew_server.create_room("dm", [alice["id"]])
        bob_dm = crew_server.create_room("dm", [bob["id"]])
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
        follower: subprocess.Popen[bytes] | None = None
        try:
            usable(c)
            wait_until("both agents", lambda: len(c.get("/agents")) == 2)
            follower = subprocess.Popen(
                [crew_computer(), "follow", "@alice8", "--crew-home", str(m.crew_home)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=m.env(),
            )
            assert follower.stdout is not None
            out = LineReader(follower.stdout)
            out.until("the greeting", lambda line: line.startswith("following @alice8"))
            wait_until("the follower subscribed", lambda: _readers(c) >= 1)

            crew_server.post(bob_dm["id"], "bob works unseen")
            finished(crew_server, bob["id"], 1)
            crew_server.post(dm["id"], f"run this\nFAKE:RUN echo pong | crew reply {dm['id']}")
            end = out.until("the end of the turn", lambda line: "■ turn" in line)
            assert (
                "■ turn succeeded: 2 steps, 1 tool calls, 200 in / 40 out tokens, $0.0020" in end
            ), out.lines
            out.until("the start", lambda line: "@alice8  ▶ turn " in line)
            out.until("the steps", lambda line: line.endswith("@alice8  step 2"))
            out.until("the text", lambda line: line.endswith("@alice8  says: ok"))
            out.until(
                "the tool call",
                lambda line: f"tool bash: echo pong | crew reply {dm['id']}" in line,
            )
            out.until("its output", lambda line: "@alice8    → Message sent to room" in line)
            assert not any("bob8" in line for line in out.lines)

            # The Computer goes away and comes back: follow waits, then goes on.
            assert c.stop() == 0, c.stderr()[-3000:]
            out.until("the wait", lambda line: "does not answer; waiting" in line)
            c = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
            usable(c)
            out.until("the return", lambda line: "answers again" in line)
            crew_server.post(dm["id"], "after the restart")
            out.until("the second turn", lambda line: "■ turn succeeded" in line, count=2)

            follower.send_signal(signal.SIGINT)  # what Ctrl+C sends
            assert follower.wait(timeout=30) == 0
            assert follower.stderr is not None
            assert follower.stderr.read() == b""  # no traceback
        finally:
            if follower is not None and follower.poll() is None:
                follower.kill()
                follower.wait()
            assert c.stop() == 0, c.stderr()[-3000:]


def _readers(c: ComputerProc) -> int:
    """How many `/events` readers the Computer has (counted by the `follow` client)."""
    with c.local() as local:
        text = local.get("/metrics").text
    for line in text.splitlines():
        if line.startswith("crew_event_readers "):
            return int(line.split()[1])
    raise AssertionError("no crew_event_readers in /metrics")


class BrokenView(StaticView):
    def health(self) -> Health:
        raise RuntimeError("a bug")


@pytest.mark.anyio
async def test_status_says_what_a_failing_computer_answered(tmp_path: Path) -> None:
    crew_home = tmp_path / "crew"
    server = IntrospectionServer(
        create_app(BrokenView(), EventBus()), crew_home / "sockets" / "computer.sock"
    )
    await server.start()
    try:
        with pytest.raises(ComputerUnavailable) as failed:
            await anyio.to_thread.run_sync(status, crew_home, False, io.StringIO())
    finally:
        await server.stop()
    assert str(failed.value).startswith("the Computer answered /health with 500: ")
    assert "a bug" in str(failed.value)
