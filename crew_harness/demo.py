"""The demo: the whole system on this machine, one agent answering one message.

`scripts/demo` runs `python -m crew_harness.demo`. It starts `crew-server`
(temporary database, `--dev`), the scripted model, and `crew-computer` (which
starts the launcher, which runs the real `opencode` in the sandbox), all under
one temporary directory, so it never touches the user's files. It creates a
computer, an agent and a DM, posts a message, prints the agent's reply and the
turn record (steps, tool calls, tokens, cost), stops everything and exits 0.

`--model provider/model` uses the user's own OpenCode login and provider
config (their real XDG directories) and a real model instead of the scripted one.

The process pieces (`LocalStack`, `start_computer`, …) are shared with the
turn benchmark.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from crew_harness.ports import free_port
from crew_harness.scripted_model import (
    MODEL_NAME,
    Script,
    ScriptedModel,
    opencode_provider,
    scenario,
)
from crew_harness.waiting import WaitTimeout, wait_until

ROOT = Path(__file__).resolve().parents[1]
BUNDLED_OPENCODE = ROOT / "tools" / "opencode" / "node_modules" / ".bin" / "opencode"
SCRIPTED_MODEL = f"local/{MODEL_NAME}"
START_TIMEOUT_S = 30.0


class DemoError(Exception):
    """Something in the chain did not come up or answer; the message says what to check."""


# ---------------------------------------------------------------- the user's files


def scripted_price_table() -> dict[str, Any]:
    """A models.dev-style price table (`models.json`) that prices `local/scripted`.

    OpenCode prices usage from the copy the Computer puts in each agent's cache.
    """
    return {
        "local": {
            "id": "local",
            "name": "Local scripted model",
            "env": [],
            "npm": "@ai-sdk/openai-compatible",
            "models": {
                MODEL_NAME: {
                    "id": MODEL_NAME,
                    "name": "Scripted",
                    "attachment": False,
                    "reasoning": False,
                    "temperature": True,
                    "tool_call": True,
                    "cost": {"input": 3, "output": 15, "cache_read": 0.3},
                    "limit": {"context": 100000, "output": 8000},
                    "release_date": "2026-01-01",
                    "last_updated": "2026-01-01",
                    "modalities": {"input": ["text"], "output": ["text"]},
                    "open_weights": False,
                }
            },
        }
    }


def write_scripted_login(home: Path, base_url: str, *, price_in_config: bool = True) -> None:
    """Write what a user of the scripted model would have: auth, provider config, prices.

    The key is in auth.json (the Computer passes it as OPENCODE_AUTH_CONTENT);
    the price is in the provider config (`price_in_config`) or only in the
    cached price table, which the Computer copies for each agent.
    """
    data = home / ".local" / "share" / "opencode"
    config = home / ".config" / "opencode"
    cache = home / ".cache" / "opencode"
    for path in (data, config, cache):
        path.mkdir(parents=True, exist_ok=True)
    (data / "auth.json").write_bytes(
        orjson.dumps({"local": {"type": "api", "key": "scripted-key"}})
    )
    provider = opencode_provider(base_url)
    del provider["local"]["options"]["apiKey"]
    if not price_in_config:
        del provider["local"]["models"][MODEL_NAME]["cost"]
    (config / "opencode.json").write_bytes(
        orjson.dumps({"$schema": "https://opencode.ai/config.json", "provider": provider})
    )
    (cache / "models.json").write_bytes(orjson.dumps(scripted_price_table()))


def user_env(home: Path | None, crew_home: Path) -> dict[str, str]:
    """The Computer's environment: a temporary HOME (or the user's own when None)."""
    keep = ("PATH", "LANG", "LC_ALL", "TZ", "CI")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.setdefault("LANG", "C.UTF-8")
    if home is None:
        # The user's own login: their HOME and XDG directories, as they are.
        for key in ("HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
            if key in os.environ:
                env[key] = os.environ[key]
    else:
        env.update(
            {
                "HOME": str(home),
                "XDG_DATA_HOME": str(home / ".local" / "share"),
                "XDG_CONFIG_HOME": str(home / ".config"),
                "XDG_CACHE_HOME": str(home / ".cache"),
                "XDG_STATE_HOME": str(home / ".local" / "state"),
            }
        )
    env["CREW_HOME"] = str(crew_home)
    return env


# ---------------------------------------------------------------- processes


def _console_script(name: str, module: str) -> list[str]:
    script = Path(sys.executable).parent / name
    return [str(script)] if script.exists() else [sys.executable, "-m", module]


@dataclass
class ServerProcess:
    """A `crew-server --dev` subprocess on a loopback port with a temporary database."""

    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    user_token_file: Path

    @property
    def user_headers(self) -> dict[str, str]:
        """`Authorization` for the user API (`--dev` keeps user auth on)."""
        return {"Authorization": f"Bearer {self.user_token_file.read_text().strip()}"}

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_server(root: Path) -> ServerProcess:
    """Start `crew-server` and wait until its user API answers the user token (which it
    writes to `root/user-token` at start)."""
    port = free_port()
    log_path = root / "crew-server.log"
    token_file = root / "user-token"
    argv = _console_script("crew-server", "crew_server")
    argv += ["--db", str(root / "crew.db"), "--host", "127.0.0.1", "--port", str(port), "--dev"]
    argv += ["--user-token-file", str(token_file)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=root)
    server = ServerProcess(proc, f"http://127.0.0.1:{port}", log_path, token_file)

    def answers() -> bool:
        if proc.poll() is not None:
            raise DemoError(
                f"crew-server exited {proc.returncode}: {log_path.read_text(errors='replace')[-2000:]}"
            )
        if not token_file.exists():
            return False  # written before the server listens
        try:
            answer = httpx.get(f"{server.url}/api/agents", headers=server.user_headers, timeout=1)
            return answer.status_code == 200
        except httpx.TransportError:
            return False

    wait_until("crew-server to answer", answers, START_TIMEOUT_S)
    return server


@dataclass
class ComputerProcess:
    """A running `crew-computer`: stdin stays open (closing it means stop)."""

    proc: subprocess.Popen[bytes]
    crew_home: Path
    stderr_path: Path

    @property
    def socket(self) -> Path:
        return self.crew_home / "sockets" / "computer.sock"

    def introspection(self) -> httpx.Client:
        """An HTTP client on the introspection socket (`curl --unix-socket` does the same)."""
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket)),
            base_url="http://computer",
            timeout=10,
        )

    def health(self) -> dict[str, Any] | None:
        """`GET /health` once the launcher's answer is in (sandbox status known), else None."""
        try:
            with self.introspection() as local:
                health: dict[str, Any] = local.get("/health").json()
        except (httpx.TransportError, ValueError):
            return None  # not listening yet
        sandbox = health.get("sandbox") or {}
        return health if sandbox.get("ok") is not None and health.get("engine") else None

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self, timeout: float = 20.0) -> int:
        """Close stdin (the app's way to say stop); SIGTERM, then SIGKILL if it lingers."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        return self.proc.returncode


def start_computer(
    env: dict[str, str], bootstrap: dict[str, Any], crew_home: Path, log_dir: Path
) -> ComputerProcess:
    """Start `crew-computer`, write the bootstrap line, wait for `ready` on stdout."""
    stderr_path = log_dir / "crew-computer.log"
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(
            _console_script("crew-computer", "computer_service"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            cwd=log_dir,
        )
    computer = ComputerProcess(proc, crew_home, stderr_path)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(orjson.dumps(bootstrap) + b"\n")
    proc.stdin.flush()
    ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
    line = proc.stdout.readline() if ready else b""
    if line != b"ready\n":
        computer.stop(timeout=2)
        raise DemoError(
            f"crew-computer did not say ready (got {line!r}, exit {proc.returncode}): "
            f"{computer.stderr()[-3000:]}"
        )
    return computer


@dataclass
class LocalStack:
    """crew-server + scripted model + crew-computer under one temporary directory."""

    root: Path
    server: ServerProcess
    model: ScriptedModel | None
    computer: ComputerProcess
    computer_id: str
    http: httpx.Client
    health: dict[str, Any] = field(default_factory=dict)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """A user-API call that must succeed; its JSON answer."""
        response = self.http.request(method, path, **kwargs)
        if response.status_code >= 300:
            raise DemoError(f"{method} {path} answered {response.status_code}: {response.text}")
        return response.json() if response.content else None

    def create_agent(self, handle: str, name: str, persona: str, model: str) -> dict[str, Any]:
        body = {
            "handle": handle,
            "name": name,
            "persona": persona,
            "model": model,
            "computer_id": self.computer_id,
        }
        agent: dict[str, Any] = self.call("POST", "/api/agents", json=body)
        return agent

    def finished_turn(self, agent_id: str, after: int, timeout: float) -> dict[str, Any]:
        """Wait for the agent's turn number `after + 1` to finish; the full record."""

        def probe() -> dict[str, Any] | None:
            turns = list(reversed(self.call("GET", "/api/turns", params={"agent_id": agent_id})))
            done = [t for t in turns if t["status"] != "running"]
            return done[after] if len(done) > after else None

        turn = wait_until("the agent's turn to finish", probe, timeout)
        record: dict[str, Any] = self.call("GET", f"/api/turns/{turn['id']}")
        return record


