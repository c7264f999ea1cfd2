#!/usr/bin/env python3
"""A tiny MCP server over stdio for tests: `python3 mcp_stdio.py [--marker M] [--record PATH]`.

Standard library only: it runs inside an agent's sandbox with the system python3, started by
OpenCode itself from the agent's `mcp` config (a local server). It speaks MCP's stdio
transport: newline-delimited JSON-RPC 2.0 on stdin/stdout, logs on stderr.

Methods: `initialize` (echoes the client's protocolVersion, offers `tools`), `ping`,
`tools/list`, `tools/call`; notifications (no `id`) get no answer; anything else is
JSON-RPC error -32601.

Tools:
- `echo_note {"note": str}` returns the text `<marker> <note>`, the marker being
  `--marker` (default `MCP-ECHO-MARKER-7f3a`), so a test can find it in the turn record.
- `env_has {"name": str}` returns `set` or `unset`: whether this process has that
  environment variable (the secret_environment tests; the value is never returned).
- `whoami {}` returns JSON `{"pid", "ppid", "cwd", "home"}` of this process.

`--record PATH` appends one JSON line per request received (`{"method", "params", "pid"}`),
so a test can see that the server ran and what it was asked, without reading its stdout.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

DEFAULT_MARKER = "MCP-ECHO-MARKER-7f3a"

TOOLS: list[dict[str, Any]] = [
    {
        "name": "echo_note",
        "description": "Echo a note back, prefixed with this server's marker.",
        "inputSchema": {
            "type": "object",
            "properties": {"note": {"type": "string", "description": "The note to echo."}},
            "required": ["note"],
        },
    },
    {
        "name": "env_has",
        "description": "Say whether this MCP server process has an environment variable.",
        "inputSchema": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
        },
    },
    {
        "name": "whoami",
        "description": "Report this MCP server process's pid, parent pid, cwd and HOME.",
        "inputSchema": {"type": "object", "properties": {}},
    },
]


def _text(text: str, *, error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": error}


def call_tool(name: str, arguments: dict[str, Any], marker: str) -> dict[str, Any]:
    """The result of one `tools/call` (an MCP CallToolResult)."""
    if name == "echo_note":
        return _text(f"{marker} {arguments.get('note', '')}")
    if name == "env_has":
        return _text("set" if str(arguments.get("name", "")) in os.environ else "unset")
    if name == "whoami":
        return _text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "ppid": os.getppid(),
                    "cwd": os.getcwd(),
                    "home": os.environ.get("HOME", ""),
                }
            )
        )
    return _text(f"unknown tool {name!r}", error=True)


def handle(message: dict[str, Any], marker: str) -> dict[str, Any] | None:
    """The JSON-RPC answer to one message, or None for a notification."""
    if "id" not in message:
        return None
    msg_id = message["id"]
    method = message.get("method")
    params = message.get("params") or {}
    if method == "initialize":
        result: dict[str, Any] = {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "crew-testkit-mcp-stdio", "version": "1.0.0"},
        }
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        result = call_tool(str(params.get("name", "")), params.get("arguments") or {}, marker)
    else:
        return {
            "jsonrpc": "2.0",
            "id": msg_id,
            "error": {"code": -32601, "message": f"method not found: {method}"},
        }
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


def _args(argv: list[str]) -> tuple[str, str | None]:
    marker, record = DEFAULT_MARKER, None
    i = 0
    while i < len(argv):
        if argv[i] == "--marker" and i + 1 < len(argv):
            marker, i = argv[i + 1], i + 2
        elif argv[i] == "--record" and i + 1 < len(argv):
            record, i = argv[i + 1], i + 2
        else:
            print(f"mcp_stdio: unknown argument {argv[i]!r}", file=sys.stderr)
            sys.exit(2)
    return marker, record


def main(argv: list[str]) -> int:
    marker, record = _args(argv)
    print(f"mcp_stdio: serving (pid {os.getpid()})", file=sys.stderr, flush=True)
    for raw in sys.stdin.buffer:
        line = raw.strip()
        if not line:
            continue
        try:
            message = json.loads(line)
        except ValueError:
            answer: dict[str, Any] | None = {
                "jsonrpc": "2.0",
                "id": None,
                "error": {"code": -32700, "message": "parse error"},
            }
        else:
            if record is not None:
                with open(record, "a", encoding="utf-8") as f:
                    f.write(
                        json.dumps(
                            {
                                "method": message.get("method"),
                                "params": message.get("params"),
                                "pid": os.getpid(),
                            }
                        )
                        + "\n"
                    )
            answer = handle(message, marker) if isinstance(message, dict) else None
        if answer is not None:
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
