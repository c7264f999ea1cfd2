"""The seccomp program is pure data: run it through a small classic-BPF interpreter.

Table of (syscall, first argument) → verdict, per architecture; plus the
foreign-architecture and x32 calls that must never pass.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from sandbox_launcher import seccomp
from sandbox_launcher.seccomp import RET_ALLOW, RET_KILL_PROCESS

EPERM = 0x00050000 | 1
ENOSYS = 0x00050000 | 38
X86_64 = 0xC000003E
AARCH64 = 0xC00000B7
I386 = 0x40000003


def run_bpf(program: bytes, nr: int, arch: int, arg0: int = 0, arg1: int = 0) -> int:
    """Evaluate a classic BPF seccomp program over one `struct seccomp_data`."""
    data = (
        nr.to_bytes(4, sys.byteorder, signed=True)
        + arch.to_bytes(4, sys.byteorder)
        + bytes(8)
        + arg0.to_bytes(8, sys.byteorder)
        + arg1.to_bytes(8, sys.byteorder)
        + bytes(32)
    )
    insns = [program[i : i + 8] for i in range(0, len(program), 8)]
    acc = 0
    pc = 0
    while True:
        insn = insns[pc]
        op = int.from_bytes(insn[0:2], sys.byteorder)
        jt, jf = insn[2], insn[3]
        k = int.from_bytes(insn[4:8], sys.byteorder)
        pc += 1
        if op == 0x20:  # ld [k]
            acc = int.from_bytes(data[k : k + 4], sys.byteorder)
        elif op == 0x15:  # jeq
            pc += jt if acc == k else jf
        elif op == 0x35:  # jge
            pc += jt if acc >= k else jf
        elif op == 0x45:  # jset
            pc += jt if acc & k else jf
        elif op == 0x54:  # and
            acc &= k
        elif op == 0x06:  # ret
            return k
        else:
            raise AssertionError(f"unexpected opcode {op:#x}")


X86 = {
    "socket": 41,
    "socketpair": 53,
    "connect": 42,
    "clone": 56,
    "unshare": 272,
    "clone3": 435,
    "keyctl": 250,
    "add_key": 248,
    "request_key": 249,
    "io_uring_setup": 425,
    "read": 0,
    "landlock_restrict_self": 446,
    "ptrace": 101,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
}
ARM = {**X86, "socket": 198, "socketpair": 199, "connect": 203, "clone": 220, "unshare": 97}
ARM |= {"keyctl": 219, "add_key": 217, "request_key": 218, "read": 63}
ARM |= {"ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271}

CASES = [
    ("socket", 1, EPERM),  # AF_UNIX: the host's ssh-agent, D-Bus, docker…
    ("socket", 40, EPERM),  # AF_VSOCK
    ("socket", 2, RET_ALLOW),  # AF_INET: models are remote
    ("socket", 10, RET_ALLOW),  # AF_INET6
    ("socket", 16, RET_ALLOW),  # AF_NETLINK
    ("socket", (0xFFFFFFFF << 32) | 1, EPERM),  # high bits do not hide AF_UNIX
    ("connect", 3, RET_ALLOW),
    ("clone", 0x11, RET_ALLOW),  # fork (SIGCHLD)
    ("clone", 0x003D0F00, RET_ALLOW),  # a thread
    ("clone", 0x10000000 | 0x11, EPERM),  # CLONE_NEWUSER
    ("unshare", 0x10000000, EPERM),
    ("unshare", 0x00020000, RET_ALLOW),  # CLONE_NEWNS alone: needs a capability anyway
    ("clone3", 0, ENOSYS),  # libc falls back to clone
    ("keyctl", 0, EPERM),
    ("add_key", 0, EPERM),
    ("request_key", 0, EPERM),
    ("io_uring_setup", 0, EPERM),
    ("ptrace", 16, EPERM),  # PTRACE_ATTACH to the warm server
    ("process_vm_readv", 0, EPERM),
    ("process_vm_writev", 0, EPERM),
    ("read", 0, RET_ALLOW),
    ("landlock_restrict_self", 0, RET_ALLOW),
]


@pytest.mark.parametrize(
    ("machine", "arch", "numbers"), [("x86_64", X86_64, X86), ("aarch64", AARCH64, ARM)]
)
@pytest.mark.parametrize(("name", "arg0", "verdict"), CASES)
def test_verdicts(
    machine: str, arch: int, numbers: dict[str, int], name: str, arg0: int, verdict: int
) -> None:
    assert run_bpf(seccomp.program(machine), numbers[name], arch, arg0) == verdict


NONBLOCK, CLOEXEC = 0o4000, 0o2000000
PAIR_CASES = [
    (1, RET_ALLOW),  # SOCK_STREAM: a process and its children
    (1 | CLOEXEC, RET_ALLOW),
    (1 | NONBLOCK | CLOEXEC, RET_ALLOW),
    (5, RET_ALLOW),  # SOCK_SEQPACKET: connected for good, a sendto() address is ignored
    (5 | CLOEXEC, RET_ALLOW),
    (2, EPERM),  # SOCK_DGRAM: its end can sendto() journald's socket (issue 20)
    (2 | CLOEXEC, EPERM),
    (2 | NONBLOCK | CLOEXEC, EPERM),
    (3, EPERM),  # SOCK_RAW: a datagram socket for AF_UNIX
    (4, EPERM),  # SOCK_RDM
    ((1 << 32) | 2, EPERM),  # high bits do not hide the type (the kernel reads an int)
    (0x40 | 1, EPERM),  # an unknown flag: not a plain stream
]


@pytest.mark.parametrize(
    ("machine", "arch", "numbers"), [("x86_64", X86_64, X86), ("aarch64", AARCH64, ARM)]
)
@pytest.mark.parametrize(("kind", "verdict"), PAIR_CASES)
def test_socketpair_verdicts_by_type(
    machine: str, arch: int, numbers: dict[str, int], kind: int, verdict: int
) -> None:
    program = seccomp.program(machine)
    assert run_bpf(program, numbers["socketpair"], arch, 1, kind) == verdict


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_other_architectures_are_killed(machine: str) -> None:
    program = seccomp.program(machine)
    # i386's socketcall (102) would reach socket(AF_UNIX) past the x86-64 rules.
    assert run_bpf(program, 102, I386, 1) == RET_KILL_PROCESS
    other = AARCH64 if machine == "x86_64" else X86_64
    assert run_bpf(program, 0, other) == RET_KILL_PROCESS


def test_x32_calls_are_killed() -> None:
    program = seccomp.program("x86_64")
    assert run_bpf(program, 0x40000000 | 41, X86_64, 1) == RET_KILL_PROCESS
    assert run_bpf(program, 0x40000000, X86_64) == RET_KILL_PROCESS


def test_unknown_machine_is_refused() -> None:
    with pytest.raises(seccomp.SeccompUnsupported, match="riscv64"):
        seccomp.program("riscv64")


def test_the_filter_imports_nothing_of_landlock() -> None:
    """Both confinements take libc from `_libc`: `landlock` installs the filter, never back."""
    tree = ast.parse(Path(seccomp.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "sandbox_launcher._libc" in imported
    assert not {name for name in imported if name and "landlock" in name}
