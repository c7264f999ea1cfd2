#!/usr/bin/env python3
"""A fake `opencode` for tests: usable as `opencode_path`, speaks `run --format json` and `serve`.

Standard library only (it runs inside the sandbox with the system python3).
It accepts the real command line
`run --pure --format json --print-logs --auto [--title T] [--dir D] [--session S] --model M`
(and `models`, `--version`), reads the whole turn input from stdin, and prints
sample-shaped JSON lines (see samples/opencode/REPORT.md §2).

Every run first dumps what it got to `$PWD/.fake-opencode/<n>.json`:
`{"argv", "env", "cwd", "stdin", "pid", "pgid"}` — tests check the exact env and argv.

Sessions: new sessions are recorded in `$XDG_DATA_HOME/fake-opencode/sessions/`;
`--session S` for an unknown S prints `Error: Session not found` on stderr and
exits 1 with empty stdout, like OpenCode 1.18. A model whose name contains
`nope` gives the real "unknown model" output (UnknownError + stderr `Model not found`).

`serve --port P --hostname H` is a fake warm server: the subset of OpenCode's HTTP API the
warm engine uses (Basic auth with `$OPENCODE_SERVER_PASSWORD`; `GET /event`, `POST /session`,
`POST /session/<id>/prompt_async`, `POST /session/<id>/abort`, `POST /permission/<id>/reply`),
printing `opencode server listening on http://H:P` once it listens. Each prompt runs this
file's `run` as a child of the server (so it is a tool process of the server's sandbox, and
every marker below works warm too; `FAKE:GROW <MiB>` makes the server itself hold that
much more memory) and turns its lines into the server's SSE events, the
inverse of `computer_service/engine/warm_events.run_line`. A child killed by a signal the
server did not send (`FAKE:CRASH`) takes the server down with it, as a crashing engine would.
Sessions are the same files `run` uses, so they continue between both engines.

Behaviour is chosen by markers in the turn input (any line), else by
`$FAKE_OPENCODE_MODE` when it exists, else "ok":
- (none) / `FAKE:OK`   step_start, text "ok", step_finish(stop, tokens 100/20, cost 0.001)
- `FAKE:TOOL`          one tool step (bash, echo) then a text step
- `FAKE:RUN <cmd>`     run `<cmd>` with /bin/sh -c (e.g. `crew reply …`, a zsh heredoc);
                       one tool_use with its output and exit code, then a text step
- `FAKE:HANG`          step_start, then sleep forever (test stop / wall clock)
- `FAKE:SLOW <s>`      step_start, sleep <s> seconds, then finish normally
- `FAKE:CRASH`         print a step_start, a stderr line, then die of SIGSEGV
- `FAKE:EXIT <n>`      print "Error: fake failure in <cwd>" on stderr and exit <n>
- `FAKE:FLOOD`         print ~64 KiB lines forever (test the output cap)
- `FAKE:LONGLINE`      one 100 KB text event line, then finish
- `FAKE:BADLINES`      a non-JSON line, an invalid UTF-8 line and an unknown type, then finish
- `FAKE:401`           the real 401 APIError line (05_http_401), exit 1
- `FAKE:429`           the real 429 APIError line (05_http_429), exit 1
- `FAKE:UNKNOWN`       endless steps finishing with reason "unknown" and zero tokens
- `FAKE:STEPS <n>`     n tool-call steps, then a text step
- `FAKE:BG [s]`        leave a background child (own session) holding stdout open that
                       touches `bg-survived` in the work dir after s seconds (default 2); exit 0
- `FAKE:HUGELINE`      step_start, then one text event line of 9 MiB (over the 8 MiB output cap)
- `FAKE:BADTEXT`       a text event whose JSON string holds invalid UTF-8 bytes, then finish
- `FAKE:ONCE <marker>` the first run in this work dir behaves as `FAKE:<marker>`, later ones as OK
- `FAKE:TIMES <n> <marker>` the first n runs in this work dir behave as `FAKE:<marker>`, later
                       ones as OK
- `FAKE:RUNS <cmd> ;; <cmd> …` each command in turn as its own bash tool call (`FAKE:RUN`
                       for several), then a text step
- `FAKE:HOSTILE <json>` a hostile agent (tests/faults): tries what the sandbox must deny and
                       writes what happened to `$HOME/hostile-<phase>.json` (see `hostile`)
"""

