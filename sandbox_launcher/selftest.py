"""The self-test: one `sh` through the real policy builder, proving the sandbox holds.

A test that only checks "the denied write failed" also passes when the
sandbox never started, so it proves three things (launcher.md §Self-test):
the sandbox really started (it echoes a random nonce), an allowed write
works, and denied writes (one in `$HOME`, one in a world-writable place
outside the allowlist: `/var/tmp`) and a denied read (a canary below the
crew home, and one in `$HOME` when the crew home lies elsewhere) all fail.
On Linux also: a tool started through the sandbox's `$SHELL` (the tool
shell) runs, and cannot open `/proc/<its parent>/mem`; (issue 12) writing a
sysctl with its own value fails, and
live Unix sockets of the host (one in `$HOME`, one in `/run/user/<uid>`
when it exists) cannot be connected to, a datagram socket of the host (in
`/var/tmp`) cannot be sent to through a `socketpair()` end (issue 20: journald's
socket was reachable so), and a port listening on the host's 127.0.0.1 that
the run did not forward cannot be connected to (its own network namespace).
Afterwards the host is checked: no denied file may exist.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from sandbox_launcher.backend import Backend
from sandbox_launcher.engine_run import group_alive, reap_group
from sandbox_launcher.network import NetworkPlan, NetworkUnavailable, sandbox_failure
from sandbox_launcher.ownership import HandOverFailed, hand_over
from sandbox_launcher.paths import is_inside
from sandbox_launcher.policy import SandboxPolicy

log = logging.getLogger(__name__)

SELFTEST_TIMEOUT_S = 30.0
LEFTOVER_WAIT_S = 2.0
_SCRIPT = """
printf '%s\\n' "$1"
printf ok > "$2" || exit 10
shift 2
for denied in "$1" "$2"; do
  [ -n "$denied" ] || continue
  ( printf x > "$denied" ) 2>/dev/null && exit 11
done
for canary in "$3" "$4"; do
  [ -n "$canary" ] || continue
  cat "$canary" 2>/dev/null && exit 12
done
sysctl="$5"
if [ -n "$sysctl" ]; then
  value=$(cat "$sysctl") || exit 15
  ( printf '%s\n' "$value" > "$sysctl" ) 2>/dev/null && exit 13
fi
if [ -n "$SHELL" ]; then
  "$SHELL" -c 'exit 0' || exit 18
  "$SHELL" -c 'exec 3<>"/proc/$PPID/mem"' 2>/dev/null && exit 19
fi
python="$6"
shift 6
if [ -n "$python" ] && [ "$#" -gt 0 ]; then
  "$python" -I -S -c "$PROBE" "$@"
  probe=$?
  case "$probe" in 0|14|17|21) ;; *) exit 16 ;; esac
  [ "$probe" -eq 0 ] || exit "$probe"
fi
exit 0
"""
# Exit 0 when no socket given could be connected to, 14 when one could, 21 when
# the datagram socket in $DGRAM_SOCKET could be sent to (from either end of a
# datagram socketpair, by sendto or by connect), 17 when the host-loopback port
# in $LOOPBACK_PORT (not forwarded) could be connected to.
_SOCKET_PROBE = """
import os, socket, sys
for path in sys.argv[1:]:
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
    except OSError:
        continue
    sys.exit(14)
dgram = os.environ.get("DGRAM_SOCKET")
if dgram:
    try:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    except OSError:
        pass
    else:
        for send in (lambda: a.sendto(b"x", dgram), lambda: (b.connect(dgram), b.send(b"x"))):
            try:
                send()
            except OSError:
                continue
            sys.exit(21)
port = os.environ.get("LOOPBACK_PORT")
if port:
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=5).close()
    except OSError:
        pass
    else:
        sys.exit(17)
