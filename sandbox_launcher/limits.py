"""Per-run resource limits: processes, memory and `/dev/shm` (issue 12).

How each limit is enforced, best first:

- **A cgroup per run** when this machine gives the launcher one: cgroup v2
  with the `memory` and `pids` controllers available in the launcher's own
  cgroup (systemd `Delegate=yes`, a container with its own cgroup
  namespace), else — as root on a host that still mounts cgroup v1 — the v1
  `pids` and `memory` hierarchies. `pids.max` and the memory limit then cap
  the whole run (every process of the turn, whatever its uid, root too).
- **Otherwise rlimits only:** `RLIMIT_NPROC` (set by our helper; it counts
  per user namespace, and bwrap gives every run a fresh one, so it caps this
  run, but the kernel exempts uid 0) and **no memory limit**: Bun reserves
  ~72 GB of private writable mappings (`VmData` of an idle `opencode serve`),
  and `opencode --version` already fails under `RLIMIT_DATA` or `RLIMIT_AS`
  of 512 MiB, so a per-process cap that leaves OpenCode working caps nothing.
- `/dev/shm` is a tmpfs of `shm_bytes` in every case (bwrap `--size`).
- **Disk** (issue 20, K19: one agent filled 2 GiB of the user's disk in
  `work/`): `work/` must persist, so no size-capped tmpfs; this host's ext4
  is mounted without `prjquota` (and a project quota needs root and the
  quota feature), and a loop image per agent is heavy, so everywhere: the
  watch adds up the blocks of the agent's directory and its runtime
  directory every `DISK_INTERVAL_S` and ends the run at `disk_bytes`
  (`disk_limit`), and `RLIMIT_FSIZE` caps any one file at `disk_bytes`.
  Soft: between two looks a fast writer gets past the limit by what it
  writes in that time (`/health` says so); the next run of that agent
  starts over the limit and ends at once, other agents run on.

A limit that is hit ends the run: `ResourceWatch` looks every
`WATCH_INTERVAL_S` (cgroup event counters, else the number of tasks in the
run's pid namespace, and how full its `/dev/shm` is) and the run is killed
with a reason (`process_limit`, `memory_limit`, `shm_full`) that the Computer
turns into the `resource_limit` failure. A fork bomb would otherwise spin at
the limit until the turn's time limit, and a full `/dev/shm` holds its memory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

MIB = 1024 * 1024
WATCH_INTERVAL_S = 0.25
REMOVE_TIMEOUT_S = 5.0
LimitHit = Literal["process_limit", "memory_limit", "shm_full", "disk_limit"]
DISK_INTERVAL_S = 2.0  # a walk of the agent's tree: not every WATCH_INTERVAL_S
DISK_MAX_DEPTH = 256  # levels the walk opens at once (deeper ones are not counted)
DISK_NOTE = (
    "disk: each agent's directories are limited to {mib} MiB by a watch (every "
    f"{DISK_INTERVAL_S:.0f} s; no filesystem quota is used) and one file to the same by "
    "RLIMIT_FSIZE: a fast writer can go past it by what it writes between two looks"
)
CGROUP_PREFIX = "crew-"
# The failure line starts with "crew-cgroup: " so the Computer reads it as the sandbox's.
_JOIN_SCRIPT = (
    'while [ "$1" != -- ]; do { echo 0 > "$1"; } 2>/dev/null || '
    '{ echo "crew-cgroup: cannot join the run\'s cgroup ($1)" >&2; exit 126; }; '
    'shift; done; shift; exec "$@"'
)
SHELL = "/bin/sh"
DEFAULT_MAX_CONNECTIONS = 256  # TCP connections of one sandbox at a time (network.py)


@dataclass(frozen=True)
class TurnLimits:
    """What one run may use. Defaults: 4096 tasks (Bun alone starts ~30 threads), 4 GiB, 64 MiB."""

    max_processes: int = 4096  # processes and threads together
    memory_bytes: int = 4096 * MIB  # only where a cgroup is available
    shm_bytes: int = 64 * MIB  # as Docker's default
    disk_bytes: int = 10 * 1024 * MIB  # the agent's directories together (the watch)
    # TCP connections at a time, in the sandbox's own network (network.py's firewall).
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    def process_threshold(self) -> int:
        """How many tasks count as "the process limit was hit" where no cgroup counts for us."""
        return self.max_processes - max(4, self.max_processes // 64)


# ---- finding where run cgroups can go ----


@dataclass(frozen=True)
class CgroupParents:
    """Directories this launcher may create run cgroups in, per controller."""

    version: Literal[1, 2]
    pids: Path
    memory: Path


def parse_mounts(mountinfo: str) -> tuple[Path | None, dict[str, Path]]:
    """(the cgroup2 mount, {v1 controller: its mount}) from `/proc/self/mountinfo`. Pure."""
    v2: Path | None = None
    v1: dict[str, Path] = {}
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        point = Path(fields[4].replace("\\040", " "))
        if tail[0] == "cgroup2" and v2 is None:
            v2 = point
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                if option in ("pids", "memory"):
                    v1.setdefault(option, point)
    return v2, v1


def parse_self_cgroup(text: str) -> tuple[str | None, dict[str, str]]:
    """(the v2 path, {v1 controller: path}) from `/proc/self/cgroup`. Pure."""
    v2: str | None = None
    v1: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2 = path
        for name in controllers.split(","):
            if name in ("pids", "memory"):
                v1[name] = path
    return v2, v1


def _read(path: Path) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read()


def _write(path: Path, text: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


def v2_parents(mount: Path, own: str) -> CgroupParents | None:
    """Our v2 cgroup, made able to hold run cgroups with memory and pids; None if not delegated.

    The "no internal processes" rule: a cgroup that hands controllers to its
    children holds no processes itself, so the launcher first moves itself
    into a `crew-launcher` leaf beside the runs.
    """
    base = mount / own.lstrip("/")
    try:
        available = _read(base / "cgroup.controllers").split()
        if not {"memory", "pids"} <= set(available):
            return None
        enabled = _read(base / "cgroup.subtree_control").split()
        if not {"memory", "pids"} <= set(enabled):
            leaf = base / f"{CGROUP_PREFIX}launcher"
            leaf.mkdir(exist_ok=True)
            _write(leaf / "cgroup.procs", "0")
            _write(base / "cgroup.subtree_control", "+memory +pids")
    except OSError as exc:
        log.info("cgroup v2 at %s is not delegated to us (%s)", base, exc.strerror)
        return None
    return CgroupParents(2, base, base)


def _v1_parents(mounts: dict[str, Path], own: dict[str, str]) -> CgroupParents | None:
    places: dict[str, Path] = {}
    for controller in ("pids", "memory"):
        if controller not in mounts or controller not in own:
            return None
        place = mounts[controller] / own[controller].lstrip("/")
        if not os.access(place, os.W_OK | os.X_OK):
            return None
        places[controller] = place
    return CgroupParents(1, places["pids"], places["memory"])


def find_cgroup_parents() -> CgroupParents | None:
    """Where run cgroups go on this machine (v2 delegated, else writable v1), or None."""
    try:
        mountinfo = _read(Path("/proc/self/mountinfo"))
        membership = _read(Path("/proc/self/cgroup"))
    except OSError:
        return None
    v2_mount, v1_mounts = parse_mounts(mountinfo)
    v2_path, v1_paths = parse_self_cgroup(membership)
    if v2_mount is not None and v2_path is not None:
        parents = v2_parents(v2_mount, v2_path)
        if parents is not None:
            return parents
    return _v1_parents(v1_mounts, v1_paths)


# ---- one run's cgroup ----


def _counter(text: str, key: str) -> int:
    """`key N` out of a flat keyed file (`pids.events`, `memory.events`, v1 `oom_control`)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