from __future__ import annotations

import json
import os
import queue
import random
import re
import signal
import string
import subprocess
import sys
import threading
import time

STATE = os.path.join(
    os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share"), "fake-opencode"
)


def now_ms() -> int:
    return int(time.time() * 1000)


def new_id(prefix: str) -> str:
    return prefix + "_" + "".join(random.choices(string.ascii_letters + string.digits, k=24))


class Out:
    def __init__(self, session: str) -> None:
        self.session = session
        self.message = new_id("msg")

    def emit(self, kind: str, **part: object) -> None:
        line: dict[str, object] = {"type": kind, "timestamp": now_ms(), "sessionID": self.session}
        if kind == "error":
            line["error"] = part["error"]
        else:
            part.setdefault("id", new_id("prt"))
            part.setdefault("messageID", self.message)
            part.setdefault("sessionID", self.session)
            line["part"] = part
        sys.stdout.write(json.dumps(line, ensure_ascii=False) + "\n")
        sys.stdout.flush()

    def step_start(self) -> None:
        self.message = new_id("msg")
        self.emit("step_start", type="step-start")

    def step_finish(
        self, reason: str = "stop", inp: int = 100, out: int = 20, cost: float = 0.001
    ) -> None:
        tokens = {"total": inp + out, "input": inp, "output": out, "reasoning": 0,
                  "cache": {"write": 0, "read": 0}}  # fmt: skip
        self.emit("step_finish", type="step-finish", reason=reason, tokens=tokens, cost=cost)

    def text(self, text: str) -> None:
        t = now_ms()
        self.emit("text", type="text", text=text, time={"start": t, "end": t})

    def tool(self, command: str, output: str, exit_code: int | None, start: int) -> None:
        state = {"status": "completed", "input": {"command": command, "description": "fake"},
                 "output": output, "metadata": {"output": output, "exit": exit_code, "truncated": False},
                 "title": command, "time": {"start": start, "end": now_ms()}}  # fmt: skip
        self.emit("tool_use", type="tool", tool="bash", callID=new_id("call"), state=state)


def parse_args(argv: list[str]) -> dict[str, str]:
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--title", "--dir", "--session", "--new-session", "--model", "--format",
                 "--port", "--hostname"):  # fmt: skip
            opts[a[2:]] = argv[i + 1] if i + 1 < len(argv) else ""
            i += 2
        else:
            i += 1
    return opts


def dump(argv: list[str], stdin: str) -> None:
    d = os.path.join(os.environ.get("PWD") or os.getcwd(), ".fake-opencode")
    os.makedirs(d, exist_ok=True)
    n = len(os.listdir(d))
    record = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "stdin": stdin,
              "pid": os.getpid(), "pgid": os.getpgid(0)}  # fmt: skip
    with open(os.path.join(d, f"{n:03d}.json"), "w") as f:
        json.dump(record, f)


def marker(stdin: str) -> tuple[str, str]:
    for line in stdin.splitlines():
        line = line.strip()
        if line.startswith("FAKE:"):
            name, _, arg = line[5:].partition(" ")
            return name, arg
    mode = os.environ.get("FAKE_OPENCODE_MODE", "OK")
    name, _, arg = mode.partition(" ")
    return name, arg


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["--version"]:
        print("0.0.0-fake")
        return 0
    if argv[:1] == ["models"]:
        print("local/scripted\nlocal/other")
        return 0
    if argv[:1] == ["serve"]:
        return serve(parse_args(argv))
    if argv[:1] != ["run"]:
        print(f"fake opencode: unsupported command {argv!r}", file=sys.stderr)
        return 2
    stdin = sys.stdin.read()
    dump(sys.argv, stdin)
    opts = parse_args(argv)
    print(f'timestamp=x level=INFO message="fake start" model={opts.get("model")}', file=sys.stderr)
    sessions = os.path.join(STATE, "sessions")
    os.makedirs(sessions, exist_ok=True)
    session = opts.get("session")
    if session:
        if not os.path.exists(os.path.join(sessions, session)):
            print("\x1b[91m\x1b[1mError: \x1b[0mSession not found", file=sys.stderr)
            return 1
    else:
        # `--new-session S`: the fake server's session S, made by its POST /session, first prompt
        session = opts.get("new-session") or new_id("ses")
        with open(os.path.join(sessions, session), "w") as f:
            f.write("started\n")  # a session that had a turn (the fake server's are empty)
    out = Out(session)
    model = opts.get("model", "")
    if "nope" in model:
        out.emit("error", error={"name": "UnknownError", "data": {
            "message": "Unexpected server error. Check server logs for details.", "ref": "err_1"}})  # fmt: skip
        print(f'level=ERROR message=failed error="ProviderModelNotFoundError: Model not found: {model}."',
              file=sys.stderr)  # fmt: skip
        return 1
    return run_mode(out, *marker(stdin))


