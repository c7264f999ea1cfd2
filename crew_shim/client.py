"""The one HTTP call each `crew` command makes to the crew server.

No httpx and, for `http://`, not even `http.client`: importing httpx costs
~80 ms and http.client ~12 ms (email parser, ssl) per run, and `crew` runs many
times per turn (figures in crew_shim/README.md). A plain HTTP/1.1 exchange over
a socket is all one JSON request needs; `https://` goes through http.client.
One 10 s deadline per command. Every write carries an `Idempotency-Key` derived from
the command's request (`idempotency_key`): the server does a key once per agent and turn,
so `crew` retries a refused or broken connection (and a 503) within its deadline, and the
agent may run the same command again after a timeout. Every call names its turn with the
`Crew-Turn` identity the Computer wrote for it (`read_turn`), so a write that lands late
still counts for the turn that sent it.
"""

from __future__ import annotations

import json
import os
import socket
import time

try:  # the builtin module: `hashlib` loads OpenSSL (~3 ms of every start)
    from _sha256 import sha256
except ImportError:  # an interpreter built without it
    from hashlib import sha256

from crew_shim.errors import CrewError, ServerTimeout, ServerUnreachable

TYPE_CHECKING = False  # typing costs ~2 ms to import; annotations are strings here
if TYPE_CHECKING:
    from typing import Any

TIMEOUT_S = 10.0
_MAX_ANSWER = 8 * 1024 * 1024
_FIRST_PAUSE_S = 0.25  # between retries, doubling, within the one deadline
KEY_HEADER = "Idempotency-Key"
TURN_HEADER = "Crew-Turn"
_MAX_TURN = 200