@contextlib.contextmanager
def local_stack(
    *,
    script: Script | None = None,
    own_login: bool = False,
    keep: bool = False,
    price_in_config: bool = False,
    engine_mode: str | None = None,
    bootstrap_extra: dict[str, Any] | None = None,
) -> Iterator[LocalStack]:
    """Start the whole chain; stop it (Computer first) and remove the temp dir on exit.

    `bootstrap_extra` adds keys to the Computer's bootstrap (benchmarks: caps, budgets).
    """
    if not BUNDLED_OPENCODE.exists():
        raise DemoError(f"OpenCode not found at {BUNDLED_OPENCODE}: run scripts/setup first")
    # Short path: the sockets live under it and Unix socket paths are limited to 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="crew-demo-"))
    crew_home = root / "crew"
    home: Path | None = None if own_login else root / "home"
    model: ScriptedModel | None = None
    server: ServerProcess | None = None
    computer: ComputerProcess | None = None
    try:
        if home is not None:
            model = ScriptedModel(script or scenario("crew")).start()
            write_scripted_login(home, model.base_url, price_in_config=price_in_config)
        server = start_server(root)
        http = httpx.Client(base_url=server.url, timeout=10, headers=server.user_headers)
        created = http.post("/api/computers", json={"name": "demo"})
        if created.status_code != 201:
            raise DemoError(f"creating a computer failed: {created.status_code} {created.text}")
        computer_id, token = created.json()["computer_id"], created.json()["token"]
        bootstrap = {
            "server_url": server.url,
            "token": token,
            "crew_home": str(crew_home),
            "opencode_path": str(BUNDLED_OPENCODE),
        }
        if engine_mode is not None:
            bootstrap["engine_mode"] = engine_mode  # default: warm where supported
        bootstrap.update(bootstrap_extra or {})
        computer = start_computer(user_env(home, crew_home), bootstrap, crew_home, root)
        health = wait_until("the Computer's sandbox check", computer.health, START_TIMEOUT_S)
        yield LocalStack(root, server, model, computer, computer_id, http, health)
    finally:
        if computer is not None:
            code = computer.stop()
            if code != 0:
                print(f"crew-computer exited {code}:\n{computer.stderr()[-2000:]}", file=sys.stderr)
        if server is not None:
            server.stop()
        if model is not None:
            model.stop()
        if keep:
            print(f"(kept {root})")
        else:
            shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- printing


