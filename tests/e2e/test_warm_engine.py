"""The warm engine against the cold one, with the real OpenCode, the real sandbox and the scripted model.

The same scripted turns go through both engines (each with its own agent);
what reaches the runner — the result, its failure class, usage and cost, and
every event in order — must be the same, times and ids aside. Then what only
a warm server has to prove: a hostile turn's leftovers are swept (checked
from the host), and a port the server does not own gets nothing.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator

import anyio
import pytest

from computer_service.engine.base import FailureClass, TurnResult
from computer_service.engine.session import SessionRecord, write_session_record
from computer_service.engine.warm_channel import NotTheServer, ServerAddress, check_owner
from crew_common.procfs import process_start_time
from crew_harness.scripted_model import Script, ScriptedModel
from crew_harness.waiting import wait_until
from crew_testkit.engine_rig import MODEL, EngineRig, TurnRecord, comparable
from tests.e2e.opencode_by_hand import OPENCODE
from tests.support.ci import required_in_ci

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

SCRIPT = {
    "rules": [
        {"match": "TOOL", "reply": {"bash": "echo hello > out.txt && cat out.txt"}},
        {"match": "MULTI", "reply": {"bash": "echo one"}},
        {"role": "tool", "match": "^one", "reply": {"bash": "echo two"}},
        {"match": "E401", "reply": {"error": {"status": 401, "message": "Incorrect API key"}}},
        {"match": "E429", "reply": {"error": {"status": 429, "retry_after_ms": 10}}},
        {"match": "HANG", "reply": {"hang": "headers"}},
        {
            "match": "PTRACE",
            "reply": {
                "bash": "python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); "
                'r = l.ptrace(16, 2, 0, 0); print("ptrace", r, ctypes.get_errno())\''
            },
        },
        {
            # The engine is the tool's parent ($PPID); its memory and signals are out of reach.
            "match": "PROCMEM",
            "reply": {
                "bash": "echo engine=$(tr '\\0' ' ' < /proc/$PPID/cmdline | cut -d' ' -f2); "
                "(exec 3<>/proc/$PPID/mem) 2>&1 | sed 's/.*: //'; "
                "kill -0 $PPID 2>&1 | sed 's/.*- //'; "
                "echo password=${OPENCODE_SERVER_PASSWORD:+set}"
            },
        },
        {
            "match": "HOSTILE",
            "reply": {
                "bash": "(setsid sleep 300 >/dev/null 2>&1 &) ; "
                "(sh -c 'sleep 301 & exit' >/dev/null 2>&1) ; "
                "(trap '' TERM; exec sleep 302) >/dev/null 2>&1 & echo started"
            },
        },
    ]
}


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    if not OPENCODE.exists():
        required_in_ci(f"the real OpenCode at {OPENCODE} (scripts/setup installs it)")
    if not os.path.exists("/usr/bin/bwrap"):
        required_in_ci("bwrap (Debian package bubblewrap)")
    with ScriptedModel(Script.parse(SCRIPT)) as started:
        yield started


async def _stopped_when_hanging(rig: EngineRig, kind: str, agent_id: str) -> TurnRecord:
    """A turn whose model call hangs, stopped once the model has the request."""
    stop = anyio.Event()
    before = len(rig.model.requests())

    async def stop_when_asked() -> None:
        while len(rig.model.requests()) == before:
            await anyio.sleep(0.05)
        stop.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stop_when_asked)
        record = await rig.turn(kind, agent_id, "HANG", stop=stop)
        tg.cancel_scope.cancel()
    return record


def _summary(result: TurnResult) -> tuple[object, ...]:
    failure = result.failure.cls if result.failure else None
    return (result.status, failure, result.usage)


@pytest.mark.timeout(600)
async def test_the_same_turns_give_the_same_records_in_both_engines(model: ScriptedModel) -> None:
    async with EngineRig(model, OPENCODE) as rig:
        for agent_id in ("cold1", "warm1"):
            rig.agent(agent_id)
        records: dict[str, dict[str, TurnRecord]] = {"cold": {}, "warm": {}}
        for kind, agent_id in (("cold", "cold1"), ("warm", "warm1")):
            mine = records[kind]
            for name in ("TRIVIAL", "TOOL", "MULTI", "E401", "E429"):
                mine[name] = await rig.turn(kind, agent_id, name)
            mine["HANG"] = await _stopped_when_hanging(rig, kind, agent_id)
            # A saved session that no longer exists: a new one, and the turn as usual.
            paths = rig.homes[agent_id].paths
            record = SessionRecord.from_json(paths.session_file.read_bytes())
            assert record is not None
            gone = SessionRecord(record.engine, MODEL, record.agents_md_digest, "ses_gone0123")
            write_session_record(paths, gone)
            mine["VANISHED"] = await rig.turn(kind, agent_id, "TRIVIAL")
            assert mine["VANISHED"].result.session_id not in (None, "ses_gone0123")

        cold, warm = records["cold"], records["warm"]
        assert cold["TRIVIAL"].result.status == "succeeded"
        assert [e.type for e in cold["TOOL"].events] == [
            "step_start",
            "tool_use",
            "step_finish",
            "step_start",
            "text",
            "step_finish",
        ]
        assert cold["E401"].result.failure and (
            cold["E401"].result.failure.cls is FailureClass.NOT_LOGGED_IN
        )
        assert cold["E429"].result.failure and (
            cold["E429"].result.failure.cls is FailureClass.RATE_LIMITED
        )
        assert cold["HANG"].result.status == "cancelled"
        # Warm alone reports each tool call as it starts, with the call id its finish has.
        assert "tool_start" not in {e.type for r in cold.values() for e in r.events}
        starts = [e.data["call_id"] for e in warm["TOOL"].events if e.type == "tool_start"]
        uses = [e.data["call_id"] for e in warm["TOOL"].events if e.type == "tool_use"]
        assert starts == uses and len(starts) == 1, warm["TOOL"].events
        for name in cold:
            assert _summary(warm[name].result) == _summary(cold[name].result), name
            assert comparable(warm[name].events) == comparable(cold[name].events), name
        counters = rig.pool.counters
        assert counters.warm_turns == len(warm) and counters.cold_turns == 0
        assert counters.starts == 1  # one server served every warm turn


def _namespace_members(server_pid: int) -> list[str]:
    """What runs in the server's pid namespace besides bwrap's init and the server (host view)."""
    namespace = os.readlink(f"/proc/{server_pid}/ns/pid")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == server_pid:
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != namespace:
                continue
            with open(f"/proc/{entry}/status", encoding="utf-8") as f:
                [ns_pids] = [line for line in f if line.startswith("NSpid:")]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode().strip()
        except (OSError, ValueError):
            continue
        if ns_pids.split()[-1] != "1":  # bwrap's init, the namespace's pid 1, stays
            found.append(command)
    return found


@pytest.mark.timeout(300)
async def test_a_hostile_turns_leftovers_are_swept_and_the_server_stays(
    model: ScriptedModel,
) -> None:
    async with EngineRig(model, OPENCODE) as rig:
        rig.agent("warm1")
        record = await rig.turn("warm", "warm1", "HOSTILE")
        assert record.result.status == "succeeded", record.result.failure
        server = rig.pool.servers["warm1"]
        assert _namespace_members(server.server_pid) == []
        if os.geteuid() == 0 and os.path.isdir("/sys/fs/cgroup/pids"):
            # Root on cgroup v1 (this CI): the server and its tools share the turn caps' cgroup.
            with open(f"/proc/{server.server_pid}/cgroup", encoding="utf-8") as f:
                assert "-warm-warm1" in f.read()
        assert rig.pool.counters.swept_processes >= 3
        # The server is still the same one, and still answers.
        again = await rig.turn("warm", "warm1", "TRIVIAL")
        assert again.result.status == "succeeded"
        assert rig.pool.servers["warm1"] is server
        # The agent's tools cannot attach to the server (its namespace's pid 2).
        traced = await rig.turn("warm", "warm1", "PTRACE")
        [tool] = [e for e in traced.events if e.type == "tool_use"]
        assert tool.data["output"].strip() == "ptrace -1 1"  # EPERM


@pytest.mark.timeout(300)
async def test_a_port_the_server_does_not_own_gets_nothing(model: ScriptedModel) -> None:
    async with EngineRig(model, OPENCODE) as rig:
        rig.agent("warm1")
        first = await rig.turn("warm", "warm1", "TRIVIAL")
        assert first.result.status == "succeeded"
        server = rig.pool.servers["warm1"]
        address = server.address
        check_owner(address)  # the real server passes
        # The holder of the server's host port dies (pasta, with the sandbox's own network;
        # the server itself without); a squatter takes the port.
        os.kill(address.pid, signal.SIGKILL)
        wait_until("the server is gone", lambda: _gone(address.pid), 30)
        squatter = wait_until("the server's port is free", lambda: _listener(address.port), 30)
        squatter.settimeout(0.2)
        try:
            with pytest.raises(NotTheServer):
                check_owner(address)
            # A live process that does not hold the listener is refused too.
            other = ServerAddress(
                os.getppid(), process_start_time(os.getppid()) or 0, address.port, "x"
            )
            with pytest.raises(NotTheServer):
                check_owner(other)
            # The next turn never talks to the squatter: it runs cold, the server is dropped.
            second = await rig.turn("warm", "warm1", "TRIVIAL")
            assert second.result.status == "succeeded", second.result.failure
            with pytest.raises(TimeoutError):
                squatter.accept()
        finally:
            squatter.close()
        assert rig.pool.counters.cold_turns == 1
        assert "warm1" not in rig.pool.servers
        third = await rig.turn("warm", "warm1", "TRIVIAL")
        assert third.result.status == "succeeded", third.result.failure
        assert rig.pool.servers["warm1"].address.pid != address.pid


def _listener(port: int) -> socket.socket | None:
    """A socket listening on 127.0.0.1:`port`, or None while the port is still taken."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    sock.listen(8)
    return sock


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b") ")[1][:1] in (b"Z", b"X")
    except OSError:
        return True


@pytest.mark.timeout(300)
async def test_a_tool_cannot_rewrite_or_signal_its_engine(model: ScriptedModel) -> None:
    """docs/warm-engine.md: each tool runs in a Landlock domain nested in the engine's."""
    async with EngineRig(model, OPENCODE) as rig:
        for kind, subcommand in (("warm", "serve"), ("cold", "run")):
            rig.agent(f"{kind}1")
            record = await rig.turn(kind, f"{kind}1", "PROCMEM")
            assert record.result.status == "succeeded", record.result.failure
            [tool] = [e for e in record.events if e.type == "tool_use"]
            assert tool.data["output"].split("\n")[:4] == [
                f"engine={subcommand}",
                "Permission denied",  # open("/proc/<engine>/mem", O_RDWR)
                "Operation not permitted",  # kill -0: Landlock's signal scope
                "password=",  # a warm server's password stays the server's
            ], tool.data["output"]
            # The turn still answered after its tool result.
            assert [e.data.get("text") for e in record.events if e.type == "text"] == ["done"]
        server = rig.pool.servers["warm1"]
        again = await rig.turn("warm", "warm1", "TRIVIAL")
        assert again.result.status == "succeeded"
        assert rig.pool.servers["warm1"] is server