class Answer:
    """The server's status and decoded JSON (None for an empty body)."""

    __slots__ = ("data", "status")

    def __init__(self, status: int, data: Any) -> None:
        self.status = status
        self.data = data

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def error_code(self) -> str | None:
        error = self.data.get("error") if isinstance(self.data, dict) else None
        return error.get("code") if isinstance(error, dict) else None

    @property
    def error_message(self) -> str | None:
        error = self.data.get("error") if isinstance(self.data, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        return message.strip() if isinstance(message, str) and message.strip() else None


class Effect:
    """How the command's outcome reads when the server is silent or unreachable.

    `unsent` completes "nothing was …"; `maybe` says what may have happened
    and what to check before trying again.
    """

    __slots__ = ("maybe", "unsent")

    def __init__(self, *, unsent: str, maybe: str) -> None:
        self.unsent = unsent
        self.maybe = maybe


class ProtocolError(Exception):
    """The server's answer is not an HTTP/1.1 response we can read."""


class CrewServer:
    """The crew server at `url`, spoken to with the agent's bearer `token`."""

    def __init__(
        self, url: str, token: str, *, turn: str | None = None, timeout: float = TIMEOUT_S
    ) -> None:
        parts = split_url(url)
        if parts is None:
            raise CrewError(
                f'CREW_SERVER_URL is not an http(s) URL ("{url}"). '
                "crew works only inside a turn started by the Computer; tell the user."
            )
        scheme, self._host, self._port, path = parts
        self._https = scheme == "https"
        self._prefix = path.rstrip("/")
        self._token = token
        self._turn = turn
        self._timeout = timeout

    @classmethod
    def from_environment(cls) -> CrewServer:
        """The server named by `CREW_SERVER_URL`, with the token in `CREW_TOKEN_FILE` and
        the turn identity in `CREW_TURN_FILE` (`read_turn`).

        These three variables are all the shim reads from its environment.
        """
        url = os.environ.get("CREW_SERVER_URL", "").strip()
        token_file = os.environ.get("CREW_TOKEN_FILE", "").strip()
        if not url or not token_file:
            missing = "CREW_SERVER_URL" if not url else "CREW_TOKEN_FILE"
            raise CrewError(
                f"{missing} is not set, so crew does not know where to send. "
                "crew works only inside a turn started by the Computer; tell the user."
            )
        try:
            with open(token_file, encoding="utf-8") as handle:
                token = handle.read(4096).strip()
        except OSError as exc:
            raise CrewError(
                f"the token file {token_file} cannot be read ({exc.strerror or exc}). "
                "The turn has probably ended; stop here."
            ) from exc
        if not token:
            raise CrewError(
                f"the token file {token_file} is empty. The turn has probably ended; stop here."
            )
        return cls(url, token, turn=read_turn(os.environ.get("CREW_TURN_FILE", "").strip()))

    def call(self, method: str, path: str, body: Any = None, *, effect: Effect) -> Answer:
        """Send the request and return the answer; network failures become CrewErrors.

        A write is retried with the same key until the deadline when the connection is
        refused or breaks, or the server answers 503 (a full disk, a lost database).
        """
        payload = b"" if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self._turn is not None:
            headers[TURN_HEADER] = self._turn
        if method != "GET":
            headers[KEY_HEADER] = idempotency_key(method, path, payload)
        target = self._prefix + path
        deadline = time.monotonic() + self._timeout
        pause = _FIRST_PAUSE_S
        while True:
            try:
                if self._https:
                    status, raw = self._exchange_https(method, target, headers, payload, effect)
                else:
                    status, raw = self._exchange_plain(
                        method, target, headers, payload, effect, deadline
                    )
            except CrewError:
                if method == "GET" or time.monotonic() + pause >= deadline:
                    raise
            else:
                if status != 503 or method == "GET" or time.monotonic() + pause >= deadline:
                    return Answer(status, _decode(raw))
            time.sleep(pause)
            pause *= 2

    def _exchange_plain(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        payload: bytes,
        effect: Effect,
        deadline: float,
    ) -> tuple[int, bytes]:
        port = self._port or 80
        try:
            sock = socket.create_connection(
                (self._host, port), timeout=max(deadline - time.monotonic(), 0.001)
            )
        except TimeoutError as exc:
            raise self._unreachable("no connection within the timeout", effect) from exc
        except OSError as exc:
            raise self._unreachable(exc.strerror or str(exc), effect) from exc
        head = [f"{method} {target} HTTP/1.1", f"Host: {self._host}:{port}", "Connection: close"]
        head += [f"{name}: {value}" for name, value in headers.items()]
        head.append(f"Content-Length: {len(payload)}")
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload
        received = bytearray()
        try:
            with sock:
                # One deadline for the whole exchange, connecting included.
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                sock.sendall(request)
                while True:
                    sock.settimeout(max(deadline - time.monotonic(), 0.001))
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    received += chunk
                    if len(received) > _MAX_ANSWER:
                        raise ProtocolError("the answer is larger than 8 MiB")
                    if _complete(received):
                        break
            return parse_response(bytes(received))
        except TimeoutError as exc:
            raise self._silent(effect) from exc
        except (OSError, ProtocolError) as exc:
            raise self._broken(exc, effect) from exc

    def _exchange_https(
        self, method: str, target: str, headers: dict[str, str], payload: bytes, effect: Effect
    ) -> tuple[int, bytes]:
        import http.client

        connection = http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout)
        try:
            try:
                connection.connect()
            except TimeoutError as exc:
                raise self._unreachable("no connection within the timeout", effect) from exc
            except OSError as exc:
                raise self._unreachable(exc.strerror or str(exc), effect) from exc
            connection.request(method, target, body=payload or None, headers=headers)
            response = connection.getresponse()
            return response.status, response.read(_MAX_ANSWER)
        except TimeoutError as exc:
            raise self._silent(effect) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise self._broken(exc, effect) from exc
        finally:
            connection.close()

    def _unreachable(self, reason: str, effect: Effect) -> ServerUnreachable:
        return ServerUnreachable(
            f"cannot reach the crew server ({reason}); nothing was {effect.unsent}. "
            "Try again in a minute; if it keeps failing, tell the user."
        )

    def _silent(self, effect: Effect) -> ServerTimeout:
        return ServerTimeout(
            f"the crew server did not answer within {self._timeout:g} seconds, so {effect.maybe}."
        )

    def _broken(self, exc: BaseException, effect: Effect) -> ServerTimeout:
        # The request may have reached the server before the connection broke.
        return ServerTimeout(f"the connection to the crew server broke ({exc}), so {effect.maybe}.")


