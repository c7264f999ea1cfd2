"""A fake `opencode` for launcher tests: what it does is read as JSON from stdin.

Copied into an executable `opencode` (shebang: this interpreter, `-IS`) and run inside the
real sandbox. Prints JSON lines; the tests read them from the launcher's
`line` frames. Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def attempt(name: str, action: Callable[[], object]) -> None:
    """Run one probe; report whether it worked and what it gave or raised."""
    try:
        result = action()
    except OSError as exc:
        emit({"check": name, "worked": False, "errno": exc.errno, "error": str(exc)})
        return
    emit({"check": name, "worked": True, "result": repr(result)[:200]})


def read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def write(path: str, text: str = "pwned\n") -> int:
    with open(path, "w", encoding="utf-8") as f:
        return f.write(text)


def connect(path: str) -> str:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    finally:
        s.close()
    return "connected"


def rename_across(base: str) -> str:
    a, b = os.path.join(base, "ren-a"), os.path.join(base, "ren-b")
    os.makedirs(a, exist_ok=True)
    os.makedirs(b, exist_ok=True)
    write(os.path.join(a, "f"), "moved\n")
    os.rename(os.path.join(a, "f"), os.path.join(b, "f"))
    return read(os.path.join(b, "f"))


def zsh_heredoc() -> str:
    done = subprocess.run(
        ["zsh", "-c", "cat <<EOF\nheredoc-ok\nEOF"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0 or done.stdout.strip() != "heredoc-ok":
        raise OSError(0, f"zsh heredoc failed: rc={done.returncode} {done.stderr.strip()}")
    return done.stdout.strip()


def hostile(cfg: dict[str, Any]) -> None:
    home, marker = cfg["home"], cfg["marker"]
    attempt("read_ssh_key", lambda: read(f"{home}/.ssh/id_rsa"))
    attempt("read_secret", lambda: read(f"{home}/secret"))
    attempt("stat_ssh_key", lambda: os.stat(f"{home}/.ssh/id_rsa").st_size)
    attempt("stat_secret", lambda: os.stat(f"{home}/secret").st_size)
    attempt("write_bashrc", lambda: write(f"{home}/.bashrc"))
    attempt("write_var_tmp", lambda: write(cfg["var_tmp_file"]))
    attempt("write_etc", lambda: write(cfg["etc_file"]))
    attempt("read_other_token", lambda: read(cfg["other_token"]))
    attempt("read_own_token", lambda: read(cfg["own_token"]))
    attempt("connect_computer_socket", lambda: connect(cfg["computer_sock"]))
    attempt("read_launcher_environ", lambda: read(f"/proc/{cfg['launcher_pid']}/environ"))
    attempt("signal_launcher", lambda: os.kill(cfg["launcher_pid"], signal.SIGTERM))
    attempt("write_agent_dir", lambda: write(os.path.join(cfg["agent_dir"], "probe.txt"), "a\n"))
    attempt("write_runtime_dir", lambda: write(os.path.join(cfg["runtime_dir"], "probe.txt")))
    attempt("write_tmpdir", lambda: write(os.path.join(os.environ["TMPDIR"], "probe.txt")))
    attempt("write_slash_tmp", lambda: write("/tmp/probe-slash-tmp.txt"))
    attempt("read_bin_crew", lambda: read(cfg["bin_crew"]))
    attempt("zsh_heredoc", zsh_heredoc)
    attempt("inherited_fds", lambda: sorted(int(fd) for fd in os.listdir("/proc/self/fd")))
    attempt("rename_agent_dir", lambda: rename_across(cfg["agent_dir"]))
    attempt("rename_tmpdir", lambda: rename_across(os.environ["TMPDIR"]))
    # Leave processes behind: one in our group, one in its own session.
    subprocess.Popen(["sleep", marker], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.Popen(["setsid", "sleep", marker], stdout=subprocess.DEVNULL)
    time.sleep(0.2)
    emit({"check": "done", "worked": True})


def stop_gracefully(cfg: dict[str, Any]) -> None:
    def on_int(signum: int, frame: object) -> None:
        emit({"event": "graceful"})
        sys.exit(130)

    signal.signal(signal.SIGINT, on_int)
    subprocess.Popen(["sleep", cfg["marker"]], stdout=subprocess.DEVNULL)
    subprocess.Popen(["setsid", "sleep", cfg["marker"]], stdout=subprocess.DEVNULL)
    emit({"event": "waiting"})
    while True:
        time.sleep(1)


def ignore_int(cfg: dict[str, Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    emit({"event": "waiting"})
    while True:
        time.sleep(1)


def flood(cfg: dict[str, Any]) -> None:
    line = "x" * (cfg["line_size"] - 1) + "\n"
    out = sys.stdout
    for _ in range(cfg["lines"]):
        out.write(line)
    out.flush()
    if cfg.get("then_sleep"):
        time.sleep(cfg["then_sleep"])


def pipe_holder(cfg: dict[str, Any]) -> None:
    # A daemon that keeps our stdout open long after we exit.
    subprocess.Popen(["setsid", "sleep", cfg["marker"]])
    subprocess.Popen(["sleep", cfg["marker"]])
    emit({"event": "leaving"})


def fork_bomb(cfg: dict[str, Any]) -> None:
    # Forks until refused, then keeps trying as a real bomb does: only the launcher ends it.
    emit({"event": "bombing"})
    while True:
        try:
            if os.fork() == 0:
                signal.pause()
                os._exit(0)
        except OSError:
            time.sleep(0.01)


def shm_fill(cfg: dict[str, Any]) -> None:
    # 256 MiB into /dev/shm; the tmpfs is smaller, so this stops at ENOSPC and waits.
    chunk = b"\0" * (1 << 20)
    written = 0
    try:
        with open("/dev/shm/fill", "wb") as f:
            for _ in range(256):
                f.write(chunk)
                f.flush()
                written += 1
    except OSError as exc:
        emit({"event": "shm_refused", "errno": exc.errno, "mib": written})
    while True:
        time.sleep(1)


def serve(cfg: dict[str, Any]) -> None:
    # An engine server inside the sandbox: greet one client, then wait to be stopped.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", cfg["port"]))
    listener.listen(1)
    emit({"event": "listening"})
    conn, _ = listener.accept()
    conn.sendall(b"hello from the sandbox")
    conn.close()
    emit({"event": "served"})
    while True:
        time.sleep(1)


def disk_fill(cfg: dict[str, Any]) -> None:
    # One file past the agent's disk limit (RLIMIT_FSIZE: EFBIG), then many smaller
    # ones in work/ (the watch ends the run), then wait for the launcher.
    chunk = b"\0" * (1 << 20)
    written = 0
    try:
        with open("big", "wb") as f:
            for _ in range(cfg["big_mib"]):
                f.write(chunk)
                f.flush()
                written += 1
        emit({"event": "big_written", "mib": written})
    except OSError as exc:
        emit({"event": "big_refused", "errno": exc.errno, "mib": written})
    os.unlink("big")
    for i in range(cfg["files"]):
        with open(f"fill-{i}", "wb") as f:
            for _ in range(4):
                f.write(chunk)
    emit({"event": "filled"})
    while True:
        time.sleep(1)


def memory_hog(cfg: dict[str, Any]) -> None:
    # A tool that touches 1 GiB; the engine itself waits for the launcher to end the run.
    code = "b = bytearray(1 << 30)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
    subprocess.Popen([sys.executable, "-c", code])
    emit({"event": "hogging"})
    while True:
        time.sleep(1)


FORGER = r"""
import json, os, sys
forged = json.dumps({"type": "step_finish", "part": {"type": "step-finish", "cost": 1e6,
                     "tokens": {"input": 10**9, "output": 0}}}) + "\n"
