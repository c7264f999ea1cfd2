"""An agent's capabilities (issue 27) as its OpenCode gets them: the `mcp` and `skills` config,
the skill files, the gateway's MCP routes. Pure.

The document is `crew_common.capabilities` (the server's agent sync brings it, secrets in
clear). OpenCode 1.18.33 (its config schema, verified with the binary):

- `mcp.<name>` local: `{"type": "local", "command": [argv], "environment": {..},
  "enabled": bool, "timeout": ms}`. OpenCode starts it itself (stdio), from its own
  process, so it lives in the agent's sandbox and dies with its engine. We start it
  through the sandbox's tool shell (`$SHELL`, `sandbox_launcher.tool_shell`): the
  server runs as a tool does, in a Landlock domain below the engine's and without the
  engine's `OPENCODE_*` variables, so a hostile MCP server can neither rewrite the engine
  nor read another server's `secret_environment` from the engine's config. Its own
  `secret_environment` is in its environment (OpenCode passes `environment` to the
  process), never in a file; tools are sibling domains and cannot read it from /proc.
- `mcp.<name>` remote: `{"type": "remote", "url", "headers", "oauth": false, "enabled",
  "timeout"}`. The url is the agent's gateway (`/mcp/<name>`), which adds the real
  `secret_headers` and forwards to the real url (`gateway.mcp_route`); the engine's
  config carries the agent's gateway placeholder only. `oauth: false`: no OAuth probing
  from the sandbox (nowhere to complete it).
- `skills.paths`: directories searched for `**/SKILL.md`; each skill is written as
  `<skills_dir>/<name>/SKILL.md` (front matter `name`, `description`, then the body) plus
  its files. OpenCode lists every skill's name and description in the system prompt and
  the model loads a body with its `skill` tool.

MCP tools are named `<server>_<tool>` by OpenCode (in the model's tool list, tool events
and permission rules: `crew_common.permissions` takes such names).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import orjson

from crew_common.capabilities import Capabilities, LocalMcpServer, RemoteMcpServer

# The header the engine sends to its gateway on an MCP route: the placeholder, dropped there.
GATEWAY_HEADER = "X-Crew-Gateway"
MCP_PREFIX = "mcp"  # the gateway's path segment for MCP routes (`/mcp/<name>/...`)
# Runs argv in the sandbox's tool shell (nested Landlock domain, no OPENCODE_* variables),
# as `$SHELL -c 'exec "$0" "$@"' argv...`. `/bin/sh` only forwards; without a tool shell
# (no sandbox) `$SHELL` may be unset, and the argv then runs under `/bin/sh`.
TOOL_SHELL_EXEC = (
    "/bin/sh",
    "-c",
    'exec "${SHELL:-/bin/sh}" -c \'exec "$0" "$@"\' "$@"',
    "crew-mcp",
)


@dataclass(frozen=True)
class McpRoute:
    """Where one remote MCP server of one agent really is, and the headers the gateway adds."""

    url: str  # no trailing slash
    headers: dict[str, str] = field(default_factory=dict)  # plain and secret


def local_argv(argv: list[str]) -> list[str]:
    """The `command` OpenCode spawns for a local server: `argv` run through the tool shell."""
    return [*TOOL_SHELL_EXEC, *argv]


def mcp_url(gateway_port: int, name: str) -> str:
    """The url the engine's config gives a remote server: its route on the agent's gateway."""
    return f"http://127.0.0.1:{gateway_port}/{MCP_PREFIX}/{name}"


def _local(server: LocalMcpServer) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "type": "local",
        "command": local_argv(server.command),
        "environment": {**server.environment, **server.secret_environment},
        "enabled": server.enabled,
    }
    if server.timeout_ms is not None:
        entry["timeout"] = server.timeout_ms
    return entry


def _remote(server: RemoteMcpServer, gateway_port: int, placeholder: str) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "type": "remote",
        "url": mcp_url(gateway_port, server.name),
        "headers": {**server.headers, GATEWAY_HEADER: placeholder},
        "oauth": False,
        "enabled": server.enabled,
    }
    if server.timeout_ms is not None:
        entry["timeout"] = server.timeout_ms
    return entry


def opencode_settings(
    caps: Capabilities, *, gateway_port: int, placeholder: str, skills_dir: str
) -> dict[str, Any]:
    """The `mcp` and `skills` settings of the engine's config (none when there are none)."""
    settings: dict[str, Any] = {}
    servers: dict[str, Any] = {}
    for server in caps.mcp_servers:
        if isinstance(server, LocalMcpServer):
            servers[server.name] = _local(server)
        else:
            servers[server.name] = _remote(server, gateway_port, placeholder)
    if servers:
        settings["mcp"] = servers
    if caps.skills:
        settings["skills"] = {"paths": [skills_dir]}
    return settings


