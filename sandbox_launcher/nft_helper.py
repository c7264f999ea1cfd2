"""The one process per sandbox that drives nftables inside its network namespace.

A child of the launcher (the launcher's Python, `-I -S`) enters the sandbox's
user and network namespaces with `setns` and then runs nft commands through
libnftables (`ctypes`) for as long as the sandbox lives: the table at the
attach (`network.firewall_ruleset`), then the addresses the launcher's
resolver answers (`egress_dns`) and the reads of the denial sets
(`denials`). One long-lived child, not one per command: a DNS answer waits
for its set elements, and a Python start costs tens of milliseconds.

Its own process because a user namespace is entered only single-threaded; no
exec after the setns because an exec as a non-root uid drops the namespace's
capabilities (so `nsenter` + `nft` would not do). It holds the namespace
open, so the denials can still be read after the sandbox's last process
ended. `close` kills it; the launcher's death ends it too (its stdin closes).

Cold start (issue 26): the helper is started before it has a namespace to go
in (`spawn`), Python and libnftables loaded, and is handed the sandbox's
namespace fds over a Unix socket (`enter`, SCM_RIGHTS) once bwrap has made
them; its nftables contexts (and so their netlink sockets) are created only
after the `setns`, inside. The launcher keeps one such helper ready
(`NftSpare`), so a sandbox's firewall waits for no Python start at all.

The protocol: one JSON line per request on its stdin, `{"cmd": TEXT, "json":
BOOL}`, one JSON line per answer on its stdout, `{"ok": BOOL, "out": TEXT,
"err": TEXT}`; a batch of commands in one request is one nftables
transaction (all or nothing).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import socket
import subprocess
import threading

log = logging.getLogger(__name__)

HELPER_TIMEOUT_S = 10.0

HELPER = r"""
import ctypes, json, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
nft = ctypes.CDLL(sys.argv[2])
nft.nft_ctx_new.restype = ctypes.c_void_p
nft.nft_ctx_new.argtypes = [ctypes.c_uint32]
for name in ("nft_ctx_buffer_error", "nft_ctx_buffer_output"):
    getattr(nft, name).argtypes = [ctypes.c_void_p]
for name in ("nft_ctx_get_error_buffer", "nft_ctx_get_output_buffer"):
    getattr(nft, name).restype = ctypes.c_char_p
    getattr(nft, name).argtypes = [ctypes.c_void_p]
nft.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
nft.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
# Loaded, not yet in any namespace: wait for the sandbox's ("u" user, "n" net) fds.
with socket.socket(fileno=int(sys.argv[1])) as channel:
    kinds, fds, _, _ = socket.recv_fds(channel, 8, 2)
if not kinds:
    sys.exit(0)  # a spare never used
if kinds not in (b"n", b"un") or len(fds) != len(kinds):
    sys.exit("the launcher sent no namespaces")
for kind, fd in zip(kinds.decode(), fds):
    if libc.setns(fd, {"u": 0x10000000, "n": 0x40000000}[kind]) != 0:
        sys.exit("setns: " + os.strerror(ctypes.get_errno()))
    os.close(fd)
# Only now, inside: a context's netlink socket belongs to the namespace it is opened in.
contexts = []
for flags in (0, 1 << 4):  # plain, NFT_CTX_OUTPUT_JSON
    ctx = nft.nft_ctx_new(0)
    if not ctx:
        sys.exit("nft_ctx_new failed")
    nft.nft_ctx_buffer_error(ctx)
    nft.nft_ctx_buffer_output(ctx)
    nft.nft_ctx_output_set_flags(ctx, flags)
    contexts.append(ctx)
