"""An ordinary user the tests make (as root) to run sandboxes unprivileged.

Not `nobody`: on a real machine other services may run as it, and whatever a
test left behind would be theirs. The user `crew-sbx-<pid>` (uid = gid, a group
of its own, no home, no login shell) is made once per test session and removed
when the session ends; one a killed session left (its pid gone) is removed
when the next session makes its own. Two sessions at once each have their own.
"""

from __future__ import annotations

import atexit
import functools
import grp
import os
import pwd
import shutil
import subprocess

from tests.support.ci import required_in_ci

PREFIX = "crew-sbx-"
# Searched downwards for an id free as both uid and gid (below `nobody`'s 65534).
FIRST_ID = 64_990
LAST_ID = 60_000


def _exists(lookup: object, ident: int) -> bool:
    try:
        lookup(ident)  # type: ignore[operator]
    except KeyError:
        return False
    return True


def _remove(name: str) -> None:
    subprocess.run(["userdel", name], capture_output=True, check=False)
    subprocess.run(["groupdel", name], capture_output=True, check=False)


def _remove_stale() -> None:
    """Users of sessions that ended without removing theirs."""
    for entry in pwd.getpwall():
        pid = entry.pw_name.removeprefix(PREFIX)
        if (
            entry.pw_name.startswith(PREFIX)
            and pid.isdigit()
            and not os.path.exists(f"/proc/{pid}")
        ):
            _remove(entry.pw_name)


@functools.cache
def unprivileged_uid() -> int:
    """This session's test user's uid (its gid is the same); made on first use. Root only."""
    if shutil.which("useradd") is None or shutil.which("groupadd") is None:
        required_in_ci("useradd and groupadd (Debian package passwd)")
    _remove_stale()
    name = f"{PREFIX}{os.getpid()}"
    ident = next(
        n
        for n in range(FIRST_ID, LAST_ID, -1)
        if not _exists(pwd.getpwuid, n) and not _exists(grp.getgrgid, n)
    )
    atexit.register(_remove, name)
    subprocess.run(["groupadd", "--gid", str(ident), name], check=True, capture_output=True)
    subprocess.run(
        ["useradd", "--uid", str(ident), "--gid", str(ident), "--no-create-home",
         "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return ident