@dataclass(frozen=True)
class RunCgroup:
    """The cgroup(s) of one run: created before it starts, removed after it ended."""

    version: Literal[1, 2]
    pids: Path
    memory: Path

    @classmethod
    def create(cls, parents: CgroupParents, name: str, limits: TurnLimits) -> RunCgroup:
        """Make the run's cgroup and set its limits; raises OSError when it cannot."""
        group = cls(parents.version, parents.pids / name, parents.memory / name)
        try:
            for directory in dict.fromkeys((group.pids, group.memory)):
                directory.mkdir()
            _write(group.pids / "pids.max", str(limits.max_processes))
            if parents.version == 2:
                _write(group.memory / "memory.max", str(limits.memory_bytes))
                with contextlib.suppress(OSError):  # no swap accounting: nothing to cap
                    _write(group.memory / "memory.swap.max", "0")
            else:
                _write(group.memory / "memory.limit_in_bytes", str(limits.memory_bytes))
        except OSError:
            group.remove()
            raise
        return group

    def join_prefix(self) -> list[str]:
        """An argv prefix that moves the process into this cgroup, then execs the rest.

        `sh` writes `0` (itself) into each `cgroup.procs` and execs: every
        process the run starts is born inside. The paths are arguments, never
        part of the script text.
        """
        procs = [str(d / "cgroup.procs") for d in dict.fromkeys((self.pids, self.memory))]
        return [SHELL, "-c", _JOIN_SCRIPT, "sh", *procs, "--"]

    def hit(self) -> LimitHit | None:
        """Which limit the run has run into so far, if any."""
        try:
            if self.version == 2:
                oom = _counter(_read(self.memory / "memory.events"), "oom_kill")
            else:
                oom = _counter(_read(self.memory / "memory.oom_control"), "oom_kill")
            forks_refused = _counter(_read(self.pids / "pids.events"), "max")
        except OSError:
            return None
        if oom:
            return "memory_limit"
        if forks_refused:
            return "process_limit"
        return None

    def remove(self) -> None:
        """Kill what is left inside and remove the directories (logged, never raised).

        Blocking, up to `REMOVE_TIMEOUT_S`: a process killed at the memory limit
        takes a while to give its memory back, and its cgroup stays busy meanwhile.
        """
        deadline = time.monotonic() + REMOVE_TIMEOUT_S
        for directory in dict.fromkeys((self.pids, self.memory)):
            pause = 0.0
            while directory.is_dir():
                try:
                    directory.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        log.warning("could not remove the run cgroup %s", directory)
                        break
                    _kill_members(directory)
                    time.sleep(pause)  # the killed are still dying: let them finish
                    pause = min(pause * 2 or 0.001, 0.05)


