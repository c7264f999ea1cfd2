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
ended. It ends when its stdin closes (`close`, or the launcher's death).

The protocol: one JSON line per request on its stdin, `{"cmd": TEXT, "json":
BOOL}`, one JSON line per answer on its stdout, `{"ok": BOOL, "out": TEXT,
"err": TEXT}`; a batch of commands in one request is one nftables
transaction (all or nothing).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import threading

HELPER_TIMEOUT_S = 10.0

HELPER = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for fd, kind in ((int(sys.argv[1]), 0x10000000), (int(sys.argv[2]), 0x40000000)):
    if fd >= 0 and libc.setns(fd, kind) != 0:
        sys.exit("setns: " + os.strerror(ctypes.get_errno()))
    if fd >= 0:
        os.close(fd)
nft = ctypes.CDLL(sys.argv[3])
nft.nft_ctx_new.restype = ctypes.c_void_p
nft.nft_ctx_new.argtypes = [ctypes.c_uint32]
for name in ("nft_ctx_buffer_error", "nft_ctx_buffer_output"):
    getattr(nft, name).argtypes = [ctypes.c_void_p]
for name in ("nft_ctx_get_error_buffer", "nft_ctx_get_output_buffer"):
    getattr(nft, name).restype = ctypes.c_char_p
    getattr(nft, name).argtypes = [ctypes.c_void_p]
nft.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
nft.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
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


def helper_argv(python: str, ns_fds: tuple[int, int], library: str) -> list[str]:
    """The helper's argv; a user fd of -1 enters no user namespace. Pure."""
    user_fd, net_fd = ns_fds
    return [python, "-I", "-S", "-c", HELPER, str(user_fd), str(net_fd), library]


class NftHelper:
    """A running helper: `run` sends it commands (thread-safe), `close` ends it."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process
        self._lock = threading.Lock()
        self._buffer = b""

    @classmethod
    def start(cls, python: str, ns_fds: tuple[int, int], library: str) -> NftHelper:
        """Start it in the namespaces of `ns_fds` (the caller closes them); raises `NftError`."""
        try:
            process = subprocess.Popen(
                helper_argv(python, ns_fds, library),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=tuple(fd for fd in ns_fds if fd >= 0),
                env={"PATH": "/usr/bin:/bin"},
            )
        except OSError as exc:
            raise NftError(f"the nftables helper did not start: {exc}") from exc
        helper = cls(process)
        try:
            helper._answer()
        except NftError:
            helper.close()
            raise
        return helper

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

    def close(self) -> None:
        """End the helper (its stdin closes) and reap it. Idempotent."""
        process = self._process
        if process.poll() is None:
            try:
                if process.stdin is not None:
                    process.stdin.close()
                process.wait(timeout=HELPER_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
