"""`crew-computer status` and `crew-computer follow`: a person's view of a running Computer.

Both are clients of the introspection socket (`<crew home>/sockets/computer.sock`,
openapi/computer.yaml): `status` reads `/health` and `/agents` once and prints
them like `docker ps` (or as JSON); `follow` reads `/events` and prints the
turns as they happen, reconnecting with `Last-Event-ID` when the stream
breaks. The rendering is pure (`render_status`, `EventPrinter`); the I/O is
in `status`/`follow`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import httpx
import orjson

SOCKET_NAME = "computer.sock"
# Reconnect pacing for `follow`: soon after a blip, gently while the Computer is away.
RECONNECT_FIRST_S = 0.5
RECONNECT_CAP_S = 5.0
SHORT = 100


class ComputerUnavailable(Exception):
    """The Computer cannot be asked; the message says why and what to do."""


class ComputerNotRunning(ComputerUnavailable):
    """Nothing answers on the introspection socket; the message says where and what to do."""


def default_crew_home() -> Path:
    """The crew home a Computer started without `crew_home` uses: `$CREW_HOME`, else `~/.crew`."""
    env = os.environ.get("CREW_HOME")
    return Path(env).expanduser().absolute() if env else Path.home() / ".crew"


def socket_path(crew_home: Path) -> Path:
    """The introspection socket of the Computer on `crew_home`."""
    return crew_home / "sockets" / SOCKET_NAME


def local_client(path: Path, timeout: httpx.Timeout | float = 10.0) -> httpx.Client:
    """An HTTP client for the introspection socket at `path`."""
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=str(path)), base_url="http://computer", timeout=timeout
    )


def not_running(path: Path, exc: Exception) -> ComputerNotRunning:
    """The error for a socket that does not answer, saying why and what to do."""
    cause = exc.__cause__ or exc.__context__ or exc
    if isinstance(cause, PermissionError):
        why = f"{path} is not this user's (run this as the user who runs the Computer)"
    elif path.exists():
        why = f"nothing answers on {path} (a Computer that stopped without cleaning up?)"
    else:
        why = f"{path} does not exist"
    return ComputerNotRunning(
        f"no Computer is running on {path.parent.parent}: {why}. Start one with "
        "`crew-computer run --config FILE`, or name its crew home with --crew-home "
        "(or $CREW_HOME)"
    )


# --- status ------------------------------------------------------------------


def read_status(path: Path) -> dict[str, Any]:
    """`{"health": …, "agents": […]}` from the socket; raises `ComputerUnavailable`."""
    answers = {}
    try:
        with local_client(path) as client:
            for route in ("/health", "/agents"):
                answer = client.get(route)
                if answer.status_code != 200:
                    raise ComputerUnavailable(
                        f"the Computer answered {route} with {answer.status_code}: "
                        f"{answer.text[:300]} (its log says more)"
                    )
                answers[route] = answer.json()
    except httpx.TransportError as exc:
        raise not_running(path, exc) from exc
    return {"health": answers["/health"], "agents": answers["/agents"]}


def render_status(health: dict[str, Any], agents: list[dict[str, Any]], now: datetime) -> str:
    """The `status` text: the Computer in a few lines, then one row per agent."""
    if health["connected"] and health.get("connected_since"):
        since = _parse_time(health["connected_since"])
        link = f"connected since {_local(since)} ({_age(since, now)})"
    else:
        link = "NOT connected (reconnecting)" if health["ready"] else "starting"
    sandbox = health["sandbox"]
    if sandbox["ok"] is None:
        sandbox_text = "starting"
    else:
        sandbox_text = f"{sandbox['backend'] or '?'} ({'ok' if sandbox['ok'] else 'NOT usable'})"
    engine = health["engine"]
    engine_text = f"opencode {engine['version']}" if engine["found"] else "opencode NOT found"
    if engine.get("reason") and engine["found"]:
        engine_text += f" (cannot run agents: {engine['reason']})"
    lines = [
        f"Server:   {health['server_url']}, {link}",
        f"Computer: version {health['version']}, sandbox {sandbox_text}, engine {engine_text}",
        f"Turns:    {health['running_turns']} running, {health['queued']} queued",
    ]
    if sandbox["ok"] is False and sandbox["reason"]:
        lines.append(f"Sandbox:  {sandbox['reason']}")
    lines.append("")
    if not agents:
        lines.append("No agents on this Computer.")
        return "\n".join(lines) + "\n"
    header = (
        "AGENT",
        "STATE",
        "TURN",
        "AGE",
        "LAST RESULT",
        "TOKENS TODAY",
        "COST TODAY",
        "EGRESS",
    )
    rows = [header] + [_agent_cells(agent, now) for agent in agents]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    notes = [_agent_note(agent) for agent in agents] + [_mcp_note(agent) for agent in agents]
    if any(notes):
        lines.append("")
        lines += [note for note in notes if note]
    return "\n".join(lines) + "\n"


def _agent_cells(agent: dict[str, Any], now: datetime) -> tuple[str, ...]:
    today = agent.get("today") or {}
    started = agent.get("turn_started_at")
    tokens = today.get("input_tokens", 0) + today.get("output_tokens", 0)
    state = agent["state"] + ("+wake" if agent.get("pending_wake") else "")
    return (
        "@" + agent["handle"],
        state,
        agent["turn_id"] or "-",
        _age(_parse_time(started), now) if started else "-",
        agent["last_result"] or "-",
        f"{tokens:,} ({today.get('input_tokens', 0):,} in, {today.get('output_tokens', 0):,} out)",
        f"${today.get('cost', 0.0):.4f}",
        _short(agent.get("egress", "?"), 60),
    )


def _agent_note(agent: dict[str, Any]) -> str:
    if agent.get("problem"):
        return f"@{agent['handle']}: {agent['problem']}"
    if agent.get("held"):
        return f"@{agent['handle']} waits, held by its {agent['held']}"
    if agent.get("last_result") == "failed" and agent.get("last_reason"):
        retry = f" (retrying at {agent['retry_at']})" if agent.get("retry_at") else ""
        return f"@{agent['handle']} last failed: {agent['last_reason']}{retry}"
    return ""


def _mcp_note(agent: dict[str, Any]) -> str:
    """The agent's MCP servers as its warm server last said (issue 27); "" when not known."""
    servers = (agent.get("engine") or {}).get("mcp_servers")
    if not servers:
        return ""
    parts = []
    for server in servers:
        text = f"{server['name']} {server['state']}"
        if server.get("reason"):
            text += f" ({_short(server['reason'], 80)})"
        parts.append(text)
    return f"@{agent['handle']} MCP servers: " + ", ".join(parts)