"""
_FAILURES = {
    10: "the allowed write in the agent directory failed",
    11: "a write outside the allowlist was NOT denied",
    12: "reading a file in $HOME was NOT denied",
    13: "writing a sysctl (/proc/sys) was NOT denied",
    14: "connecting to a host Unix socket was NOT denied",
    15: "a sysctl could not be read",
    16: "the Unix socket probe could not run (the interpreter is not usable inside)",
    17: "a host loopback port that is not forwarded was reachable (no network namespace)",
    18: "the tool shell ($SHELL) could not run a command (sandbox_launcher.tool_shell)",
    19: "a tool could open the memory of the process that started it (no nested Landlock domain)",
    20: "the sandbox did not run as the engine user (a root launcher's engines never run as root)",
    21: "sending to a host Unix datagram socket (socketpair + sendto) was NOT denied",
}
SYSCTL = Path("/proc/sys/kernel/core_pattern")
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes


def self_test(backend: Backend, home: Path, crew_home: Path) -> str | None:
    """Run the self-test; None when the sandbox holds, else the reason it does not."""
    nonce = secrets.token_hex(8)
    scratch = crew_home / f".selftest-{nonce}"
    home_file = home / f".crew-selftest-denied-{nonce}"
    var_tmp = Path("/var/tmp")
    outside = var_tmp / f"crew-selftest-denied-{nonce}" if var_tmp.is_dir() else None
    home_canary = None if is_inside(crew_home, home) else home / f".crew-selftest-canary-{nonce}"
    linux = backend.name == "bwrap"
    try:
        with ExitStack() as listeners:
            policy = _scratch_policy(scratch, home, crew_home)
            if backend.engine_ids is not None:  # a root launcher: as a run's (issue 20)
                hand_over(policy, backend.engine_ids)
            canary = scratch / "canary"
            canary.write_text("canary\n")
            if home_canary is not None:
                home_canary.write_text("canary\n")
            ok_file = policy.agent_dir / "ok"
            sockets = _live_sockets(listeners, home, nonce) if linux else []
            dgram = _datagram_listener(listeners, home, nonce) if sockets else None
            port = _loopback_listener(listeners) if linux else None
            sysctl = str(SYSCTL) if linux and SYSCTL.exists() else ""
            script = _SCRIPT.replace("\nexit 0\n", f"\n{_uid_check(backend)}exit 0\n")
            command = ["/bin/sh", "-c", script, "sh", nonce, str(ok_file)]
            command += [str(home_file), str(outside or ""), str(canary), str(home_canary or "")]
            command += [sysctl, _PYTHON if sockets else "", *map(str, sockets)]
            denied = [home_file, outside]
            reason = _judge(backend, policy, command, nonce, ok_file, denied, port, dgram)
            if reason is None and dgram is not None and _received(dgram[1]):
                return f"sandbox self-test failed: {_FAILURES[21]} (the host socket received it)"
            return reason
    except (OSError, HandOverFailed) as exc:
        return f"the self-test could not prepare its files: {exc}"
    finally:
        for path in (home_file, outside, home_canary):
            if path is not None:
                path.unlink(missing_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)


_PYTHON = os.path.realpath(sys.executable)
_PREFIX = Path(os.path.realpath(sys.base_prefix))


def _uid_check(backend: Backend) -> str:
    """As root: the script's last check, that it ran as the engine user (issue 20)."""
    ids = backend.engine_ids
    return "" if ids is None else f'[ "$(id -u)" = {ids[0]} ] || exit 20\n'


def _live_sockets(listeners: ExitStack, home: Path, nonce: str) -> list[Path]:
    """Listening Unix sockets where host services keep theirs: in `$HOME`, in `/run/user/<uid>`."""
    places = [home / f".crew-st-{nonce}.sock"]
    run_user = Path(f"/run/user/{os.getuid()}")
    if run_user.is_dir() and os.access(run_user, os.W_OK):
        places.append(run_user / f"crew-st-{nonce}.sock")
    made = []
    for path in places:
        if len(str(path)) > MAX_SOCKET_PATH:
            log.warning("self-test: %s is too long for a Unix socket; not probing it", path)
            continue
        listener = listeners.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        listener.bind(str(path))
        listeners.callback(path.unlink, missing_ok=True)
        listener.listen(1)
        made.append(path)
    return made


def _datagram_listener(
    listeners: ExitStack, home: Path, nonce: str
) -> tuple[Path, socket.socket] | None:
    """A bound Unix datagram socket of the host, as journald's is in `/run/systemd`: in
    `/var/tmp` (visible in both modes, so seccomp alone must stop it), else in `$HOME`."""
    var_tmp = Path("/var/tmp")
    place = var_tmp if var_tmp.is_dir() and os.access(var_tmp, os.W_OK) else home
    path = place / f"crew-selftest-dgram-{nonce}.sock"
    if len(str(path)) > MAX_SOCKET_PATH:
        log.warning("self-test: %s is too long for a Unix socket; not probing it", path)
        return None
    listener = listeners.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))
    listener.bind(str(path))
    listeners.callback(path.unlink, missing_ok=True)
    path.chmod(0o666)  # as journald's: any uid may send (a root launcher's engine user too)
    listener.setblocking(False)
    return path, listener


