"""A seccomp filter for everything an engine starts, assembled here as classic BPF.

What it denies, and why (issue 12; the same calls sandbox-runtime and Codex
deny on Linux):

- `socket(AF_UNIX, …)`: Landlock does not govern `connect()`, so without this
  an agent reaches the user's ssh-agent, gpg-agent, the D-Bus session bus
  (→ `systemd-run --user` runs anything unsandboxed) and docker/podman. The
  path of a `connect()` is out of a filter's reach, so, as sandbox-runtime
  does, new Unix sockets are refused outright; `socketpair()` (pipes between
  a process and its children: Bun, Node, Python subprocesses) stays allowed.
  Abstract sockets need `socket(AF_UNIX)` too, so they are covered as well.
- `socketpair()` of any type but `SOCK_STREAM` and `SOCK_SEQPACKET` (issue 20):
  a datagram end of a pair can `sendto()` (or `connect()` again to) any
  pathname datagram socket of the host: journald's
  `/run/systemd/journal/socket`, `/run/systemd/notify`. `SOCK_RAW` is a
  datagram socket for AF_UNIX, so it goes too. A stream or seqpacket end is
  connected for good: `connect()` answers EISCONN and a `sendto()` address is
  ignored (seqpacket) or refused (stream), so those stay (tools need them).
  `SOCK_NONBLOCK`/`SOCK_CLOEXEC` in the type are masked off before the check.
- `socket(AF_VSOCK, …)`: the hypervisor's side of a VM.
- `unshare`/`clone` with `CLONE_NEWUSER`: a nested user namespace gives back
  every capability over new namespaces (kernel attack surface). `clone3`
  passes its flags behind a pointer a filter cannot read: it answers ENOSYS,
  and libc falls back to `clone` (Docker's default profile does the same).
- `keyctl`, `add_key`, `request_key`: the kernel keyring is shared with the
  user's session (Kerberos tickets, ecryptfs keys).
- `io_uring_*`: its operations (socket, connect, …) bypass this filter.
- `ptrace`, `process_vm_readv`, `process_vm_writev`: an agent's tools share
  the sandbox with the agent's warm `opencode serve` (docs/warm-engine.md)
  and must not read or rewrite its memory; nothing an agent runs needs them.
- Reading extended attributes (`getxattr`, `listxattr` and their `l`, `f` and
  `…at` forms) answers EOPNOTSUPP, "this filesystem keeps none" (issue 20,
  R18): Landlock does not govern them, so in hybrid mode every file below
  `$HOME` told its xattrs (user.*, ACLs, security labels) though its content
  stayed denied. A filter cannot tell paths apart, so the family goes for all
  files; tools treat EOPNOTSUPP as "none" (ls, cp -a, Python's copy2, tar, git).
- Any other architecture (i386 or x32 calls from an x86-64 process would
  reach `socketcall` and friends unchecked): the process is killed.

The program is pure data (`program`, table-tested); `install` loads it into
the calling process. It runs inside bwrap from our helper
(`landlock_exec.py`, which imports only built-in modules), so this module
uses `posix` and `_ctypes` only.
"""

import _ctypes
import sys

from sandbox_launcher._libc import SetupError, errno_text, libc_call

# struct sock_filter opcodes (linux/bpf_common.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_AND_K = 0x54
_RET_K = 0x06

RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
EPERM = 1
ENOSYS = 38
EOPNOTSUPP = 95

AF_UNIX = 1
AF_VSOCK = 40
SOCK_STREAM = 1
SOCK_SEQPACKET = 5
SOCK_NONBLOCK = 0o4000
SOCK_CLOEXEC = 0o2000000
CLONE_NEWUSER = 0x10000000
_X32_SYSCALL_BIT = 0x40000000

_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2

# (audit arch, syscall numbers) per machine; numbers from the kernel's syscall tables.
_ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "socket": 41,
            "socketpair": 53,
            "clone": 56,
            "unshare": 272,
            "clone3": 435,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "getxattr": 191,
            "lgetxattr": 192,
            "fgetxattr": 193,
            "listxattr": 194,
            "llistxattr": 195,
            "flistxattr": 196,
            "getxattrat": 464,
            "listxattrat": 465,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "socket": 198,
            "socketpair": 199,
            "clone": 220,
            "unshare": 97,
            "clone3": 435,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "getxattr": 8,
            "lgetxattr": 9,
            "fgetxattr": 10,
            "listxattr": 11,
            "llistxattr": 12,
            "flistxattr": 13,
            "getxattrat": 464,
            "listxattrat": 465,
        },
    ),
}
DENIED_OUTRIGHT = (
    "add_key",
    "request_key",
    "keyctl",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
)
DENIED_SOCKET_FAMILIES = (AF_UNIX, AF_VSOCK)
XATTR_READS = (
    "getxattr",
    "lgetxattr",
    "fgetxattr",
    "listxattr",
    "llistxattr",
    "flistxattr",
    "getxattrat",
    "listxattrat",
)
ALLOWED_PAIR_TYPES = (SOCK_STREAM, SOCK_SEQPACKET)