def _short(text: object, width: int = 70) -> str:
    one_line = " ".join(str(text).split())
    return one_line if len(one_line) <= width else one_line[: width - 1] + "…"


def describe_turn(turn: dict[str, Any]) -> list[str]:
    """The turn record as lines a person reads: steps, tool calls, tokens, cost."""
    lines = [f"Turn {turn['id']}: {turn['status']}"]
    if turn.get("failure"):
        lines.append(f"  failure: {turn['failure']['class']}: {turn['failure']['reason']}")
    step = 0
    for event in turn.get("events", []):
        data = event.get("data") or {}
        kind = event["type"]
        if kind == "step_start":
            step += 1
            lines.append(f"  step {step}")
        elif kind == "tool_use":
            status = "failed" if data.get("failed") else "ok"
            lines.append(
                f"    tool {data.get('tool')} ({status}, {data.get('duration_ms')} ms): "
                f"{_short(data.get('title') or data.get('input'))}"
            )
        elif kind == "text":
            lines.append(f"    text: {_short(data.get('text', ''))}")
        elif kind == "step_finish":
            tokens = data.get("tokens") or {}
            lines.append(
                f"    finished ({data.get('reason')}): {tokens.get('input', 0)} in, "
                f"{tokens.get('output', 0)} out, {tokens.get('cache_read', 0)} cached; "
                f"${data.get('cost', 0):.6f}"
            )
        else:
            lines.append(f"    {kind}: {_short(orjson.dumps(data).decode())}")
    usage = turn.get("usage") or {}
    lines.append(
        f"  total: {usage.get('input_tokens', 0)} input, {usage.get('output_tokens', 0)} output, "
        f"{usage.get('cache_read', 0)} cached tokens; cost ${usage.get('cost', 0):.6f}"
    )
    return lines


