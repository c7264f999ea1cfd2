"""Linux backend: bubblewrap, plus our Landlock helper in the default "hybrid" mode.

`bwrap_argv` is pure: policy in, argv out (table-tested). The design and the
measurements behind every flag are in research/sandbox.md §3.1:

- `--ro-bind / /` first (nothing writable, no chmod/chown/utime), then a
  private `--dev /dev` *before* the writable binds (a plain ro-bind makes
  device nodes `nodev`), a pid namespace with a fresh `/proc` (other
  processes' environ invisible; every process of the turn dies with it),
  `--die-with-parent`, and `--cap-drop ALL` (as root, without it the sandbox
  can unmount and remount its way out).
- The agent's temp dir is bound at `/tmp`: agents never share a `/tmp`. A
  `$HOME` or crew home below the host's `/tmp` (the demo, tests) is then not
  visible in the sandbox beyond what the run needs, in both modes.
- hybrid: `landlock_exec.py` applies Landlock (READ_FILE + REFER) inside
  bwrap just before exec; `stat` keeps working below `$HOME`.
- tmpfs: an empty tmpfs over each deny root with the allowlist bound back,
  then remounted read-only; hidden files are invisible to `stat` too.
- `env --ignore-signal=INT bwrap … -- env --default-signal=INT …`: a group
  SIGINT would otherwise kill bwrap's monitor, and `--die-with-parent` would
  SIGKILL the engine with no graceful stop.

Against the escapes of issue 12:

- An ordinary caller's run gets its own user namespace (`--unshare-user`)
  and keeps the caller's uid. A root caller's engine never runs as uid 0
  (issue 20: uid 0 without capabilities still read `/etc/shadow` and 0600
  files below `/root`): bwrap runs as root without a user namespace (it
  can reach every path it binds), keeps only CAP_SETUID/SETGID/SETPCAP/DAC_READ_SEARCH,
  and `setpriv` drops to the engine user (`crew_common.engine_user`) with
  no groups, an empty bounding set and no inheritable capabilities before
  our helper runs (`engine_ids`). That uid must reach what it is given:
  every level it could not search (`/root` 0700 above a pyenv Python, a
  0700 `$HOME`) and the deny roots become empty tmpfs with the allowlist
  bound back, in both modes (`hidden_roots`); the launcher hands the
  agent's directories to that uid before each run (`ownership.py`).
  `RLIMIT_NPROC` would count every agent's processes together for the one
  uid: not set then (the run's cgroup caps its pids). Still read-only by
  mode bits for root's sake: `/proc/sys`, `/proc/sysrq-trigger` and the
  other writable `/proc` entries (`PROC_READ_ONLY`), `/sys` and `/` (the ro
  bind), `/dev` (remounted read-only; only a size-capped `/dev/shm` is
  writable); no nested user namespaces (seccomp).
- The host's Unix sockets: the helper's seccomp filter refuses
  `socket(AF_UNIX)` (`sandbox_launcher.seccomp`), and the well-known socket
  places (`HOST_SOCKET_PLACES`: `/run/user`, D-Bus, docker, podman…) are
  masked as well.
- `--unshare-ipc`: no SysV shared memory, semaphores or POSIX message
  queues of the host.
- Our helper (`landlock_exec.py`) runs in both modes: rlimits (a process
  cap per run) and seccomp in both, Landlock in hybrid.
- `$SHELL` is the tool shell (`sandbox_launcher.tool_shell`): every tool the
  engine starts through it gets a Landlock domain nested in the engine's, so
  no tool can open the engine's `/proc/<pid>/mem`, ptrace or signal it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from sandbox_launcher import landlock_exec
from sandbox_launcher.landlock import TOOL_DOMAIN_MARKER
from sandbox_launcher.paths import is_inside
from sandbox_launcher.policy import SandboxPolicy
from sandbox_launcher.tool_shell import engine_bin_dir, tool_shell_path

# Fixed places only: a bwrap found through PATH or the cwd could be anyone's.
BWRAP_CANDIDATES = ("/usr/bin/bwrap", "/bin/bwrap", "/usr/local/bin/bwrap")
ENV_CANDIDATES = ("/usr/bin/env", "/bin/env")
SETPRIV_CANDIDATES = ("/usr/bin/setpriv", "/bin/setpriv")
# What bwrap keeps for setpriv when it drops to the engine user (root callers only);
# DAC_READ_SEARCH: bwrap's `--chdir` into the work dir the engine user owns (0700).
SETPRIV_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_DAC_READ_SEARCH")
HOST_TMP = Path("/tmp")
PREFLIGHT_TIMEOUT_S = 10.0
# Entries of a fresh /proc that uid 0 may write by their mode bits (found with
# `find /proc -writable` as root in a sandbox); bound read-only when present.
PROC_READ_ONLY = (
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/irq",
    "/proc/bus",
    "/proc/mtrr",
    "/proc/pressure",
    "/proc/fs",
    "/proc/acpi",
    "/proc/scsi",
    "/proc/driver",
    "/proc/timer_list",
)
# Where hosts keep Unix sockets of more privileged services; masked when they exist.
HOST_SOCKET_PLACES = (
    "/run/user",
    "/run/dbus",
    "/run/docker.sock",
    "/run/docker",
    "/run/podman",
    "/run/containerd",
    "/run/snapd.socket",
    "/run/snapd-snap.socket",
    "/run/systemd/private",
    "/run/systemd/userdb",
    "/var/run/docker.sock",
)
DEV_SHM_BYTES = 64 * 1024 * 1024  # as Docker's default
NPROC_LIMIT = 4096  # processes and threads of one run (Bun alone starts ~30 threads)


class LinuxMode(StrEnum):
    """How file contents below `$HOME` are hidden."""

    HYBRID = "hybrid"
    TMPFS = "tmpfs"


class SandboxUnavailable(Exception):
    """The sandbox cannot be used on this machine; the message says what to do."""


@dataclass(frozen=True)
class BwrapTools:
    """Absolute paths of the programs the argv names, fixed at launcher start."""

    bwrap: str
    env: str
    python: str  # runs the Landlock helper (hybrid)
    helper: str  # landlock_exec.py
    support_dirs: tuple[Path, ...] = ()  # what python needs, bound back if hidden
    tmpfs_size: bool = True  # bwrap ≥ 0.8.0 understands --size
    socket_dirs: tuple[Path, ...] = ()  # HOST_SOCKET_PLACES present here: directories
    socket_files: tuple[Path, ...] = ()  # … and single sockets
    nproc: int = NPROC_LIMIT  # tests use a small one
    shm_bytes: int = DEV_SHM_BYTES  # the size of the run's /dev/shm (limits.TurnLimits)
    # The tool shells (`sandbox_launcher.tool_shell`): each sandbox's $SHELL. None: no
    # $SHELL, so tools share the engine's Landlock domain (a kernel without Landlock).
    tool_shells: Path | None = None
    # A root caller's engine user (uid, gid): bwrap runs as root, setpriv drops to it.
    engine_ids: tuple[int, int] | None = None
    setpriv: str = "/usr/bin/setpriv"
    fsize: int | None = None  # RLIMIT_FSIZE of every process: the agent's disk (limits.py)


def find_program(candidates: tuple[str, ...], what: str, hint: str) -> str:
    """The first executable of `candidates` (fixed places only); else `SandboxUnavailable`."""
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise SandboxUnavailable(f"{what} not found (looked in {', '.join(candidates)}); {hint}")


def find_tools() -> BwrapTools:
    """Locate bwrap, env and the helper's interpreter at their absolute paths."""
    bwrap = find_program(
        BWRAP_CANDIDATES, "bwrap", "install bubblewrap (Debian/Ubuntu: apt install bubblewrap)"
    )
    env = find_program(ENV_CANDIDATES, "env", "install coreutils")
    python = os.path.realpath(sys.executable)
    prefix = Path(os.path.realpath(sys.base_prefix))
    helper = os.path.realpath(landlock_exec.__file__)
    dirs, files = host_socket_places()
    return BwrapTools(
        bwrap,
        env,
        python,
        helper,
        (prefix, Path(helper).parent),
        tmpfs_size=bwrap_version(bwrap) >= (0, 8, 0),
        socket_dirs=dirs,
        socket_files=files,
    )