def read_turn(turn_file: str) -> str | None:
    """The identity of the turn this `crew` runs in, from the file the Computer writes
    before each turn (a warm engine's environment is fixed at its start, so it cannot
    come in a variable). None without one (no file named, none written, unreadable):
    the server then counts the write for the agent's latest turn.
    """
    if not turn_file:
        return None
    try:
        with open(turn_file, encoding="ascii") as handle:
            turn = handle.read(_MAX_TURN + 1).strip()
    except (OSError, ValueError):
        return None
    if not turn or len(turn) > _MAX_TURN or not all("!" <= c <= "~" for c in turn):
        return None
    return turn


def idempotency_key(method: str, path: str, payload: bytes) -> str:
    """The key of a write: the same command with the same request gives the same key.

    The server scopes it to the agent and its turn, so the same reply in another turn
    is a new write.
    """
    digest = sha256(b"crew/1 %s %s\n%s" % (method.encode(), path.encode(), payload))
    return "crew-" + digest.hexdigest()


def split_url(url: str) -> tuple[str, str, int | None, str] | None:
    """Scheme, host (lower case, no IPv6 brackets), port and path of an `http(s)://` URL;
    None when it is not one. What `urllib.parse.urlsplit` gives for these URLs, without
    its import (~4 ms: `ipaddress` and more) on every start.
    """
    scheme, sep, rest = url.strip().partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        return None
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    path = tail.split("?", 1)[0].split("#", 1)[0]
    hostport = netloc.rpartition("@")[2]
    if hostport.startswith("["):
        host, bracket, after = hostport[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            return None
        port_text = after[1:]
    else:
        host, _, port_text = hostport.partition(":")
    port = None
    if port_text:
        if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
            return None
        port = int(port_text)
    if not host:
        return None
    return scheme, host.lower(), port, path


def parse_response(raw: bytes) -> tuple[int, bytes]:
    """Status and body of a whole HTTP/1.1 response (Content-Length, chunked or until close)."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        raise ProtocolError("the answer ended before its headers did")
    lines = head.split(b"\r\n")
    parts = lines[0].split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"not an HTTP/1.1 answer: {lines[0][:80]!r}")
    fields = _fields(lines[1:])
    if b"chunked" in fields.get(b"transfer-encoding", b"").lower():
        return int(parts[1]), _dechunk(body)
    length = fields.get(b"content-length")
    if length is not None:
        if not length.strip().isdigit() or len(body) < int(length):
            raise ProtocolError("the answer is shorter than its Content-Length")
        body = body[: int(length)]
    return int(parts[1]), body


def _fields(lines: list[bytes]) -> dict[bytes, bytes]:
    fields = {}
    for line in lines:
        name, _, value = line.partition(b":")
        fields[name.strip().lower()] = value.strip()
    return fields


def _complete(received: bytearray) -> bool:
    """Whether a Content-Length answer is all here (so we need not wait for the close)."""
    end = received.find(b"\r\n\r\n")
    if end < 0:
        return False
    fields = _fields(bytes(received[:end]).split(b"\r\n")[1:])
    length = fields.get(b"content-length")
    if length is None or not length.strip().isdigit():
        return False
    return len(received) - end - 4 >= int(length)


def _dechunk(body: bytes) -> bytes:
    out = bytearray()
    pos = 0
    while True:
        line_end = body.find(b"\r\n", pos)
        if line_end < 0:
            raise ProtocolError("a chunked answer ended early")
        try:
            size = int(body[pos:line_end].split(b";")[0], 16)
        except ValueError as exc:
            raise ProtocolError("a chunked answer has a bad chunk size") from exc
        if size == 0:
            return bytes(out)
        start = line_end + 2
        if len(body) < start + size:
            raise ProtocolError("a chunked answer ended early")
        out += body[start : start + size]
        pos = start + size + 2


def _decode(raw: bytes) -> Any:
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"error": {"code": "not_json", "message": raw[:200].decode("utf-8", "replace")}}
