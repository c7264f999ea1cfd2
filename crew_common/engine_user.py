"""Which uid engines run as when the Computer runs as root (containers, VMs, CI).

uid 0 without capabilities still owns every root-owned file: an engine
running as root read `/etc/shadow` and 0600 files below `/root` (issue 20,
R21/R22). So a root launcher runs every engine as one dedicated system user,
`crew-engine` (`scripts/setup` creates it; `CREW_ENGINE_USER` names another).

Decision: one uid for all agents, not one per agent. Agents are already kept
apart by the sandbox (each sees only its own directories; other agents'
are masked in both Linux modes, and pid namespaces hide their processes), so
a per-agent uid would be a second layer, at the price of allocating uids that
stay stable with each agent's files and never collide with the host's users.
What the shared uid does not give: DAC between agents (a mask that fails
shows another agent's files readable), and `RLIMIT_NPROC` counted for all
agents together (the per-run cgroup's pids cap is the per-agent one).
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_ENGINE_USER = "crew-engine"
ENGINE_USER_ENV = "CREW_ENGINE_USER"


class EngineUserMissing(Exception):
    """Running as root, but the engine user does not exist; the message says how to add it."""


@dataclass(frozen=True)
class EngineIdentity:
    """The unprivileged user engines run as: its name, uid and primary gid."""

    name: str
    uid: int
    gid: int


def engine_identity(
    environ: Mapping[str, str] | None = None, euid: int | None = None
) -> EngineIdentity | None:
    """The engine user when this process is root; None when it is not (engines keep our uid).

    Raises `EngineUserMissing` when the user does not exist or is itself root.
    """
    environ = os.environ if environ is None else environ
    if (os.geteuid() if euid is None else euid) != 0:
        return None
    name = environ.get(ENGINE_USER_ENV) or DEFAULT_ENGINE_USER
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise EngineUserMissing(
            f"the Computer runs as root, and engines never run as root; the system user "
            f"{name!r} they run as does not exist: create it (as root: useradd --system "
            f"--user-group --no-create-home --shell /usr/sbin/nologin {name}; scripts/setup "
            f"does), or name another with {ENGINE_USER_ENV}, or run the Computer as an "
            "ordinary user"
        ) from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise EngineUserMissing(
            f"the engine user {name!r} has uid {entry.pw_uid} and gid {entry.pw_gid}; it must be "
            f"an unprivileged user (neither may be 0): set {ENGINE_USER_ENV} to another"
        )
    return EngineIdentity(name, entry.pw_uid, entry.pw_gid)