def _received(listener: socket.socket) -> bool:
    try:
        listener.recv(16)
    except BlockingIOError:
        return False
    return True


def _loopback_listener(listeners: ExitStack) -> int:
    """A listening TCP port on the host's 127.0.0.1 that no sandbox has forwarded."""
    listener = listeners.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port: int = listener.getsockname()[1]
    return port


def _scratch_policy(scratch: Path, home: Path, crew_home: Path) -> SandboxPolicy:
    agent = scratch / "agents" / "selftest"
    runtime = scratch / "runtime" / "agents" / "selftest"
    for path in (agent / "work", runtime / "tmp", crew_home / "sockets"):
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    # The socket probe runs this interpreter: readable even when it lives in $HOME,
    # unless its prefix would bring back a whole deny root.
    hides = any(is_inside(root, _PREFIX) for root in (home, crew_home))
    return SandboxPolicy(
        home=home,
        crew_home=crew_home,
        agent_dir=agent,
        runtime_dir=runtime,
        tmp_dir=runtime / "tmp",
        work_dir=agent / "work",
        read_dirs=() if hides else (_PREFIX,),
    )


def _reap_leftovers(pgid: int) -> None:
    """Wait (≤ 2 s) for what is left of the group, bwrap's pid-1 mostly, and reap it:
    the launcher adopts orphans, so one reaped too early would stay a zombie."""
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.002)
    reap_group(pgid)


def _judge(
    backend: Backend,
    policy: SandboxPolicy,
    command: list[str],
    nonce: str,
    ok_file: Path,
    denied: list[Path | None],
    port: int | None,
    dgram: tuple[Path, socket.socket] | None = None,
) -> str | None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(policy.agent_dir), "TMPDIR": str(policy.tmp_dir)}
    env["PROBE"] = _SOCKET_PROBE
    if port is not None:
        env["LOOPBACK_PORT"] = str(port)
    if dgram is not None:
        env["DGRAM_SOCKET"] = str(dgram[0])
    network = backend.network(NetworkPlan())
    argv = backend.argv(policy, command)
    try:
        process = subprocess.Popen(
            network.argv(argv) if network else argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=network.pass_fds if network else (),
        )
    except OSError as exc:
        if network:
            network.close(wait=True)  # no zombie of it once the launcher is ready
        return f"the sandbox could not be started: {exc}"
    try:
        if network:
            network.spawned()
            network.attach_blocking()
        out, err = process.communicate(timeout=SELFTEST_TIMEOUT_S)
    except NetworkUnavailable as exc:
        os.killpg(process.pid, signal.SIGKILL)
        _, err = process.communicate()
        why = sandbox_failure(str(exc), process.returncode, err)
        return f"the sandbox's network could not be set up: {why}"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return f"the sandbox self-test did not finish in {SELFTEST_TIMEOUT_S:.0f} s"
    finally:
        _reap_leftovers(process.pid)
        if network:
            network.close(wait=True)  # no zombie of it once the launcher is ready
    returncode = process.returncode
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace").strip()
    escaped = [str(p) for p in denied if p is not None and os.path.lexists(p)]
    if escaped:
        return f"the sandbox let a denied write through: {', '.join(escaped)} exists on the host"
    if stdout.splitlines()[:1] != [nonce]:
        detail = stderr.splitlines()[0] if stderr else f"exit status {returncode}"
        return f"the sandbox did not start ({detail})"
    if returncode in _FAILURES:
        return f"sandbox self-test failed: {_FAILURES[returncode]}"
    if returncode != 0:
        return f"sandbox self-test failed with exit status {returncode}: {stderr[:300]}"
    try:
        wrote = ok_file.read_text()
    except OSError as exc:
        return f"sandbox self-test failed: the allowed write is missing on the host ({exc})"
    if wrote != "ok":
        return "sandbox self-test failed: the allowed write has the wrong content on the host"
    log.info("sandbox self-test passed (%s %s)", backend.name, backend.mode or "")
    return None