class SeccompUnsupported(SetupError):
    """This machine's architecture has no filter here; the command must not run."""


def supported_machines() -> tuple[str, ...]:
    """The `uname -m` values a filter exists for."""
    return tuple(_ARCHES)


def program(machine: str) -> bytes:
    """The filter for `machine` as packed `struct sock_filter`s (8 bytes each)."""
    if machine not in _ARCHES:
        raise SeccompUnsupported(f"no seccomp filter for the {machine} architecture")
    arch, nr = _ARCHES[machine]
    # struct seccomp_data: int nr; u32 arch; u64 ip; u64 args[6]. The kernel reads
    # socket's domain and clone's flags as ints: their low 32 bits are what counts.
    arg0 = 16 if sys.byteorder == "little" else 20
    arg1 = arg0 + 8
    # (opcode, jump-if-true label, jump-if-false label, k); labels resolve below.
    code: list[tuple[int, str | None, str | None, int]] = [
        (_LD_W_ABS, None, None, 4),  # arch
        (_JEQ_K, None, "kill", arch),
        (_LD_W_ABS, None, None, 0),  # syscall number
    ]
    if machine == "x86_64":
        code.append((_JGE_K, "kill", None, _X32_SYSCALL_BIT))
    code += [(_JEQ_K, "eperm", None, nr[name]) for name in DENIED_OUTRIGHT]
    code += [(_JEQ_K, "enotsup", None, nr[name]) for name in XATTR_READS]
    code += [
        (_JEQ_K, "enosys", None, nr["clone3"]),
        (_JEQ_K, "socket", None, nr["socket"]),
        (_JEQ_K, "socketpair", None, nr["socketpair"]),
        (_JEQ_K, "flags", None, nr["clone"]),
        (_JEQ_K, "flags", None, nr["unshare"]),
        (_RET_K, None, None, RET_ALLOW),
    ]
    labels = {"socket": len(code)}
    code.append((_LD_W_ABS, None, None, arg0))
    code += [(_JEQ_K, "eperm", None, family) for family in DENIED_SOCKET_FAMILIES]
    code.append((_RET_K, None, None, RET_ALLOW))
    labels["socketpair"] = len(code)
    code += [
        (_LD_W_ABS, None, None, arg1),  # the type, with its flags masked off
        (_AND_K, None, None, ~(SOCK_NONBLOCK | SOCK_CLOEXEC) & 0xFFFFFFFF),
    ]
    code += [(_JEQ_K, "allow", None, kind) for kind in ALLOWED_PAIR_TYPES]
    code.append((_RET_K, None, None, _RET_ERRNO | EPERM))
    labels["allow"] = len(code)
    code.append((_RET_K, None, None, RET_ALLOW))
    labels["flags"] = len(code)
    code += [
        (_LD_W_ABS, None, None, arg0),
        (_JSET_K, "eperm", None, CLONE_NEWUSER),
        (_RET_K, None, None, RET_ALLOW),
    ]
    for label, k in (
        ("eperm", _RET_ERRNO | EPERM),
        ("enosys", _RET_ERRNO | ENOSYS),
        ("enotsup", _RET_ERRNO | EOPNOTSUPP),
        ("kill", RET_KILL_PROCESS),
    ):
        labels[label] = len(code)
        code.append((_RET_K, None, None, k))
    out = bytearray()
    for index, (op, jt, jf, k) in enumerate(code):
        # Classic BPF jumps only forward, by an offset from the next instruction.
        offsets = [0 if target is None else labels[target] - index - 1 for target in (jt, jf)]
        if not all(0 <= o < 256 for o in offsets):
            raise AssertionError(f"jump out of range at instruction {index}")
        out += op.to_bytes(2, sys.byteorder) + bytes(offsets) + k.to_bytes(4, sys.byteorder)
    return bytes(out)


class _Byte(_ctypes._SimpleCData):  # ctypes.c_ubyte
    _type_ = "B"


def install(machine: str) -> None:
    """Load the filter into this process (and so everything it execs). Needs no_new_privs."""
    filters = program(machine)
    buffer = (_Byte * len(filters)).from_buffer_copy(filters)
    # struct sock_fprog: unsigned short len, padding, struct sock_filter *filter
    fprog = (len(filters) // 8).to_bytes(2, sys.byteorder) + bytes(6)
    fprog += _ctypes.addressof(buffer).to_bytes(8, sys.byteorder)
    if libc_call("prctl", _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, fprog, 0, 0) != 0:
        raise SetupError(f"installing the seccomp filter failed: {errno_text()}")