def mcp_routes(caps: Capabilities) -> dict[str, McpRoute]:
    """The gateway's routes of the agent's remote servers, by name."""
    return {
        s.name: McpRoute(s.url.rstrip("/"), {**s.headers, **s.secret_headers})
        for s in caps.mcp_servers
        if isinstance(s, RemoteMcpServer)
    }


def secrets(caps: Capabilities) -> list[str]:
    """What no reason or record may show: every secret value."""
    out: list[str] = []
    for server in caps.mcp_servers:
        values = (
            server.secret_environment
            if isinstance(server, LocalMcpServer)
            else server.secret_headers
        )
        out += [v for v in values.values() if v]
    return out


def skill_md(name: str, description: str, body: str) -> str:
    """A SKILL.md: YAML front matter (JSON strings are YAML flow scalars), then the body."""
    front = (
        f"name: {orjson.dumps(name).decode()}\ndescription: {orjson.dumps(description).decode()}"
    )
    return f"---\n{front}\n---\n{body}" + ("" if body.endswith("\n") else "\n")


def skill_files(caps: Capabilities) -> list[tuple[PurePosixPath, bytes]]:
    """Every file of the agent's skills, relative to its skills directory.

    Paths were checked by `crew_common.capabilities` (relative, no `.`/`..`); checked again
    here, as the files are written below the agent's directory.
    """
    out: list[tuple[PurePosixPath, bytes]] = []
    for skill in caps.skills:
        base = PurePosixPath(skill.name)
        out.append(
            (base / "SKILL.md", skill_md(skill.name, skill.description, skill.body).encode())
        )
        for rel, text in sorted(skill.files.items()):
            path = PurePosixPath(rel)
            if path.is_absolute() or any(p in ("", ".", "..") for p in path.parts):
                raise ValueError(f"skill {skill.name}: the file path {rel!r} is not relative")
            out.append((base / path, text.encode()))
    return out


# OpenCode 1.18.33's `GET /mcp` statuses that mean "cannot be used" beside `failed`.
_OAUTH_STATES = ("needs_auth", "needs_client_registration")


def mcp_states(caps: Capabilities, status: Any) -> list[dict[str, str | None]]:
    """Each MCP server's state (`starting`, `connected`, `failed` + reason, `disabled`) from
    a warm server's `GET /mcp` answer (`{name: {"status": ..., "error": ...}}`), in the
    document's order. Pure, never raises: a server missing from the answer is `starting`."""
    known = status if isinstance(status, dict) else {}
    out: list[dict[str, str | None]] = []
    for server in caps.mcp_servers:
        entry = known.get(server.name)
        entry = entry if isinstance(entry, dict) else {}
        found = entry.get("status")
        reason: str | None = None
        if not server.enabled or found == "disabled":
            state = "disabled"
        elif found == "connected":
            state = "connected"
        elif found == "failed":
            state = "failed"
            error = entry.get("error")
            reason = str(error)[:4000] if error else "OpenCode gave no reason"
        elif found in _OAUTH_STATES:
            state = "failed"
            reason = (
                "the server asks for an OAuth login, which an agent cannot complete: give "
                "its token in secret_headers (e.g. Authorization)"
            )
        else:
            state = "starting"
        out.append({"name": server.name, "state": state, "reason": reason})
    return out
