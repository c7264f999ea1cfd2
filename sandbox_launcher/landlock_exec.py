"""Apply a Landlock read policy to this process, then exec a command.

Run inside bwrap as ``python -I -S landlock_exec.py --deny D… --ro P… --rw P…
-- CMD…`` (sandbox.md §2.2). Landlock must be applied *inside* bwrap: it
forbids mounts, so bwrap fails if the launcher applies it first.

Only ``READ_FILE`` and ``REFER`` are handled: bwrap already makes everything
but the writable binds read-only, and Landlock adds "file contents below the
deny roots are unreadable, except the allowlist" while ``stat`` keeps working.
``REFER`` must be handled and granted or every cross-directory rename fails
with EXDEV (any ABI ≥ 2 domain denies it otherwise).

Landlock is allow-list only, so "everything except the deny roots" is built by
granting every sibling along the way from ``/`` down to each deny root.
Symlinks are skipped (their targets are covered by their own sibling, and a
link into a deny root must not open it); entries created later next to an
ancestor of a deny root stay unreadable, which fails closed.

This file imports only the standard library and nothing from its package: it
runs with ``-I -S`` (no site-packages) for a fast start. The launcher also
imports it for `abi()`.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys

_SYS_CREATE_RULESET = 444  # the same number on every architecture
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

READ_FILE = 1 << 2
REFER = 1 << 13
HANDLED = READ_FILE | REFER

EXIT_SETUP_FAILED = 126  # what `env` uses for "found but could not run"


class LandlockError(Exception):
    """Landlock could not be applied; the command must not run."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = (("handled_access_fs", ctypes.c_uint64),)


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel struct is __attribute__((packed)): 12 bytes
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi() -> int:
    """The kernel's Landlock ABI version, or 0 when Landlock is unavailable."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(
        ctypes.c_long(_SYS_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(1)
    )
    return max(int(version), 0)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def minimal_roots(roots: list[str]) -> list[str]:
    """Drop roots that lie inside another root (their parent already covers them)."""
    unique = sorted(set(roots), key=len)
    kept: list[str] = []
    for root in unique:
        if not any(_inside(root, other) for other in kept):
            kept.append(root)
    return kept


def _ancestors(path: str) -> list[str]:
    """`/a/b/c` → [`/`, `/a`, `/a/b`] (strict ancestors, top-down)."""
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(len(parts))]


def sibling_grants(deny_roots: list[str]) -> list[str]:
    """Every entry next to the way down to a deny root: what stays readable.

    Reads the directories as they are now (inside the sandbox). Entries on the
    way to a deny root, the deny roots themselves and symlinks are left out.
    """
    roots = minimal_roots(deny_roots)
    on_way = {a for r in roots for a in _ancestors(r)} | set(roots)
    grants: list[str] = []
    for ancestor in sorted({a for r in roots for a in _ancestors(r)}):
        try:
            names = os.listdir(ancestor)
        except OSError:
            continue  # unreadable ancestor: nothing below it is granted (fails closed)
        for name in sorted(names):
            entry = os.path.join(ancestor, name)
            if entry in on_way:
                continue
            try:
                if stat.S_ISLNK(os.lstat(entry).st_mode):
                    continue
            except OSError:
                continue
            grants.append(entry)
    return grants


class _Ruleset:
    def __init__(self) -> None:
        self._libc = _libc()
        self._libc.syscall.restype = ctypes.c_long
        attr = _RulesetAttr(HANDLED)
        fd = self._libc.syscall(
            ctypes.c_long(_SYS_CREATE_RULESET),
            ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)),
            ctypes.c_uint32(0),
        )
        if fd < 0:
            raise LandlockError(f"landlock_create_ruleset failed: {_errno_text()}")
        self.fd = int(fd)

    def allow(self, path: str, *, required: bool) -> None:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError as exc:
            if required:
                raise LandlockError(f"cannot open allowed path {path!r}: {exc.strerror}") from exc
            return
        try:
            is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
            # REFER only exists on directories; files get READ_FILE alone. Writes
            # stay bwrap's business, so REFER on read-only dirs grants nothing.
            access = (READ_FILE | REFER) if is_dir else READ_FILE
            rule = _PathBeneathAttr(access, fd)
            rc = self._libc.syscall(
                ctypes.c_long(_SYS_ADD_RULE),
                ctypes.c_int(self.fd),
                ctypes.c_int(_RULE_PATH_BENEATH),
                ctypes.byref(rule),
                ctypes.c_uint32(0),
            )
            if rc < 0 and required:
                raise LandlockError(f"landlock_add_rule({path!r}) failed: {_errno_text()}")
        finally:
            os.close(fd)

    def restrict_self(self) -> None:
        if self._libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise LandlockError(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {_errno_text()}")
        rc = self._libc.syscall(
            ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(self.fd), ctypes.c_uint32(0)
        )
        if rc < 0:
            raise LandlockError(f"landlock_restrict_self failed: {_errno_text()}")
        os.close(self.fd)


def _errno_text() -> str:
    err = ctypes.get_errno()
    return f"{os.strerror(err)} (errno {err})"


def apply(deny: list[str], ro: list[str], rw: list[str]) -> None:
    """Make file contents below `deny` unreadable except `ro` and `rw` paths."""
    version = abi()
    if version < 2:
        raise LandlockError(
            f"Landlock ABI {version} is too old (need 2 or newer for REFER); "
            "use the launcher's tmpfs mode on this kernel"
        )
    ruleset = _Ruleset()
    for entry in sibling_grants(deny):
        ruleset.allow(entry, required=False)
    for path in [*ro, *rw]:
        ruleset.allow(path, required=True)
    ruleset.restrict_self()


def parse_args(argv: list[str]) -> tuple[list[str], list[str], list[str], list[str]]:
    """`--deny P --ro P --rw P … -- CMD…` → (deny, ro, rw, command)."""
    lists: dict[str, list[str]] = {"--deny": [], "--ro": [], "--rw": []}
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag == "--":
            command = argv[i + 1 :]
            if not command:
                raise LandlockError("no command given after --")
            if not lists["--deny"]:
                raise LandlockError("no --deny root given")
            return lists["--deny"], lists["--ro"], lists["--rw"], command
        if flag not in lists or i + 1 >= len(argv):
            raise LandlockError(f"unexpected argument {flag!r}")
        value = argv[i + 1]
        if not value.startswith("/"):
            raise LandlockError(f"{flag} needs an absolute path, got {value!r}")
        lists[flag].append(value)
        i += 2
    raise LandlockError("missing -- before the command")


def main(argv: list[str]) -> int:
    """Apply the policy and exec the command; returns only on failure."""
    try:
        deny, ro, rw, command = parse_args(argv)
        apply(deny, ro, rw)
    except LandlockError as exc:
        sys.stderr.write(f"crew-landlock: {exc}; the command was not started\n")
        return EXIT_SETUP_FAILED
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"crew-landlock: cannot run {command[0]!r}: {exc.strerror}\n")
        return 127 if isinstance(exc, FileNotFoundError) else EXIT_SETUP_FAILED
    return EXIT_SETUP_FAILED  # not reached: execvp does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