def run_demo(
    model: str | None, keep: bool, reply_timeout: float, engine_mode: str | None = None
) -> int:
    """The demo itself; returns the exit status."""
    say = print
    own = model is not None
    say(
        "Crew demo: crew-server, "
        + ("your OpenCode login" if own else "the scripted model")
        + ", crew-computer, the launcher and OpenCode in the sandbox."
    )
    with local_stack(own_login=own, keep=keep, engine_mode=engine_mode) as stack:
        sandbox, engine = stack.health["sandbox"], stack.health["engine"]
        say(
            f"  crew-server    {stack.server.url} (dev mode, database in a temp dir, "
            f"user token in {stack.server.user_token_file})"
        )
        if stack.model is not None:
            say(f"  model          {stack.model.base_url} (scripted, OpenAI-compatible)")
        say(f"  crew-computer  ready; crew home {stack.computer.crew_home}")
        say(f"                 introspection at {stack.computer.socket}")
        say(
            f"  sandbox        {sandbox.get('backend')} ok={sandbox.get('ok')} "
            f"{sandbox.get('reason') or ''}".rstrip()
        )
        say(
            f"  engine         opencode {engine.get('version') if isinstance(engine, dict) else engine}"
        )
        if not sandbox.get("ok"):
            say(
                f"The sandbox is not usable here: {sandbox.get('reason')}. See Troubleshooting in README.md."
            )
            return 1
        agent = stack.create_agent(
            "ada", "Ada", "A friendly engineer who answers briefly.", model or SCRIPTED_MODEL
        )
        room = stack.call("POST", "/api/rooms", json={"kind": "dm", "agent_ids": [agent["id"]]})
        say(f"\nAgent @ada ({agent['model']}), DM room {room['id']}")
        text = "Hi Ada! Please leave a short note in your work directory and tell me when done."
        stack.call("POST", f"/api/rooms/{room['id']}/messages", json={"body": text})
        say(f"User: {text}")
        started = time.monotonic()
        turn = stack.finished_turn(agent["id"], 0, reply_timeout)
        replies = [
            m
            for m in stack.call("GET", f"/api/rooms/{room['id']}/messages")
            if m["author"]["id"] == agent["id"]
        ]
        for reply in replies:
            say(f"Ada (@ada): {reply['body']}")
        waited = time.monotonic() - started
        say(
            f"(reply after {waited:.1f} s)\n"
            if replies
            else f"(no reply; the turn ended after {waited:.1f} s)\n"
        )
        for line in describe_turn(turn):
            say(line)
        ok = turn["status"] == "succeeded" and bool(replies)
        say(f"\nStopping {stopping(stack)} …")
    say("Stopped." if ok else "The agent did not answer; see the turn record above.")
    return 0 if ok else 1