def attempt(results: dict[str, dict[str, object]], name: str, action: object) -> None:
    """Run one hostile probe; record whether it worked, and its result or errno."""
    try:
        result = action()  # type: ignore[operator]
    except OSError as exc:
        results[name] = {"worked": False, "errno": exc.errno, "error": str(exc)}
        return
    results[name] = {"worked": True, "result": repr(result)[:200]}


def hostile(cfg: dict[str, object]) -> dict[str, dict[str, object]]:
    """What an agent turned hostile tries from inside its sandbox, phase by phase.

    Each turn runs the first of `cfg["phases"]` without a result file yet.

    `probe`: read the user's ssh key and OpenCode login, the other agent's token and files, write
    `~/.bashrc`, the shared `bin/crew` and into the other agent's work dir, connect
    to the crew sockets, signal the Computer, leave `setsid sleep <marker>` behind,
    make its `session.json` a FIFO. `links`: replace its own `work/` and
    `engines/opencode` with symlinks to the other agent's. The run exits 1 after
    the phases listed in `cfg["fail_after"]`.
    """
    import socket as socket_mod

    def read(path: object) -> str:
        with open(str(path), encoding="utf-8", errors="replace") as f:
            return f.read()

    def write(path: object, mode: str = "w") -> int:
        with open(str(path), mode, encoding="utf-8") as f:
            return f.write("pwned\n")

    def connect(path: object) -> str:
        s = socket_mod.socket(socket_mod.AF_UNIX, socket_mod.SOCK_STREAM)
        try:
            s.connect(str(path))
        finally:
            s.close()
        return "connected"

    def shell(command: str) -> str:
        done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True)
        if done.returncode != 0:
            raise OSError(0, f"exit {done.returncode}: {done.stderr.strip()[:150]}")
        return done.stdout

    results: dict[str, dict[str, object]] = {}
    own = os.environ["HOME"]
    other = str(cfg["other_agent_dir"])
    # The first phase not done yet (a failed turn's message comes back with the next).
    phases = [str(p) for p in cfg["phases"]]  # type: ignore[attr-defined]
    phase = next((p for p in phases if not os.path.exists(f"{own}/hostile-{p}.json")), phases[-1])
    results["phase"] = {"worked": True, "result": phase}
    if phase == "probe":
        home, pid = cfg["user_home"], int(str(cfg["computer_pid"]))
        attempt(results, "read_ssh_key", lambda: read(f"{home}/.ssh/id_rsa"))
        attempt(results, "read_user_auth", lambda: read(f"{home}/.local/share/opencode/auth.json"))
        attempt(results, "write_bashrc", lambda: write(f"{home}/.bashrc", "a"))
        attempt(results, "read_own_token", lambda: read(os.environ["CREW_TOKEN_FILE"]))
        attempt(results, "read_other_token", lambda: read(cfg["other_token"]))
        attempt(results, "read_other_memory", lambda: read(f"{other}/work/MEMORY.md"))
        attempt(results, "write_other_work", lambda: write(f"{other}/work/pwned.txt"))
        attempt(results, "write_bin_crew", lambda: write(cfg["bin_crew"], "a"))
        attempt(results, "connect_computer_socket", lambda: connect(cfg["computer_sock"]))
        attempt(results, "connect_launcher_socket", lambda: connect(cfg["launcher_sock"]))
        attempt(results, "kill_0_computer", lambda: os.kill(pid, 0))
        attempt(results, "kill_term_computer", lambda: os.kill(pid, signal.SIGTERM))
        attempt(results, "shell_kill_computer", lambda: shell(f"kill -TERM {pid}"))
        subprocess.Popen(["setsid", "sleep", str(cfg["marker"])], stdout=subprocess.DEVNULL)
        subprocess.Popen(["sleep", str(cfg["marker"])], stdout=subprocess.DEVNULL)
        session = os.path.join(own, "engines", "opencode", "session.json")

        def make_fifo() -> str:
            if os.path.lexists(session):
                os.remove(session)
            os.mkfifo(session)
            return "fifo"

        attempt(results, "session_fifo", make_fifo)
    else:

        def swap(name: str) -> str:
            mine = os.path.join(own, name)
            os.rename(mine, mine + ".old")
            os.symlink(os.path.join(other, name), mine)
            return "linked"

        attempt(results, "link_work", lambda: swap("work"))
        attempt(results, "link_engine_dir", lambda: swap(os.path.join("engines", "opencode")))
    with open(os.path.join(own, f"hostile-{phase}.json"), "w") as f:
        json.dump(results, f)
    return results


