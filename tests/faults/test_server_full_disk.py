"""The crew server's disk fills up and frees again (issue 10, item 9); real processes.

The server's database lives on a small tmpfs that the test fills with a
filler file. What used to happen: a write on the full disk answered 500 "a bug
of the server" and the connection was reset; the log showed "cannot rollback -
no transaction is active", hiding "database or disk is full" (the failed
statement had already rolled the transaction back, and the second ROLLBACK
raised over it). Now the server answers 503 `storage_full` with `Retry-After`,
keeps the connection and works again as soon as space is back. A turn whose
reply went out just before the disk filled answers its message once, with the
fake engine and with the real OpenCode in both engines.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from crew_harness.waiting import wait_until
from crew_testkit.computer_proc import bootstrap_for, launch, machine
from crew_testkit.crew_server_proc import CrewServer, start_crew_server
from tests.faults.chain import read_positions
from tests.faults.engines import ENGINE_MODES, fault_chain, reply_rule
from tests.support.ci import required_in_ci
from tests.support.computer import need_sandbox, usable

pytestmark = pytest.mark.timeout(180)

DISK_SIZE = "4m"
# Enough posts to use up whatever the WAL file can still take without growing.
MAX_POSTS_TO_FILL = 400


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A directory on a tmpfs of `DISK_SIZE`, unmounted afterwards."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        required_in_ci("root (to mount a small tmpfs for the server's database)")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE},mode=0700", "tmpfs", str(disk)],
        check=True,
    )
    try:
        yield disk
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=False)


def _fill(path: Path) -> None:
    """Write `path` until the disk has no byte left."""
    chunk = b"\0" * 65536
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (65536, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, chunk[:size])
    finally:
        os.close(fd)
    with pytest.raises(OSError) as full:
        path.with_suffix(".probe").write_bytes(b"x")
    assert full.value.errno == errno.ENOSPC


def _client_port(response: httpx.Response) -> int:
    """The local port of the connection the answer came on."""
    return int(response.extensions["network_stream"].get_extra_info("client_addr")[1])


def _post_until_refused(client: httpx.Client, room_id: str) -> httpx.Response:
    """Post messages until the full disk refuses one (the WAL may take a few first)."""
    for n in range(MAX_POSTS_TO_FILL):
        answer = client.post(
            f"/api/rooms/{room_id}/messages", json={"body": f"filling {n} " + "z" * 4000}
        )
        if answer.status_code != 201:
            return answer
    raise AssertionError(f"{MAX_POSTS_TO_FILL} posts were stored on a full disk")


def _assert_storage_full(answer: httpx.Response, server: CrewServer) -> None:
    assert answer.status_code == 503, f"{answer.status_code} {answer.text}\n{server.output()}"
    assert answer.json()["error"]["code"] == "storage_full", answer.text
    assert int(answer.headers["Retry-After"]) > 0, answer.headers


def test_a_full_disk_answers_503_keeps_the_connection_and_recovers(
    small_disk: Path, tmp_path: Path
) -> None:
    server = start_crew_server(tmp_path / "srv", db=small_disk / "crew.db")
    filler = small_disk / "filler"
    try:
        agent = server.create_agent("fulldisk1")
        dm = server.create_room("dm", [agent["id"]])
        # One connection at most: every request below must travel on the same one.
        with httpx.Client(
            base_url=server.url,
            timeout=10,
            limits=httpx.Limits(max_connections=1),
            headers=server.user_headers,
        ) as client:
            port = _client_port(client.get("/health"))
            _fill(filler)
            refused = _post_until_refused(client, dm["id"])
            _assert_storage_full(refused, server)
            assert _client_port(refused) == port

            body = "posted while the disk is full"
            again = client.post(f"/api/rooms/{dm['id']}/messages", json={"body": body})
            _assert_storage_full(again, server)
            # Reads still work, on the same connection, and the process lives on.
            listed = client.get(f"/api/rooms/{dm['id']}/messages")
            assert listed.status_code == 200 and _client_port(listed) == port
            assert server.process.poll() is None

            filler.unlink()
            stored = client.post(f"/api/rooms/{dm['id']}/messages", json={"body": body})
            assert stored.status_code == 201, stored.text
            assert _client_port(stored) == port
        bodies = [m["body"] for m in server.messages(dm["id"])]
        assert bodies.count(body) == 1
        assert bodies[-1] == body
        log = server.output()
        assert "cannot rollback" not in log, log
        assert "disk is full" in log, log
    finally:
        server.stop()


def test_an_ack_refused_by_a_full_disk_is_read_once_space_returns(
    small_disk: Path, tmp_path: Path
) -> None:
    """A message answered just before the disk fills is read after it frees, answered once.

    The engine replies, then waits for `go` in its work dir; the test fills the
    disk and puts `go` there. The ack gets 503 past the runner's retry window,
    the turn fails as an environment failure and the runner wakes itself after
    its backoff: once space is back its claim finds the turn that answered (its
    finish lost or made late) and the server reads the room for it, so the
    message is not given again (the engine would reply only once anyway,
    `FAKE:ONCE`).
    """
    need_sandbox()
    server = start_crew_server(tmp_path / "srv", db=small_disk / "crew.db")
    filler = small_disk / "filler"
    try:
        comp = server.create_computer()
        agent = server.create_agent("fulldisk2", computer_id=comp["computer_id"])
        dm = server.create_room("dm", [agent["id"]])
        # The posts that fill what the database can still take go elsewhere.
        elsewhere = server.create_room("dm", [server.create_agent("bystander2")["id"]])
        with machine() as m:
            m.log_in()
            # The ack gives up after 3 s (the default is 60 s), the retry comes after 1 s.
            c = launch(
                m,
                bootstrap_for(
                    server.url, comp["token"], m, upstream_retry_window_s=3, retry_base_s=1
                ),
            )
            try:
                usable(c)
                message = server.post(
                    dm["id"],
                    "answer, then wait\n"
                    f"FAKE:ONCE RUN echo answer | crew reply {dm['id']}; "
                    "while [ ! -e go ]; do sleep 0.1; done",
                )
                wait_until("the agent's reply", lambda: _agent_replies(server, dm["id"]))
                _fill(filler)
                with httpx.Client(
                    base_url=server.url, timeout=10, headers=server.user_headers
                ) as client:
                    _assert_storage_full(_post_until_refused(client, elsewhere["id"]), server)
                (m.crew_home / "agents" / agent["id"] / "work" / "go").touch()

                # The ack was refused for longer than the runner retries it at once:
                # the runner shows why and when it tries again by itself.
                row = wait_until("the runner's retry", lambda: _retrying_row(c, agent["id"]), 60)
                assert "storage_full" in row["last_reason"] or "503" in row["last_reason"], row
                assert read_positions(server, agent["id"])[dm["id"]][1] < message["seq"]

                filler.unlink()
                wait_until(
                    "the message acked",
                    lambda: read_positions(server, agent["id"])[dm["id"]][1] >= message["seq"],
                    90,
                )
                assert _agent_replies(server, dm["id"]) == ["answer"]
                turns = server.turns(agent["id"])
                # The turn whose ack and finish were refused is not left `running`; it
                # answered the room, so the server read it for that turn (issue 22):
                # no other turn is given the message again.
                assert all(t["status"] != "running" for t in turns), turns
                given = [t for t in turns if "answer, then wait" in server.turn(t["id"])["input"]]
                assert [t["status"] for t in given] in (["failed"], ["interrupted"]), turns
                assert c.proc.poll() is None
            finally:
                code = c.stop()
            assert code == 0, c.stderr()[-3000:]
        assert "cannot rollback" not in server.output()
    finally:
        server.stop()


def _agent_replies(server: CrewServer, room_id: str) -> list[str]:
    return [x["body"] for x in server.messages(room_id) if x["author"]["kind"] == "agent"]


def _retrying_row(c: Any, agent_id: str) -> dict[str, Any] | None:
    """The agent's row on the Computer once it waits to try again after a failure."""
    [row] = [r for r in c.get("/agents") if r["id"] == agent_id]
    return row if row["retry_at"] and row["last_reason"] else None