def status(crew_home: Path, as_json: bool, out: IO[str]) -> None:
    """Print the status of the Computer on `crew_home`; raises `ComputerUnavailable`."""
    answer = read_status(socket_path(crew_home))
    if as_json:
        out.write(orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        out.write(render_status(answer["health"], answer["agents"], datetime.now(UTC)))


# --- follow ------------------------------------------------------------------


@dataclass
class TurnTally:
    """What `follow` adds up for one running turn, to print at its end."""

    steps: int = 0
    tools: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0


@dataclass
class EventPrinter:
    """Turns `/events` events into readable lines; pure apart from the time it stamps."""

    handles: dict[str, str] = field(default_factory=dict)
    only: str | None = None
    _states: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    _turns: dict[str, TurnTally] = field(default_factory=dict)

    def lines(self, kind: str, data: dict[str, Any]) -> list[str]:
        """The lines one event prints (none for what is not worth a line)."""
        if kind == "missed":
            count = data.get("count")
            how_many = f"{count} events" if count is not None else "some events"
            return [f"(missed {how_many}: {data.get('reason', '')})"]
        agent_id = data.get("agent_id") or data.get("id")
        if not isinstance(agent_id, str) or (self.only is not None and agent_id != self.only):
            return []
        if kind == "state":
            self.handles[agent_id] = data.get("handle", agent_id)
            return self._state(agent_id, data)
        who = "@" + self.handles.get(agent_id, agent_id[:8])
        if kind == "engine":
            return [f"{_clock(data.get('at'))} {who}  {line}" for line in self._engine(data)]
        if kind == "turn":
            return [f"{_clock(None)} {who}  {self._turn_end(data)}"]
        return []

    def _state(self, agent_id: str, row: dict[str, Any]) -> list[str]:
        # A runner publishes its row on every change: print only what a person needs.
        state, turn_id = row.get("state", "?"), row.get("turn_id")
        before = self._states.get(agent_id)
        self._states[agent_id] = (state, turn_id)
        who = "@" + row.get("handle", agent_id)
        if state == "running" and turn_id and (before is None or before[1] != turn_id):
            self._turns[turn_id] = TurnTally()
            return [f"{_clock(None)} {who}  ▶ turn {turn_id} started"]
        if before is not None and before[0] == state:
            return []
        if state == "problem":
            return [f"{_clock(None)} {who}  problem: {row.get('problem') or '?'}"]
        if state in ("queued", "stopping"):
            return [f"{_clock(None)} {who}  {state}"]
        return []

    def _engine(self, event: dict[str, Any]) -> list[str]:
        tally = self._turns.setdefault(str(event.get("turn_id")), TurnTally())
        data = event.get("data") or {}
        kind = event.get("type")
        if kind == "step_start":
            tally.steps += 1
            return [f"step {tally.steps}"]
        if kind == "text":
            return [f"says: {_short(data.get('text'), 400)}"]
        if kind == "reasoning":
            return [f"thinks: {_short(data.get('text'))}"]
        if kind == "tool_use":
            tally.tools += 1
            took = f" ({data['duration_ms']} ms)" if data.get("duration_ms") is not None else ""
            mark = "FAILED " if data.get("failed") else ""
            return [
                f"tool {data.get('tool', '?')}: {_tool_input(data.get('input'))}",
                f"  → {mark}{_short(data.get('output'))}{took}",
            ]
        if kind == "step_finish":
            tokens = data.get("tokens") or {}
            tally.input_tokens += tokens.get("input", 0)
            tally.output_tokens += tokens.get("output", 0)
            tally.cost += data.get("cost", 0.0)
            return []
        if kind == "error":
            return [f"error {data.get('name', '?')}: {_short(data.get('message'))}"]
        if kind == "egress_denied":
            return [_denial(data)]
        return []

    def _turn_end(self, data: dict[str, Any]) -> str:
        tally = self._turns.pop(str(data.get("turn_id")), TurnTally())
        usage = data.get("usage") or {}
        input_tokens = usage.get("input_tokens", tally.input_tokens)
        output_tokens = usage.get("output_tokens", tally.output_tokens)
        cost = usage.get("cost", tally.cost)
        failure = data.get("failure") or {}
        why = f" ({failure.get('class')}: {_short(failure.get('reason'))})" if failure else ""
        return (
            f"■ turn {data.get('status', '?')}{why}: {tally.steps} steps, {tally.tools} tool "
            f"calls, {input_tokens:,} in / {output_tokens:,} out tokens, ${cost:.4f}"
        )


def follow(
    crew_home: Path,
    agent: str | None,
    out: IO[str],
    *,
    sleep: Callable[[float], None] | None = None,
) -> None:
    """Print the Computer's turns as they happen until interrupted; raises `ComputerUnavailable`
    when it cannot be asked at the start (later it waits for the Computer to come back)."""
    pause = sleep or time.sleep
    path = socket_path(crew_home)
    printer = EventPrinter()
    answer = read_status(path)
    printer.handles = {row["id"]: row["handle"] for row in answer["agents"]}
    if agent is not None:
        printer.only = _agent_id(agent, answer["agents"], path)
        out.write(f"following @{printer.handles[printer.only]} on {crew_home} (Ctrl+C to stop)\n")
    else:
        out.write(f"following every agent on {crew_home} (Ctrl+C to stop)\n")
    out.flush()
    last_id: str | None = None
    delay = RECONNECT_FIRST_S
    away = False
    while True:
        try:
            for event_id, kind, data in _events(path, last_id):
                if away:
                    out.write("(the Computer answers again)\n")
                    away = False
                delay = RECONNECT_FIRST_S
                if event_id is not None:
                    last_id = event_id
                for line in printer.lines(kind, data):
                    out.write(line + "\n")
                out.flush()
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 400 and last_id is not None:
                last_id = None  # an id of a Computer that restarted meanwhile: go live
        except httpx.TransportError:
            if not away:
                out.write("(the Computer does not answer; waiting for it)\n")
                out.flush()
                away = True
        pause(delay)
        delay = min(delay * 2, RECONNECT_CAP_S)


def _events(path: Path, last_id: str | None) -> Iterator[tuple[str | None, str, dict[str, Any]]]:
    """(id, event, data) of the `/events` stream until it ends."""
    headers = {"Last-Event-ID": last_id} if last_id is not None else {}
    # No read timeout: the stream pings every 15 s, and a quiet Computer is not an error.
    timeout = httpx.Timeout(10.0, read=None)
    with (
        local_client(path, timeout=timeout) as client,
        client.stream("GET", "/events", headers=headers) as response,
    ):
        response.raise_for_status()
        event_id: str | None = None
        kind = "message"
        data: list[str] = []
        for line in response.iter_lines():
            if line == "":
                if data:
                    yield event_id, kind, orjson.loads("\n".join(data))
                event_id, kind, data = None, "message", []
            elif line.startswith("id:"):
                event_id = line[3:].strip()
            elif line.startswith("event:"):
                kind = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))