def run_mode(out: Out, name: str, arg: str) -> int:
    if name == "ONCE":
        flag = os.path.join(os.environ.get("PWD") or os.getcwd(), ".fake-opencode", "once-done")
        if os.path.exists(flag):
            name, arg = "OK", ""
        else:
            open(flag, "w").close()
            name, _, arg = arg.partition(" ")
    if name == "TIMES":
        times, _, rest = arg.partition(" ")
        counter = os.path.join(os.environ.get("PWD") or os.getcwd(), ".fake-opencode", "times-done")
        done = 0
        if os.path.exists(counter):
            with open(counter) as f:
                done = int(f.read())
        if done >= int(times):
            name, arg = "OK", ""
        else:
            with open(counter, "w") as f:
                f.write(str(done + 1))
            name, _, arg = rest.partition(" ")
    if name == "HUGELINE":
        out.step_start()
        out.text("z" * (9 * 1024 * 1024))
        out.step_finish()
        return 0
    if name == "BADTEXT":
        out.step_start()
        sys.stdout.flush()
        line = json.dumps({"type": "text", "timestamp": now_ms(), "sessionID": out.session,
                           "part": {"type": "text", "text": "caf@ ok"}}).encode()  # fmt: skip
        sys.stdout.buffer.write(line.replace(b"@", b"\xe9\xff") + b"\n")
        sys.stdout.buffer.flush()
        out.step_finish()
        return 0
    if name == "HOSTILE":
        out.step_start()
        start = now_ms()
        cfg = json.loads(arg)
        results = hostile(cfg)
        out.tool("hostile probes", json.dumps(results)[:4000], 0, start)
        out.step_finish(reason="tool-calls")
        if results["phase"]["result"] in cfg.get("fail_after", []):
            print("Error: the hostile agent gives up", file=sys.stderr)
            return 1
    if name == "HANG":
        out.step_start()
        while True:
            time.sleep(3600)
    if name == "SLOW":
        out.step_start()
        time.sleep(float(arg or 1))
        out.text("ok")
        out.step_finish()
        return 0
    if name == "CRASH":
        out.step_start()
        print("fake: about to crash", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
    if name == "EXIT":
        # Names the agent's directory, as real errors do: the reason must redact it.
        print(f"\x1b[91m\x1b[1mError: \x1b[0mfake failure in {os.getcwd()}", file=sys.stderr)
        return int(arg or 1)
    if name == "FLOOD":
        chunk = json.dumps({"type": "text", "part": {"text": "x" * 65536}}) + "\n"
        while True:
            sys.stdout.write(chunk)
    if name == "LONGLINE":
        out.step_start()
        out.text("y" * 100_000)
        out.step_finish()
        return 0
    if name == "BADLINES":
        out.step_start()
        sys.stdout.flush()
        sys.stdout.buffer.write(b"this is not json\n\xff\xfe broken utf-8\n")
        sys.stdout.buffer.flush()
        out.emit("patch", type="patch")
        out.text("ok")
        out.step_finish()
        return 0
    if name in ("401", "429"):
        status, message = (401, "Incorrect API key provided (scripted)") if name == "401" else (
            429, "Rate limit reached (scripted)")  # fmt: skip
        out.emit("error", error={"name": "APIError", "data": {
            "message": message, "statusCode": status, "isRetryable": status == 429}})  # fmt: skip
        return 1
    if name == "UNKNOWN":
        while True:
            out.step_start()
            out.step_finish(reason="unknown", inp=0, out=0, cost=0.0)
            time.sleep(0.01)
    if name == "STEPS":
        for _ in range(int(arg or 1)):
            out.step_start()
            out.tool("true", "", 0, now_ms())
            out.step_finish(reason="tool-calls")
    if name == "RUN":
        out.step_start()
        start = now_ms()
        proc = subprocess.run(
            ["/bin/sh", "-c", arg], capture_output=True, text=True, stdin=subprocess.DEVNULL
        )
        out.tool(arg, proc.stdout + proc.stderr, proc.returncode, start)
        out.step_finish(reason="tool-calls")
    if name == "RUNS":
        out.step_start()
        for command in arg.split(" ;; "):
            start = now_ms()
            proc = subprocess.run(
                ["/bin/sh", "-c", command], capture_output=True, text=True, stdin=subprocess.DEVNULL
            )
            out.tool(command, proc.stdout + proc.stderr, proc.returncode, start)
        out.step_finish(reason="tool-calls")
    if name == "TOOL":
        out.step_start()
        out.tool("echo hello", "hello\n", 0, now_ms())
        out.step_finish(reason="tool-calls")
    if name == "BG":
        out.step_start()
        # A detached child in its own session that keeps our stdout open and,
        # if it survives the turn, leaves `bg-survived` in the work dir.
        subprocess.Popen(
            ["/bin/sh", "-c", f"sleep {arg or 2}; touch bg-survived"],
            start_new_session=True,
            stdout=sys.stdout,
        )
    out.step_start()
    out.text("ok")
    out.step_finish()
    return 0


# ---- serve: a fake warm server ----


class Subscribers:
    """The open `/event` streams: each gets every event published after it subscribed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queues: list[queue.Queue[dict[str, object] | None]] = []

    def add(self) -> queue.Queue[dict[str, object] | None]:
        q: queue.Queue[dict[str, object] | None] = queue.Queue()
        with self.lock:
            self.queues.append(q)
        return q

    def remove(self, q: queue.Queue[dict[str, object] | None]) -> None:
        with self.lock:
            self.queues.remove(q)

    def publish(self, kind: str, **properties: object) -> None:
        event: dict[str, object] = {"type": kind, "properties": properties}
        with self.lock:
            for q in self.queues:
                q.put(event)


class FakeServer:
    """Sessions, the running prompts and the event streams of one fake `opencode serve`."""

    def __init__(self, password: str) -> None:
        self.password = password
        self.events = Subscribers()
        self.lock = threading.Lock()
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.aborted: set[str] = set()
        self.ballast: list[bytes] = []  # what `FAKE:GROW` made the server hold
        self.sessions = os.path.join(STATE, "sessions")
        os.makedirs(self.sessions, exist_ok=True)

    def new_session(self) -> str:
        session = new_id("ses")
        open(os.path.join(self.sessions, session), "w").close()
        return session

    def prompt(self, session: str, body: dict[str, object]) -> int:
        """Start a prompt's turn in the background: 204, or 404 for an unknown session."""
        if not re.fullmatch(r"ses_[A-Za-z0-9]{1,100}", session) or not os.path.exists(
            os.path.join(self.sessions, session)
        ):
            return 404
        parts = body.get("parts") or []
        text = "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))  # type: ignore[attr-defined]
        model = body.get("model") or {}
        model_name = f"{model.get('providerID')}/{model.get('modelID')}"  # type: ignore[attr-defined]
        grow = re.search(r"^\s*FAKE:GROW (\d+)\s*$", text, re.MULTILINE)
        if grow:
            self.ballast.append(b"g" * (int(grow[1]) * 1024 * 1024))  # resident: written
        continued = os.path.getsize(os.path.join(self.sessions, session)) > 0
        argv = [sys.argv[0], "run", "--format", "json", "--model", model_name,
                "--session" if continued else "--new-session", session]  # fmt: skip
        child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert child.stdin is not None
        child.stdin.write(text.encode())
        child.stdin.close()
        with self.lock:
            self.running[session] = child
        threading.Thread(
            target=self.follow, args=(session, str(body.get("messageID")), child), daemon=True
        ).start()
        return 204

    def follow(self, session: str, parent: str, child: subprocess.Popen[bytes]) -> None:
        """The child's lines → the server's events; then the end of the turn."""
        created = now_ms()
        message: dict[str, object] = {"id": new_id("msg"), "sessionID": session,
            "role": "assistant", "parentID": parent, "time": {"created": created}}  # fmt: skip
        self.events.publish("message.updated", info=message)
        lines: queue.Queue[bytes | None] = queue.Queue()

        def read() -> None:
            assert child.stdout is not None
            for raw in child.stdout:
                lines.put(raw)
            lines.put(None)

        # A background process of the turn may hold stdout open: the turn ends with the child.
        threading.Thread(target=read, daemon=True).start()
        error: object = None
        while True:
            try:
                raw = lines.get(timeout=0.05 if child.poll() is not None else 1.0)
            except queue.Empty:
                if child.poll() is not None:
                    break
                continue
            if raw is None:
                break
            try:
                line = json.loads(raw)
            except ValueError:
                continue  # bad lines of `FAKE:BADLINES`: a server prints no such event
            if not isinstance(line, dict):
                continue
            if line.get("type") == "error":
                error = line.get("error")
                self.events.publish("session.error", sessionID=session, error=error)
            elif isinstance(line.get("part"), dict):
                self.events.publish("message.part.updated", part=line["part"])
        code = child.wait()
        with self.lock:
            self.running.pop(session, None)
            aborted = session in self.aborted
            self.aborted.discard(session)
        if code < 0 and not aborted:
            print(f"fake opencode serve: the turn died of signal {-code}", file=sys.stderr)
            os._exit(1)  # the engine crashed: the server goes with it
        if aborted:
            error = {"name": "MessageAbortedError", "data": {"message": "Aborted"}}
            self.events.publish("session.error", sessionID=session, error=error)
        elif code != 0 and error is None:
            error = {"name": "UnknownError", "data": {"message": f"the turn exited {code}"}}
            self.events.publish("session.error", sessionID=session, error=error)
        message["time"] = {"created": created, "completed": now_ms()}
        if error is not None:
            message["error"] = error
        self.events.publish("message.updated", info=message)
        self.events.publish("session.status", sessionID=session, status={"type": "idle"})

    def abort(self, session: str) -> None:
        with self.lock:
            child = self.running.get(session)
            if child is not None:
                self.aborted.add(session)
        if child is not None:
            child.kill()


def serve(opts: dict[str, str]) -> int:
    """Run the fake warm server until killed (module doc)."""
    import base64
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    server = FakeServer(os.environ.get("OPENCODE_SERVER_PASSWORD", ""))
    expected = "Basic " + base64.b64encode(f"opencode:{server.password}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Keep-alive answers are written in parts: no 40 ms Nagle stall on each.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: object) -> None:
            pass

        def answer(self, status: int, body: object = None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def allowed(self) -> bool:
            if server.password and self.headers.get("Authorization") != expected:
                self.answer(401, {"error": "unauthorized"})
                return False
            return True

        def do_GET(self) -> None:  # http.server calls it by this name
            if not self.allowed():
                return
            if self.path.split("?")[0] != "/event":
                self.answer(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            q = server.events.add()
            try:
                event: dict[str, object] | None = {"type": "server.connected", "properties": {}}
                while True:
                    if event is not None:
                        self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                        self.wfile.flush()
                    try:
                        event = q.get(timeout=10)
                    except queue.Empty:
                        event = {"type": "server.heartbeat", "properties": {}}
            except OSError:
                pass  # the client went away
            finally:
                server.events.remove(q)
                self.close_connection = True

        def do_POST(self) -> None:  # http.server calls it by this name
            if not self.allowed():
                return
            size = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(size) or b"null")
            except ValueError:
                self.answer(400, {"error": "bad json"})
                return
            parts = self.path.split("?")[0].strip("/").split("/")
            if parts == ["session"]:
                self.answer(200, {"id": server.new_session(), "title": (body or {}).get("title")})
            elif len(parts) == 3 and parts[0] == "session" and parts[2] == "prompt_async":
                self.answer(server.prompt(parts[1], body if isinstance(body, dict) else {}))
            elif len(parts) == 3 and parts[0] == "session" and parts[2] == "abort":
                server.abort(parts[1])
                self.answer(200, True)
            elif len(parts) == 3 and parts[0] == "permission" and parts[2] == "reply":
                self.answer(200, True)
            else:
                self.answer(404)

    host = opts.get("hostname") or "127.0.0.1"
    httpd = ThreadingHTTPServer((host, int(opts.get("port") or 0)), Handler)
    httpd.daemon_threads = True
    print(f"opencode server listening on http://{host}:{httpd.server_address[1]}", flush=True)
    httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
