"""A `crew reply` is done once when its answer is lost or its server pauses (issue 22).

Real processes: the reference server, the installed `crew`, and for the lost answer a
proxy in between that forwards the request and drops the first reply's answer. Each test
counts the room's messages in the server afterwards: exactly one.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from crew_testkit.crew_server_proc import CrewServer, start_crew_server
from tests.shim.world import CREW_BIN, Agent, make_agent
from tests.support.ci import required_in_ci


class AnswerDropper:
    """Loopback proxy: forwards each request; the first POST /agent/reply's answer is
    read from the server and thrown away (the client sees the connection close)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.dropped = 0
        self.forwarded = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with client:
                request = _read_request(client)
                with socket.create_connection(("127.0.0.1", self.upstream_port)) as up:
                    up.sendall(request)
                    answer = _read_until_close(up)
                self.forwarded += 1
                if request.startswith(b"POST /agent/reply ") and self.dropped == 0:
                    self.dropped += 1
                    continue  # the server did the write; its answer is lost
                client.sendall(answer)

    def close(self) -> None:
        self.listener.close()


def _read_request(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def _read_until_close(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


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
    proxy = AnswerDropper(int(server.url.rsplit(":", 1)[1]))
    try:
        sent = crew_reply(proxy.url, alice, room_id, "The build is green.")
    finally:
        proxy.close()
    assert proxy.dropped == 1 and proxy.forwarded >= 2  # the retry went through too
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
