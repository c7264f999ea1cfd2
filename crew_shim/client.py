"""The one HTTP call each `crew` command makes to the crew server.

Standard library `http.client`, not httpx: importing httpx costs ~100 ms per
run, and `crew` runs many times per turn (figures in crew_shim/README.md).
One request, a 10 s timeout, never a retry: a retried reply could post twice.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from crew_shim.errors import CrewError, ServerTimeout, ServerUnreachable

TIMEOUT_S = 10.0
_MAX_ANSWER = 8 * 1024 * 1024


@dataclass(frozen=True)
class Answer:
    """The server's status and decoded JSON (None for an empty body)."""

    status: int
    data: Any

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


@dataclass(frozen=True)
class Effect:
    """How the command's outcome reads when the server is silent or unreachable.

    `unsent` completes "Nothing was …"; `maybe` says what may have happened
    and what to check before trying again.
    """

    unsent: str
    maybe: str


class CrewServer:
    """The crew server at `url`, spoken to with the agent's bearer `token`."""

    def __init__(self, url: str, token: str, *, timeout: float = TIMEOUT_S) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CrewError(
                f'CREW_SERVER_URL is not an http(s) URL ("{url}"). '
                "crew works only inside a turn started by the Computer; tell the user."
            )
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._token = token
        self._timeout = timeout

    @classmethod
    def from_environment(cls) -> CrewServer:
        """The server named by `CREW_SERVER_URL`, with the token in `CREW_TOKEN_FILE`.

        These two variables are all the shim reads from its environment.
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
        return cls(url, token)

    def call(self, method: str, path: str, body: Any = None, *, effect: Effect) -> Answer:
        """Send one request and return the answer; network failures become CrewErrors."""
        import http.client

        connection_class = (
            http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        )
        connection = connection_class(self._host, self._port, timeout=self._timeout)
        payload = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        try:
            connection.request(method, self._prefix + path, body=payload, headers=headers)
            response = connection.getresponse()
            raw = response.read(_MAX_ANSWER)
        except TimeoutError as exc:
            raise ServerTimeout(
                f"the crew server did not answer within {self._timeout:g} seconds, so "
                f"{effect.maybe}"
            ) from exc
        except (ConnectionRefusedError, socket.gaierror) as exc:
            raise ServerUnreachable(
                f"cannot reach the crew server ({exc.strerror or exc}); nothing was "
                f"{effect.unsent}. Try again in a minute; if it keeps failing, tell the user."
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            # The connection broke after the request may have gone out.
            raise ServerTimeout(
                f"the connection to the crew server broke ({type(exc).__name__}), so {effect.maybe}"
            ) from exc
        finally:
            connection.close()
        return Answer(response.status, _decode(raw))


def _decode(raw: bytes) -> Any:
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"error": {"code": "not_json", "message": raw[:200].decode("utf-8", "replace")}}