# Today the turn whose finish the full disk refused is `interrupted` only when the next
# turn registers, after that turn's claim was given the same message: answered twice.
@pytest.mark.parametrize("engine", ENGINE_MODES)
def test_a_disk_full_then_freed_mid_turn_answers_once_in_both_engines(
    small_disk: Path, engine: str
) -> None:
    """The real OpenCode, both engines: the agent replies, the disk fills before the turn
    ends (its events, ack and finish are refused), then frees: the message is answered
    once, counted from the database; the model replies every time it is given it."""
    with fault_chain(
        engine, db=small_disk / "crew.db", upstream_retry_window_s=3, retry_base_s=1
    ) as fc:
        fc.chain.script(
            [reply_rule("FULL", "answer", then="while [ ! -e go ]; do sleep 0.1; done")]
        )
        agent = fc.chain.agent("fulldisk3")
        dm = fc.chain.dm(agent["id"])
        elsewhere = fc.chain.dm(fc.chain.agent("bystander3")["id"])
        fc.chain.post(dm["id"], "FULL: answer, then wait")
        wait_until("the agent's reply", lambda: fc.agent_replies(dm["id"]), 90)
        filler = small_disk / "filler"
        _fill(filler)
        _post_until_refused(fc.chain.http, elsewhere["id"])
        (fc.work_dir(agent["id"]) / "go").touch()

        def retrying() -> dict[str, Any] | None:
            with fc.computer.introspection() as local:
                [row] = [r for r in local.get("/agents").json() if r["id"] == agent["id"]]
            return row if row["retry_at"] and row["last_reason"] else None

        wait_until("the runner's retry", retrying, 90)
        filler.unlink()
        # The filler posts that were stored are messages too (to a silent bystander).
        ledger = fc.at_rest()
        mine = [f.verdict for f in ledger.fates if f.room_id == dm["id"]]
        turns = [(t["status"], t["failure"]) for t in fc.chain.turns(agent["id"])]
        story = f"{ledger.summary()}\n{ledger.details()}\n{turns}\n{fc.agent_replies(dm['id'])}"
        assert mine == ["once"], story
        assert fc.agent_replies(dm["id"]) == ["answer"], story