def _agent_id(wanted: str, agents: list[dict[str, Any]], path: Path) -> str:
    handle = wanted.removeprefix("@")
    for row in agents:
        if wanted == row["id"] or handle == row["handle"]:
            return str(row["id"])
    known = ", ".join("@" + row["handle"] for row in agents) or "none"
    raise UnknownAgent(
        f"no agent {wanted!r} on the Computer of {path.parent.parent} (its agents: {known})"
    )


class UnknownAgent(Exception):
    """`follow AGENT` names no agent of this Computer."""


# --- small pure pieces -------------------------------------------------------


def _denial(data: dict[str, Any]) -> str:
    """`refused github.com 203.0.113.5:443 (tcp) ×3`: one line per `egress_denied` event."""
    address = str(data.get("address", "?"))
    shown = f"[{address}]" if ":" in address else address
    name = f"{_short(data['name'], 80)} " if isinstance(data.get("name"), str) else ""
    count = data.get("count")
    times = f" ×{count}" if isinstance(count, int) and count > 1 else ""
    return f"refused {name}{shown}:{data.get('port', '?')} ({data.get('protocol', '?')}){times}"


def _tool_input(value: Any) -> str:
    if not isinstance(value, dict) or not value:
        return _short(value) if value else "-"
    for key in ("command", "filePath", "path", "pattern", "url", "query", "description"):
        if isinstance(value.get(key), str):
            return _short(value[key])
    return _short(orjson.dumps(value).decode())