def sign_in_url(stack: LocalStack) -> str:
    """A link that signs a browser in once, within 10 minutes: a one-time code the server
    minted (the user token never goes into a URL, which browsers keep in their history)."""
    minted = stack.call("POST", "/api/sign-in-codes")
    return f"{stack.server.url}{minted['path']}"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stopping(stack: LocalStack) -> str:
    """What a stop ends: the scripted model only when this demo started one."""
    return "crew-computer, crew-server" + (" and the scripted model" if stack.model else "")


def run_web_demo(model: str | None, keep: bool, engine_mode: str | None = None) -> int:
    """The whole system with one agent, for a person in a browser, until Ctrl+C."""
    say = print
    own = model is not None
    # Ctrl+C, and SIGTERM too (a service manager's stop, or a shell's background job,
    # where SIGINT is ignored): both stop the chain cleanly through local_stack.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    with local_stack(own_login=own, keep=keep, engine_mode=engine_mode) as stack:
        sandbox = stack.health["sandbox"]
        if not sandbox.get("ok"):
            say(
                f"The sandbox is not usable here: {sandbox.get('reason')}. See Troubleshooting in README.md."
            )
            return 1
        agent = stack.create_agent(
            "ada", "Ada", "A friendly engineer who answers briefly.", model or SCRIPTED_MODEL
        )
        stack.call("POST", "/api/rooms", json={"kind": "dm", "agent_ids": [agent["id"]]})
        say(
            "Crew web demo: crew-server, "
            + ("your OpenCode login" if own else "the scripted model")
            + ", crew-computer and one agent, @ada, with a direct chat.\n"
        )
        say(f"  Open this link to sign in (once, within 10 minutes):  {sign_in_url(stack)}")
        say(f"  (or {stack.server.url}/login with the token in {stack.server.user_token_file})")
        say(f"  crew home (agents' directories, sockets): {stack.computer.crew_home}")
        engine = engine_mode or "warm where supported"
        say(f"  opencode {stack.health['engine'].get('version')}, engine {engine}\n")
        say("Running until Ctrl+C …", flush=True)
        try:
            while stack.server.proc.poll() is None and stack.computer.proc.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            say(f"\nStopping {stopping(stack)} …")
            return 0
        say("A part of the demo stopped by itself; see the logs (--keep keeps them).")
        return 1


def main(argv: list[str] | None = None) -> int:
    """`python -m crew_harness.demo [--model provider/model] [--keep] [--web]`."""
    parser = argparse.ArgumentParser(prog="scripts/demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        help="use your own OpenCode login and this model (provider/model) instead of the scripted one",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument(
        "--web",
        action="store_true",
        help="keep everything running with one agent and print a sign-in link for the "
        "browser, until Ctrl+C",
    )
    parser.add_argument("--timeout", type=float, default=None, help="seconds to wait for the reply")
    parser.add_argument(
        "--engine",
        choices=["warm", "cold"],
        help="warm: one opencode serve per agent (the default on Linux); cold: opencode run per turn",
    )
    args = parser.parse_args(argv)
    if args.model is not None and "/" not in args.model:
        print(
            "error: --model takes provider/model, e.g. anthropic/claude-sonnet-4-5. "
            "List yours with: opencode models",
            file=sys.stderr,
        )
        return 2
    timeout = args.timeout or (300.0 if args.model else 90.0)
    try:
        if args.web:
            return run_web_demo(args.model, args.keep, args.engine)
        return run_demo(args.model, args.keep, timeout, args.engine)
    except (DemoError, WaitTimeout) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; everything was stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
