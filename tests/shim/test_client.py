"""The shim's HTTP/1.1 reading, and that `crew` ignores every other variable."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from crew_shim.client import CrewServer, Effect, ProtocolError, parse_response, read_turn


def test_content_length_answer() -> None:
    raw = b'HTTP/1.1 201 Created\r\ncontent-length: 11\r\ncontent-type: application/json\r\n\r\n{"a": "b"}\nEXTRA'
    assert parse_response(raw) == (201, b'{"a": "b"}\n')


def test_chunked_answer() -> None:
    raw = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4\r\n[1, \r\n3;ext=1\r\n2]\n\r\n0\r\n\r\n"
    )
    assert parse_response(raw) == (200, b"[1, 2]\n")


def test_answer_until_close_and_empty_body() -> None:
    assert parse_response(b"HTTP/1.0 204 No Content\r\n\r\n") == (204, b"")
    assert parse_response(b"HTTP/1.1 500 Oops\r\nServer: x\r\n\r\nboom") == (500, b"boom")


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n",
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n12",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nshort",
    ],
)
def test_broken_answers_are_protocol_errors(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_response(raw)


def test_the_turn_identity_is_read_from_the_turn_file(tmp_path: Path) -> None:
    turn = tmp_path / "turn"
    turn.write_text("crt_abc-DEF_123\n")
    assert read_turn(str(turn)) == "crt_abc-DEF_123"


@pytest.mark.parametrize("content", [None, "", "  \n", "two words", "x" * 201, "caf\u00e9"])
def test_no_usable_turn_file_sends_no_identity(tmp_path: Path, content: str | None) -> None:
    turn = tmp_path / "turn"
    if content is not None:
        turn.write_bytes(content.encode())
    assert read_turn(str(turn)) is None
    assert read_turn("") is None  # CREW_TURN_FILE not set


def test_every_call_carries_the_turn_identity_and_writes_their_key(tmp_path: Path) -> None:
    seen: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        for _ in range(2):
            client, _ = listener.accept()
            with client:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += client.recv(65536)
                seen.append(data)
                client.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    server = CrewServer(url, "tok", turn="crt_the_turn")
    effect = Effect(unsent="sent", maybe="it may have been sent")
    server.call("GET", "/agent/tasks", effect=effect)
    server.call("POST", "/agent/reply", {"room_id": "r", "body": "b"}, effect=effect)
    thread.join(5)
    listener.close()
    assert all(b"\r\nCrew-Turn: crt_the_turn\r\n" in request for request in seen), seen
    assert b"Idempotency-Key: crew-" in seen[1] and b"Idempotency-Key" not in seen[0]