def _short(value: Any, limit: int = SHORT) -> str:
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    text = " ⏎ ".join(part.strip() for part in text.strip().splitlines() if part.strip())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _parse_time(text: str) -> datetime:
    at = datetime.fromisoformat(text)
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _local(at: datetime) -> str:
    return at.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _clock(at: Any) -> str:
    moment = _parse_time(at) if isinstance(at, str) else datetime.now(UTC)
    return moment.astimezone().strftime("%H:%M:%S")


def _age(since: datetime, now: datetime) -> str:
    seconds = max(0, int((now - since).total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def run_command(command: str, crew_home: Path | None, *, as_json: bool, agent: str | None) -> int:
    """`status`/`follow` for `crew-computer`: the exit status, with a one-line reason on stderr."""
    home = crew_home.expanduser().absolute() if crew_home is not None else default_crew_home()
    try:
        if command == "status":
            status(home, as_json, sys.stdout)
        else:
            follow(home, agent, sys.stdout)
    except (ComputerUnavailable, UnknownAgent) as exc:
        sys.stderr.write(f"crew-computer: {exc}\n")
        return 1
    except KeyboardInterrupt:
        # Ctrl+C is how a person stops `follow`: not an error.
        return 0
    except BrokenPipeError:
        # `crew-computer follow | head`: the reader went away; no error at exit's flush either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0
