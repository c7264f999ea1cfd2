"""Linux backend: bubblewrap, plus our Landlock helper in the default "hybrid" mode.

`bwrap_argv` is pure: policy in, argv out (table-tested). The design and the
measurements behind every flag are in research/sandbox.md §3.1:

- `--ro-bind / /` first (nothing writable, no chmod/chown/utime), then a
  private `--dev /dev` *before* the writable binds (a plain ro-bind makes
  device nodes `nodev`), a pid namespace with a fresh `/proc` (other
  processes' environ invisible; every process of the turn dies with it),
  `--die-with-parent`, and `--cap-drop ALL` (as root, without it the sandbox
  can unmount and remount its way out).
- The agent's temp dir is bound at `/tmp`: agents never share a `/tmp`.
- hybrid: `landlock_exec.py` applies Landlock (READ_FILE + REFER) inside
  bwrap just before exec; `stat` keeps working below `$HOME`.
- tmpfs: an empty tmpfs over each deny root with the allowlist bound back,
  then remounted read-only; hidden files are invisible to `stat` too.
- `env --ignore-signal=INT bwrap … -- env --default-signal=INT …`: a group
  SIGINT would otherwise kill bwrap's monitor, and `--die-with-parent` would
  SIGKILL the engine with no graceful stop.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from sandbox_launcher import landlock_exec
from sandbox_launcher.paths import is_inside
from sandbox_launcher.policy import SandboxPolicy

# Fixed places only: a bwrap found through PATH or the cwd could be anyone's.
BWRAP_CANDIDATES = ("/usr/bin/bwrap", "/bin/bwrap", "/usr/local/bin/bwrap")
ENV_CANDIDATES = ("/usr/bin/env", "/bin/env")
HOST_TMP = Path("/tmp")
PREFLIGHT_TIMEOUT_S = 10.0


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
    support_dirs: tuple[Path, ...] = ()  # what python needs, bound back if it lives in /tmp


def _find(candidates: tuple[str, ...], what: str, hint: str) -> str:
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise SandboxUnavailable(f"{what} not found (looked in {', '.join(candidates)}); {hint}")


def find_tools() -> BwrapTools:
    """Locate bwrap, env and the helper's interpreter at their absolute paths."""
    bwrap = _find(
        BWRAP_CANDIDATES, "bwrap", "install bubblewrap (Debian/Ubuntu: apt install bubblewrap)"
    )
    env = _find(ENV_CANDIDATES, "env", "install coreutils")
    python = os.path.realpath(sys.executable)
    prefix = Path(os.path.realpath(sys.base_prefix))
    helper = os.path.realpath(landlock_exec.__file__)
    return BwrapTools(bwrap, env, python, helper, (prefix, Path(helper).parent))


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


def bwrap_argv(
    policy: SandboxPolicy, mode: LinuxMode, tools: BwrapTools, command: list[str]
) -> list[str]:
    """The full argv that runs `command` under `policy`. Pure; nothing goes through a shell."""
    deny = policy.deny_roots
    reads = [*policy.read_dirs, *policy.read_files]
    argv = [tools.env, "--ignore-signal=INT", tools.bwrap]
    argv += ["--ro-bind", "/", "/", "--dev", "/dev"]
    argv += ["--unshare-pid", "--proc", "/proc", "--die-with-parent", "--cap-drop", "ALL"]
    # The private /tmp goes first: when $HOME itself lives below /tmp (tests,
    # odd setups) what the sandbox needs from there is bound back on top of it.
    argv += ["--bind", str(policy.tmp_dir), "/tmp"]
    if mode is LinuxMode.TMPFS:
        for root in deny:
            argv += ["--tmpfs", str(root)]
        shown = [p for p in reads if any(is_inside(p, r) for r in deny) or _under_host_tmp(p)]
    else:
        back = [r for r in deny if _under_host_tmp(r)]
        for root in back:
            argv += ["--ro-bind", str(root), str(root)]
        shown = [p for p in reads if _under_host_tmp(p) and not any(is_inside(p, r) for r in back)]
        shown += [p for p in tools.support_dirs if _under_host_tmp(p)]
    for path in shown:
        argv += ["--ro-bind", str(path), str(path)]
    for path in policy.writable_dirs:
        argv += ["--bind", str(path), str(path)]
    if mode is LinuxMode.TMPFS:
        # Writes to the tmpfs itself would be silently lost: make them EROFS.
        for root in deny:
            argv += ["--remount-ro", str(root)]
    else:
        # Landlock does not mediate connect() on Unix sockets: hide them.
        argv += ["--tmpfs", str(policy.sockets_dir)]
    argv += ["--chdir", str(policy.work_dir), "--", tools.env, "--default-signal=INT"]
    if mode is LinuxMode.HYBRID:
        argv += [tools.python, "-I", "-S", tools.helper]
        for root in deny:
            argv += ["--deny", str(root)]
        for path in reads:
            if any(is_inside(path, root) for root in deny):
                argv += ["--ro", str(path)]
        for path in policy.writable_dirs:
            argv += ["--rw", str(path)]
        argv.append("--")
    return argv + command


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