def bwrap_version(bwrap: str) -> tuple[int, ...]:
    """`bwrap --version` as numbers; (0,) when it cannot be read."""
    try:
        done = subprocess.run(
            [bwrap, "--version"],
            capture_output=True,
            text=True,
            timeout=PREFLIGHT_TIMEOUT_S,
            env={"PATH": "/usr/bin:/bin"},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return (0,)
    words = done.stdout.split()
    try:
        return tuple(int(part) for part in words[-1].split("."))
    except (IndexError, ValueError):
        return (0,)


def host_socket_places() -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """The `HOST_SOCKET_PLACES` on this machine, resolved: (directories, other entries)."""
    dirs: list[Path] = []
    files: list[Path] = []
    for place in HOST_SOCKET_PLACES:
        path = Path(os.path.realpath(place))
        if not os.path.lexists(path) or path in dirs or path in files:
            continue
        (dirs if path.is_dir() else files).append(path)
    return tuple(dirs), tuple(files)


def choose_mode(requested: LinuxMode | None, abi: int) -> LinuxMode:
    """hybrid when Landlock ABI ≥ 2, else tmpfs; a requested hybrid needs ABI ≥ 2."""
    if requested is LinuxMode.TMPFS:
        return LinuxMode.TMPFS
    if abi >= 2:
        return LinuxMode.HYBRID
    if requested is LinuxMode.HYBRID:
        raise SandboxUnavailable(
            f"hybrid mode needs Landlock ABI 2 or newer, this kernel has {abi}; "
            "start the launcher with --mode tmpfs (or upgrade to Linux 5.19+)"
        )
    return LinuxMode.TMPFS


def _under_host_tmp(path: Path) -> bool:
    return is_inside(path, HOST_TMP)


def _masked(places: tuple[Path, ...], policy: SandboxPolicy) -> list[Path]:
    """The places to mask, less any that holds a path the run needs (a home under /run/user)."""
    needed = [policy.home, policy.crew_home, policy.work_dir, *policy.writable_dirs]
    needed += [*policy.read_dirs, *policy.read_files]
    return [p for p in places if not any(is_inside(n, p) for n in needed)]


def bwrap_argv(
    policy: SandboxPolicy,
    mode: LinuxMode,
    tools: BwrapTools,
    command: list[str],
    aliases: tuple[tuple[Path, bool], ...] = (),
    unreachable: tuple[Path, ...] = (),
) -> list[str]:
    """The full argv that runs `command` under `policy`. Pure; nothing goes through a shell.

    `aliases`: other mounts showing what lies below a deny root (`mounts.alias_masks`),
    each with "is a directory"; masked in both modes. `unreachable`: directories the
    engine user cannot search (`unreachable_levels`), hidden as deny roots are in tmpfs mode.
    """
    as_engine = tools.engine_ids is not None
    deny = policy.deny_roots
    # Hidden by a tmpfs, the allowlist bound back: in tmpfs mode, and for the engine user.
    hidden = hidden_roots(deny, unreachable) if as_engine or mode is LinuxMode.TMPFS else ()
    # Hybrid without them: a deny root below the host's /tmp is hidden the same way.
    tmp_roots = [] if hidden else [r for r in deny if _under_host_tmp(r)]
    reads = [*policy.read_dirs, *policy.read_files]
    argv = [tools.env, "--ignore-signal=INT", tools.bwrap]
    argv += ["--unshare-ipc"] if as_engine else ["--unshare-user", "--unshare-ipc"]
    argv += ["--ro-bind", "/", "/", "--dev", "/dev"]
    if tools.tmpfs_size:
        argv += ["--size", str(tools.shm_bytes)]
    argv += ["--perms", "1777", "--tmpfs", "/dev/shm"]  # as /dev/shm is: for any uid
    argv += ["--unshare-pid", "--proc", "/proc"]
    for entry in PROC_READ_ONLY:
        argv += ["--ro-bind-try", entry, entry]
    argv += ["--die-with-parent", "--cap-drop", "ALL"]
    if as_engine:
        for cap in SETPRIV_CAPS:
            argv += ["--cap-add", cap]
    # The private /tmp goes first: when $HOME itself lives below /tmp (tests,
    # odd setups) what the sandbox needs from there is bound back on top of it.
    argv += ["--bind", str(policy.tmp_dir), "/tmp"]
    socket_dirs = _masked(tools.socket_dirs, policy)
    for place in socket_dirs:
        argv += ["--tmpfs", str(place)]
    for place in _masked(tools.socket_files, policy):
        argv += ["--ro-bind", "/dev/null", str(place)]
    # Under the host's /tmp they are hidden by the private one already.
    shown_aliases = [(p, d) for p, d in aliases if not _under_host_tmp(p)]
    alias_dirs = _masked(tuple(p for p, is_dir in shown_aliases if is_dir), policy)
    for alias in alias_dirs:
        argv += ["--tmpfs", str(alias)]
    for alias in _masked(tuple(p for p, is_dir in shown_aliases if not is_dir), policy):
        argv += ["--ro-bind", "/dev/null", str(alias)]
    # The helper's interpreter and package, wherever they are hidden; never one
    # that would bring a whole deny root back.
    support = [p for p in _support_dirs(tools) if not any(is_inside(r, p) for r in deny)]
    # bwrap (root) makes missing mount points 0700: the engine user could not pass them.
    made: set[Path] = set()
    containers = (*hidden, HOST_TMP) if as_engine else ()
    if hidden:
        for root in hidden:
            argv += _levels_to(root, containers, made)
            argv += ["--tmpfs", str(root)]
        shown = [p for p in reads if any(is_inside(p, r) for r in hidden) or _under_host_tmp(p)]
        shown += [p for p in support if any(is_inside(p, r) for r in hidden) or _under_host_tmp(p)]
    else:
        # A deny root below the host's /tmp is not bound back whole (issue 20): the
        # private /tmp needs a Landlock grant of its own (what a tool writes there is
        # unreadable otherwise: it is an ancestor of the deny root, not a sibling), and
        # that grant would reach everything mounted below it. So, as in tmpfs mode,
        # only what the run needs from there is bound back (`stat` sees no more of it),
        # on a read-only tmpfs: the private /tmp below it is writable.
        for root in tmp_roots:
            argv += ["--tmpfs", str(root)]
        shown = [p for p in reads if _under_host_tmp(p)]
        shown += [p for p in support if _under_host_tmp(p)]
    for path in shown:
        argv += _levels_to(path, containers, made)
        argv += ["--ro-bind", str(path), str(path)]
    for path in policy.writable_dirs:
        argv += _levels_to(path, containers, made)
        argv += ["--bind", str(path), str(path)]
    # Writes to a tmpfs of ours would be lost, or fill memory: make them EROFS.
    covering = hidden or tmp_roots
    for root in covering:
        argv += ["--remount-ro", str(root)]
    if not any(is_inside(policy.sockets_dir, r) for r in covering):
        # Landlock does not mediate connect() on Unix sockets: hide them (below a
        # hidden root they are hidden with it).
        argv += ["--tmpfs", str(policy.sockets_dir), "--remount-ro", str(policy.sockets_dir)]
    for place in [*socket_dirs, *alias_dirs]:
        argv += ["--remount-ro", str(place)]
    argv += ["--remount-ro", "/dev"]
    argv += tool_shell_args(tools, mode)
    argv += ["--chdir", str(policy.work_dir), "--", tools.env, "--default-signal=INT"]
    argv += setpriv_args(tools)
    argv += [tools.python, "-I", "-S", tools.helper, "--seccomp"]
    if not as_engine:
        argv += ["--nproc", str(tools.nproc)]
    if tools.fsize is not None:
        argv += ["--fsize", str(tools.fsize)]
    if tools.tool_shells is not None:
        # The engine's own git and rg before anything on its PATH (`tool_shell`).
        argv += ["--path-first", str(engine_bin_dir(tools.tool_shells, mode.value))]
    if mode is LinuxMode.HYBRID:
        for root in deny:
            argv += ["--deny", str(root)]
        for path in reads:
            if any(is_inside(path, root) for root in deny):
                argv += ["--ro", str(path)]
        for path in policy.writable_dirs:
            argv += ["--rw", str(path)]
        if any(_under_host_tmp(r) for r in deny):
            # The private /tmp: nothing of the host's is there (the deny roots below it
            # are hidden on read-only tmpfs, by `tmp_roots` or `hidden`).
            argv += ["--rw", str(HOST_TMP)]
        if tools.tool_shells is not None:
            # The tool shell runs inside the engine's domain: its interpreter must be readable.
            for path in support:
                if any(is_inside(path, root) for root in deny):
                    argv += ["--ro", str(path)]
    argv.append("--")
    return argv + command


def setpriv_args(tools: BwrapTools) -> list[str]:
    """Drop from root to the engine user before anything of the run executes (root callers).

    setuid to a non-zero uid clears the permitted and effective sets; the bounding
    and inheritable sets are emptied too, so nothing can come back by an exec.
    """
    if tools.engine_ids is None:
        return []
    uid, gid = tools.engine_ids
    argv = [tools.setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    return [*argv, "--inh-caps=-all", "--bounding-set=-all", "--"]


def _levels_to(path: Path, containers: tuple[Path, ...], made: set[Path]) -> list[str]:
    """`--dir` (0755) for each level between the innermost container holding `path` and it."""
    holders = [c for c in containers if c != path and is_inside(path, c)]
    if not holders:
        return []
    top = max(holders, key=lambda c: len(c.parts))
    args: list[str] = []
    for level in [*reversed(path.parents)]:
        if len(level.parts) > len(top.parts) and level not in made:
            made.add(level)
            args += ["--dir", str(level)]
    return args


def hidden_roots(deny: tuple[Path, ...], unreachable: tuple[Path, ...]) -> tuple[Path, ...]:
    """The deny roots and the unreachable levels, without one lying inside another. Pure.

    Below the host's /tmp nothing needs hiding: the private /tmp replaces it already.
    """
    candidates = [*deny, *(p for p in unreachable if not _under_host_tmp(p))]
    kept = [p for p in candidates if not any(q != p and is_inside(p, q) for q in candidates)]
    return tuple(dict.fromkeys(kept))


def can_search(st: os.stat_result, uid: int, gid: int) -> bool:
    """May `uid` (primary group `gid`, no others) search this directory by its mode bits? Pure."""
    if st.st_uid == uid:
        return bool(st.st_mode & 0o100)
    if st.st_gid == gid:
        return bool(st.st_mode & 0o010)
    return bool(st.st_mode & 0o001)


def unreachable_levels(paths: list[Path], ids: tuple[int, int]) -> tuple[Path, ...]:
    """For each path, the highest level above it the engine user cannot search (a stat a level)."""
    found: list[Path] = []
    for path in paths:
        for level in [*reversed(path.parents)][1:]:
            if any(is_inside(level, f) for f in found):
                break
            try:
                st = os.stat(level)
            except OSError:
                break  # gone: bwrap says so when it binds
            if not can_search(st, *ids):
                found.append(level)
                break
    return tuple(found)


def reachable_needed(policy: SandboxPolicy, tools: BwrapTools) -> list[Path]:
    """Every path of a run the engine user must get to: what is bound, and the helper's own."""
    return [
        *policy.read_dirs,
        *policy.read_files,
        *policy.writable_dirs,
        policy.work_dir,
        *_support_dirs(tools),
        Path(tools.python),
        Path(tools.helper),
    ]


def _support_dirs(tools: BwrapTools) -> list[Path]:
    """What the helper and the tool shell need inside: interpreter, package, the shells."""
    shells = [tools.tool_shells] if tools.tool_shells is not None else []
    return [*tools.support_dirs, *shells]


def tool_shell_args(tools: BwrapTools, mode: LinuxMode) -> list[str]:
    """`$SHELL` = the tool shell of `mode`, so every tool gets a Landlock domain of its own.

    The marker that says "already nested" never reaches an engine: its tools would not nest.
    """
    if tools.tool_shells is None:
        return []
    shell = tool_shell_path(tools.tool_shells, mode.value)
    return ["--unsetenv", TOOL_DOMAIN_MARKER.decode(), "--setenv", "SHELL", str(shell)]


_USERNS_MARKERS = (
    "setting up uid map: Permission denied",
    "No permissions to create a new namespace",
    "Creating new namespace failed",
    "loopback: Failed RTM_NEWADDR",
)
_MOUNT_MARKERS = ("Failed to make / slave", "pivot_root", "fchdir to oldroot", "Can't mount proc")


def preflight_reason(returncode: int, stderr: str) -> str | None:
    """Map the outcome of `bwrap --unshare-user --ro-bind / / true` to an actionable reason."""
    if returncode == 0:
        return None
    text = stderr.strip() or f"exit status {returncode}"
    first = text.splitlines()[0]
    if any(marker in text for marker in _USERNS_MARKERS):
        return (
            f"bwrap cannot create user namespaces ({first}); allow unprivileged user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04+ "
            "kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for bwrap)"
        )
    if any(marker in text for marker in _MOUNT_MARKERS):
        return (
            f"bwrap cannot set up its mounts here ({first}); inside a container, allow "
            "mount namespaces (e.g. run it privileged) or run the Computer on the host"
        )
    return f"bwrap does not work on this machine ({first}); check the bubblewrap installation"


def preflight(tools: BwrapTools) -> str | None:
    """Run bwrap once with the least it needs; None when it works, else the reason."""
    argv = [tools.bwrap, "--unshare-user", "--ro-bind", "/", "/", "true"]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=PREFLIGHT_TIMEOUT_S,
            env={"PATH": "/usr/bin:/bin"},
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"bwrap did not finish its preflight in {PREFLIGHT_TIMEOUT_S:.0f} s"
    except OSError as exc:
        return f"bwrap cannot be started: {exc.strerror}"
    return preflight_reason(done.returncode, done.stderr)
