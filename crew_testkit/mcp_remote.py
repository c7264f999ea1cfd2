#!/usr/bin/env python3
"""A tiny remote MCP server for tests: MCP's streamable HTTP transport on loopback.

Standard library only. In a test::

    with RemoteMCPServer(secret_header=("X-Api-Key", "s3cret")) as server:
        server.url          # http://127.0.0.1:<port>/mcp
        server.requests     # every request seen: method, path, headers, JSON-RPC method
        server.rejected     # how many were refused for a missing/wrong secret header

or as a process: `python3 mcp_remote.py [--port P] [--header NAME=VALUE] [--marker M]`,
which prints `mcp_remote listening on http://127.0.0.1:P/mcp` once it listens.

Every request must carry the secret header (when one is configured) with the exact value,
else 401 with a JSON body saying so. `POST /mcp` takes one JSON-RPC message (or a batch)
and answers with `application/json`; notifications get 202; `initialize` hands out an
`Mcp-Session-Id`. `GET /mcp` (the optional server-to-client stream) is 405, which the
transport allows; `DELETE /mcp` ends the session. The tools are mcp_stdio's (`echo_note`
answers `<marker> <note>`, default marker `MCP-REMOTE-MARKER-c41d`).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

if __package__:
    from .mcp_stdio import handle
else:  # run as a file (`python3 mcp_remote.py`), e.g. outside the repository's venv
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mcp_stdio import handle  # type: ignore[no-redef]

DEFAULT_MARKER = "MCP-REMOTE-MARKER-c41d"


class RemoteMCPServer:
    """A streamable-HTTP MCP server on 127.0.0.1, run on a thread (a context manager)."""

    def __init__(
        self,
        *,
        secret_header: tuple[str, str] | None = None,
        marker: str = DEFAULT_MARKER,
        port: int = 0,
        path: str = "/mcp",
    ) -> None:
        self.secret_header = secret_header
        self.marker = marker
        self.path = path
        self.requests: list[dict[str, Any]] = []
        self.rejected = 0
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    def start(self) -> RemoteMCPServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the port (also for a server never started)."""
        if self._thread is not None:
            self._httpd.shutdown()  # waits for serve_forever, so only once it runs
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> RemoteMCPServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def tool_calls(self) -> list[dict[str, Any]]:
        """The params of every accepted `tools/call`, in order."""
        with self._lock:
            return [r["params"] for r in self.requests if r.get("rpc") == "tools/call"]

    def _record(self, entry: dict[str, Any], *, rejected: bool) -> None:
        with self._lock:
            self.requests.append(entry)
            if rejected:
                self.rejected += 1


def _handler_for(server: RemoteMCPServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: tests read server.requests instead

        def _send(
            self, status: int, body: bytes = b"", headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body:
                self.wfile.write(body)

        def _authorised(self, entry: dict[str, Any]) -> bool:
            if server.secret_header is None:
                return True
            name, value = server.secret_header
            ok = secrets.compare_digest(self.headers.get(name, ""), value)
            if not ok:
                server._record(entry, rejected=True)
                self._send(
                    401,
                    json.dumps({"error": f"missing or wrong {name} header"}).encode(),
                    {"Content-Type": "application/json"},
                )
            return ok

        def _entry(self) -> dict[str, Any]:
            return {
                "method": self.command,
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
            }

        def do_GET(self) -> None:
            entry = self._entry()
            if not self._authorised(entry):
                return
            server._record(entry, rejected=False)
            self._send(405, headers={"Allow": "POST, DELETE"})

        def do_DELETE(self) -> None:
            entry = self._entry()
            if not self._authorised(entry):
                return
            server._record(entry, rejected=False)
            self._send(200)

        def do_POST(self) -> None:
            entry = self._entry()
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not self._authorised(entry):
                return
            if self.path.split("?", 1)[0] != server.path:
                server._record(entry, rejected=False)
                self._send(404)
                return
            try:
                message = json.loads(raw)
            except ValueError:
                server._record(entry, rejected=False)
                self._send(400, b'{"error": "body is not JSON"}')
                return
            batch = message if isinstance(message, list) else [message]
            answers = []
            headers = {"Content-Type": "application/json"}
            for one in batch:
                if not isinstance(one, dict):
                    continue
                server._record(
                    {**entry, "rpc": one.get("method"), "params": one.get("params")},
                    rejected=False,
                )
                if one.get("method") == "initialize":
                    headers["Mcp-Session-Id"] = secrets.token_hex(16)
                answer = handle(one, server.marker)
                if answer is not None:
                    answers.append(answer)
            if not answers:
                self._send(202)
                return
            body = answers if isinstance(message, list) else answers[0]
            self._send(200, json.dumps(body).encode(), headers)

    return Handler


def main(argv: list[str]) -> int:
    port, marker, header = 0, DEFAULT_MARKER, None
    i = 0
    while i < len(argv):
        if argv[i] == "--port" and i + 1 < len(argv):
            port, i = int(argv[i + 1]), i + 2
        elif argv[i] == "--marker" and i + 1 < len(argv):
            marker, i = argv[i + 1], i + 2
        elif argv[i] == "--header" and i + 1 < len(argv) and "=" in argv[i + 1]:
            name, _, value = argv[i + 1].partition("=")
            header, i = (name, value), i + 2
        else:
            print(f"mcp_remote: unknown argument {argv[i]!r}", file=sys.stderr)
            return 2
    server = RemoteMCPServer(secret_header=header, marker=marker, port=port)
    print(f"mcp_remote listening on {server.url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server._httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
