"""The shim's HTTP/1.1 reading, and that `crew` ignores every other variable."""

from __future__ import annotations

import pytest

from crew_shim.client import ProtocolError, parse_response


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