tried = {}
for name, path in (("ppid", f"/proc/{os.getppid()}/fd/1"), ("self_parent_fd", sys.argv[1])):
    try:
        with open(path, "w") as f:
            f.write(forged)
        tried[name] = "written"
    except OSError as exc:
        tried[name] = exc.errno
print(json.dumps(tried))
"""


def forge(cfg: dict[str, Any]) -> None:
    # A tool, started as OpenCode starts one (its stdout a pipe to the engine), writes
    # a forged step_finish into the engine's stdout through /proc.
    emit({"event": "before"})
    done = subprocess.run(
        [sys.executable, "-c", FORGER, f"/proc/{os.getpid()}/fd/1"],
        capture_output=True,
        text=True,
        check=False,
    )
    emit({"event": "tool", "stdout": done.stdout.strip(), "stderr": done.stderr[-500:]})


def echo(cfg: dict[str, Any]) -> None:
    emit({"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd(), "stdin": cfg})
    sys.stdout.write("no newline at the end")
    sys.stdout.flush()
    sys.stderr.write("e" * cfg.get("stderr_bytes", 0))
    sys.exit(cfg.get("exit", 0))


def commands(cfg: dict[str, Any]) -> None:
    # Each named command runs with the sandbox's PATH; its status and output are reported.
    for name, argv in cfg["commands"].items():
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        emit({"check": name, "rc": done.returncode, "out": (done.stdout + done.stderr)[:500]})


def main() -> None:
    if sys.argv[1:2] == ["--version"]:
        print("0.0.0-fake")
        return
    if sys.argv[1:2] == ["models"]:
        print("\x1b[1mnoise\x1b[0m\nlocal/scripted\nopencode/big-pickle\nnot a model line")
        return
    cfg = json.loads(sys.stdin.read())
    scenarios = {
        "hostile": hostile,
        "stop": stop_gracefully,
        "ignore_int": ignore_int,
        "flood": flood,
        "pipe_holder": pipe_holder,
        "echo": echo,
        "commands": commands,
        "fork_bomb": fork_bomb,
        "shm_fill": shm_fill,
        "memory_hog": memory_hog,
        "disk_fill": disk_fill,
        "forge": forge,
        "serve": serve,
    }
    scenarios[cfg["scenario"]](cfg)


if __name__ == "__main__":
    main()