def _kill_members(directory: Path) -> None:
    try:
        pids = [int(p) for p in _read(directory / "cgroup.procs").split()]
    except OSError:
        return
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, 9)


# ---- watching a run ----


def sandbox_init(leader: int) -> int | None:
    """The first child of bwrap (`leader`): pid 1 of the run's pid namespace."""
    try:
        children = _read(Path(f"/proc/{leader}/task/{leader}/children")).split()
    except OSError:
        return None
    return int(children[0]) if children else None


def count_tasks(proc: str) -> int:
    """Processes and threads under a procfs (`proc`): the run's own, seen through its root."""
    total = 0
    try:
        entries = os.listdir(proc)
    except OSError:
        return 0
    for entry in entries:
        if entry.isdigit():
            try:
                total += max(os.stat(f"{proc}/{entry}/task").st_nlink - 2, 1)
            except OSError:
                continue  # gone meanwhile
    return total


def shm_full(root: str) -> bool:
    """Whether the run's `/dev/shm` (seen through its root) has no free block left."""
    try:
        fs = os.statvfs(f"{root}/dev/shm")
    except OSError:
        return False
    return fs.f_blocks > 0 and fs.f_bavail == 0


def disk_usage(dirs: tuple[Path, ...], stop_at: int) -> int:
    """Bytes allocated below `dirs` (st_blocks), counted until `stop_at` is reached.

    The agent can write these trees: every level is opened with O_NOFOLLOW below
    its parent's fd (one fd per level open at a time, `DISK_MAX_DEPTH` levels at
    most), symlinks count as themselves, a hard link once per name.
    """
    total = 0
    for top in dirs:
        try:
            fd = os.open(top, _DIR_FLAGS)
        except OSError:
            continue  # repaired before the next run
        stack = [(fd, os.scandir(fd))]
        try:
            while stack and total < stop_at:
                dfd, entries = stack[-1]
                entry = next(entries, None)
                if entry is None:
                    entries.close()
                    os.close(dfd)
                    stack.pop()
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone meanwhile
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode) and len(stack) < DISK_MAX_DEPTH:
                    try:
                        child = os.open(entry.name, _DIR_FLAGS, dir_fd=dfd)
                        stack.append((child, os.scandir(child)))
                    except OSError:
                        continue  # replaced by a link meanwhile: not followed
        finally:
            for dfd, entries in stack:
                entries.close()
                os.close(dfd)
    return total


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class ResourceWatch:
    """Looks at one run's use of its limits; `hit` says which one it ran into."""

    limits: TurnLimits
    cgroup: RunCgroup | None
    leader: int
    init: int | None = None
    # The agent's directory and runtime directory: their blocks count against disk_bytes.
    disk_dirs: tuple[Path, ...] = ()
    _disk_next: float = 0.0

    def hit(self) -> LimitHit | None:
        """The limit the run hit, if any. Cheap enough to call every `WATCH_INTERVAL_S`."""
        if self.cgroup is not None:
            verdict = self.cgroup.hit()
            if verdict is not None:
                return verdict
        if self.init is None:
            self.init = sandbox_init(self.leader)
            if self.init is None:
                return None
        root = f"/proc/{self.init}/root"
        if shm_full(root):
            return "shm_full"
        if self.disk_dirs and time.monotonic() >= self._disk_next:
            self._disk_next = time.monotonic() + DISK_INTERVAL_S
            if disk_usage(self.disk_dirs, self.limits.disk_bytes) >= self.limits.disk_bytes:
                return "disk_limit"
        if self.cgroup is None and count_tasks(f"{root}/proc") >= self.limits.process_threshold():
            return "process_limit"
        return None