print(json.dumps({"ok": True, "out": "ready", "err": ""}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    ctx = contexts[1 if request.get("json") else 0]
    ok = nft.nft_run_cmd_from_buffer(ctx, request["cmd"].encode()) == 0
    out = (nft.nft_ctx_get_output_buffer(ctx) or b"").decode("utf-8", "replace")
    err = (nft.nft_ctx_get_error_buffer(ctx) or b"").decode("utf-8", "replace")
    print(json.dumps({"ok": ok, "out": out, "err": err}), flush=True)
"""


class NftError(OSError):
    """nftables refused a command, or the helper is gone; the message says which."""


def helper_argv(python: str, channel_fd: int, library: str) -> list[str]:
    """The helper's argv: the socket it is handed the namespaces on, and the library. Pure."""
    return [python, "-I", "-S", "-c", HELPER, str(channel_fd), library]


class NftHelper:
    """A running helper: `enter` puts it in a sandbox's namespaces, `run` sends it commands
    (thread-safe), `close` ends it.
    """

    def __init__(self, process: subprocess.Popen[bytes], channel: socket.socket) -> None:
        self._process = process
        self._channel: socket.socket | None = channel  # until the namespaces are handed over
        self._lock = threading.Lock()
        self._buffer = b""

    @classmethod
    def spawn(cls, python: str, library: str) -> NftHelper:
        """Start a helper that loads Python and libnftables, then waits for `enter`.

        Its start (tens of milliseconds) is nobody's wait when it runs while the
        sandbox starts, or before it (`NftSpare`). Raises `NftError`.
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            process = subprocess.Popen(
                helper_argv(python, theirs.fileno(), library),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(),),
                env={"PATH": "/usr/bin:/bin"},
            )
        except OSError as exc:
            ours.close()
            raise NftError(f"the nftables helper did not start: {exc}") from exc
        finally:
            theirs.close()
        return cls(process, ours)

    @classmethod
    def start(cls, python: str, ns_fds: tuple[int, int], library: str) -> NftHelper:
        """Start it in the namespaces of `ns_fds` (the caller closes them); raises `NftError`."""
        helper = cls.spawn(python, library)
        helper.enter(ns_fds)
        return helper

    def enter(self, ns_fds: tuple[int, int]) -> None:
        """Hand it the (user, net) namespace fds and wait until it is in them.

        A user fd of -1 enters no user namespace (the caller's own). The caller
        closes its fds. Raises `NftError` (the helper is closed then).
        """
        channel, self._channel = self._channel, None
        if channel is None:
            raise NftError("the nftables helper was handed its namespaces already")
        user_fd, net_fd = ns_fds
        kinds, fds = (b"n", [net_fd]) if user_fd < 0 else (b"un", [user_fd, net_fd])
        try:
            with channel:
                socket.send_fds(channel, [kinds], fds)
            self._answer()
        except NftError:
            self.close()
            raise
        except OSError as exc:  # a helper that died before it was handed them: EPIPE
            said = self._stderr()
            self.close()
            raise NftError(f"the nftables helper ended: {said or exc}") from exc

    def waiting(self) -> bool:
        """Is it alive and not yet handed its namespaces (usable for `enter`)?"""
        return self._channel is not None and self._process.poll() is None

    def stderr_tail(self) -> str:
        """What an ended helper wrote on stderr (its last 500 characters)."""
        return self._stderr() if self._process.poll() is not None else ""

    def run(self, commands: str, as_json: bool = False) -> str:
        """Run `commands` (one transaction); their output. Raises `NftError` with nft's words."""
        with self._lock:
            stdin = self._process.stdin
            assert stdin is not None
            try:
                stdin.write(json.dumps({"cmd": commands, "json": as_json}).encode() + b"\n")
                stdin.flush()
            except OSError as exc:
                raise NftError(f"the nftables helper is gone: {exc}") from exc
            return self._answer()

    def _answer(self) -> str:
        stdout = self._process.stdout
        assert stdout is not None
        line = self._read_line(stdout.fileno())
        if line is None:
            self._process.kill()
            said = self._stderr()
            raise NftError(f"the nftables helper ended: {said or 'no message'}")
        answer = json.loads(line)
        if not answer["ok"]:
            raise NftError(answer["err"].strip()[-500:] or "nftables refused the command")
        out: str = answer["out"]
        return out

    def _read_line(self, fd: int) -> bytes | None:
        """One line of the helper's stdout within the timeout; None at EOF or past it."""
        while b"\n" not in self._buffer:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            if not poller.poll(HELPER_TIMEOUT_S * 1000):
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _stderr(self) -> str:
        try:
            _, err = self._process.communicate(timeout=HELPER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return ""
        return err.decode("utf-8", "replace").strip()[-500:]

    def kill(self) -> None:
        """SIGKILL it without waiting (`close` reaps it). Idempotent."""
        if self._process.poll() is None:
            self._process.kill()

    def close(self) -> None:
        """Kill the helper and reap it. Idempotent."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        process = self._process
        if process.poll() is None:
            # Nothing of its is worth a graceful exit (its table dies with the namespace),
            # and a Python's exit is time on the path of the run's end.
            process.kill()
            process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):  # stdin: a write it never read
                    stream.close()


class NftSpare:
    """One helper kept started ahead of the next sandbox: its Python and libnftables loaded.

    `take` hands out the ready one (or starts one when there is none), `refill`
    starts the next off the sandbox's path (after its attach). A spare is in no
    namespace: it waits for `enter`, and ends when its channel closes (`close`,
    or the launcher's death).
    """

    def __init__(self, python: str, library: str) -> None:
        self.python = python
        self.library = library
        self._ready: NftHelper | None = None
        self._lock = threading.Lock()

    def take(self) -> NftHelper:
        """A helper waiting for `enter`; raises `NftError` when none can start."""
        with self._lock:
            helper, self._ready = self._ready, None
        if helper is not None and helper.waiting():
            return helper
        if helper is not None:
            log.warning("the spare nftables helper ended on its own: %s", helper.stderr_tail())
            helper.close()
        return NftHelper.spawn(self.python, self.library)

    def refill(self) -> None:
        """Start the next spare unless one is ready; a failure is logged (`take` retries)."""
        with self._lock:
            if self._ready is not None:
                return
            try:
                self._ready = NftHelper.spawn(self.python, self.library)
            except NftError as exc:
                log.warning("no spare nftables helper: %s", exc)

    def close(self) -> None:
        """End the spare, if any. Idempotent."""
        with self._lock:
            helper, self._ready = self._ready, None
        if helper is not None:
            helper.close()
