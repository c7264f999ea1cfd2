"""The self-test catches broken sandboxes (negative controls) and passes the real ones."""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from crew_common.egress import EgressPolicy
from sandbox_launcher.backend import BwrapBackend, open_backend
from sandbox_launcher.bwrap import LinuxMode
from sandbox_launcher.network import NetworkPlan, SandboxNetwork
from sandbox_launcher.policy import SandboxPolicy
from sandbox_launcher.selftest import self_test
from tests.support.ci import required_in_ci

# `$SHELL` replaced: a shell that does not nest a tool domain, one that runs nothing.
TOOL_SHELL_EDITS = {"tool_shell_not_nested": "/bin/bash", "tool_shell_broken": "/bin/false"}


@dataclass(frozen=True)
class Rewired:
    """A backend whose argv is the real one, edited: a deliberately broken sandbox."""

    inner: BwrapBackend | None
    edit: str
    name: Literal["bwrap", "seatbelt"] = "bwrap"
    mode: Literal["hybrid", "tmpfs"] | None = "tmpfs"

    @property
    def engine_ids(self) -> tuple[int, int] | None:
        return self.inner.engine_ids if self.inner is not None else None

    def argv(
        self, policy: SandboxPolicy, command: list[str], plan: NetworkPlan | None = None
    ) -> list[str]:
        if self.edit == "unsandboxed":
            return command
        if self.edit == "fails_to_start":
            return [
                "/bin/sh",
                "-c",
                "echo 'bwrap: setting up uid map: Permission denied' >&2; exit 1",
            ]
        assert self.inner is not None
        argv = self.inner.argv(policy, command)
        if self.edit == "home_not_hidden":
            pairs = list(itertools.pairwise(argv))
            i = pairs.index(("--tmpfs", str(policy.home)))
            j = pairs.index(("--remount-ro", str(policy.home)))
            return argv[:i] + argv[i + 2 : j] + argv[j + 2 :]
        if self.edit == "sysctl_writable":
            i = argv.index("/proc/sys")
            return argv[: i - 1] + argv[i + 2 :]
        if self.edit == "unix_sockets_open":
            return [a for a in argv if a != "--seccomp"]
        if self.edit == "datagram_pairs_open":
            # The filter of before issue 20: socket(AF_UNIX) refused, any socketpair allowed.
            helper = old_filter_helper(Path(argv[argv.index("--seccomp") - 1]))
            return [str(helper) if a.endswith("landlock_exec.py") else a for a in argv]
        if self.edit == "root_writable":
            i = argv.index("--chdir")
            return [*argv[:i], "--bind", "/var/tmp", "/var/tmp", *argv[i:]]
        if self.edit == "shared_network":
            return argv  # the argv is fine; `network` gives none
        if self.edit == "stays_root":
            # Without setpriv a root launcher's sandbox would run as uid 0 (issue 20).
            i = argv.index("/usr/bin/setpriv")
            return argv[:i] + argv[argv.index("--", i) + 1 :]
        if self.edit in TOOL_SHELL_EDITS:
            i = argv.index("SHELL", argv.index("--setenv"))
            return [*argv[: i + 1], TOOL_SHELL_EDITS[self.edit], *argv[i + 2 :]]
        raise AssertionError(self.edit)

    def egress_refusal(self, egress: EgressPolicy) -> str | None:
        return None

    def network(self, plan: NetworkPlan) -> SandboxNetwork | None:
        if self.edit in ("unsandboxed", "fails_to_start", "shared_network"):
            return None
        assert self.inner is not None
        return self.inner.network(plan)


def old_filter_helper(helper: Path) -> Path:
    """A copy of the helper's package in /var/tmp (visible in every sandbox) whose
    seccomp filter allows datagram socketpairs; removed with the test's /var/tmp home."""
    copy = Path(tempfile.mkdtemp(prefix="crew-selftest-old-filter-", dir="/var/tmp"))
    copy.chmod(0o755)
    package = copy / "sandbox_launcher"
    shutil.copytree(helper.parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    seccomp_py = package / "seccomp.py"
    text = seccomp_py.read_text()
    assert "ALLOWED_PAIR_TYPES = (SOCK_STREAM, SOCK_SEQPACKET)" in text
    seccomp_py.write_text(text.replace("(SOCK_STREAM, SOCK_SEQPACKET)", "tuple(range(1, 6))"))
    _copies.append(copy)
    return package / "landlock_exec.py"


_copies: list[Path] = []


@pytest.fixture(autouse=True)
def _remove_copies() -> Iterator[None]:
    yield
    while _copies:
        shutil.rmtree(_copies.pop(), ignore_errors=True)


@pytest.fixture
def var_home() -> Iterator[Path]:
    """A $HOME outside /tmp (a private /tmp would hide one below it anyway)."""
    home = Path(tempfile.mkdtemp(prefix="crew-selftest-home-", dir="/var/tmp"))
    # As a real /home: a root launcher's engine user may search it, so a broken
    # sandbox fails for what it lets through, not for a 0700 $HOME it cannot enter.
    home.chmod(0o755)
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def tmpfs_backend(needs_bwrap: None, tmp_path: Path) -> BwrapBackend:
    backend, health = open_backend(LinuxMode.TMPFS, tool_shell_base=tmp_path / "tool-shell")
    assert isinstance(backend, BwrapBackend), health
    return backend


@pytest.fixture
def hybrid_backend(needs_bwrap: None) -> BwrapBackend:
    backend, health = open_backend(LinuxMode.HYBRID)
    assert isinstance(backend, BwrapBackend), health
    return backend


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ("unsandboxed", "let a denied write through"),
        ("fails_to_start", "did not start (bwrap: setting up uid map"),
        ("home_not_hidden", "reading a file in $HOME was NOT denied"),
        ("root_writable", "let a denied write through"),
        ("tool_shell_not_nested", "a tool could open the memory of the process that started it"),
        ("tool_shell_broken", "the tool shell ($SHELL) could not run a command"),
    ],
)
def test_broken_sandboxes_fail_the_self_test(
    edit: str, expected: str, tmpfs_backend: BwrapBackend, var_home: Path
) -> None:
    crew = var_home / ".crew"
    reason = self_test(Rewired(tmpfs_backend, edit), var_home, crew)
    assert reason is not None and expected in reason
    # whatever it tried, nothing is left behind
    assert [p.name for p in var_home.iterdir()] == [".crew"]
    assert [p.name for p in crew.iterdir()] == ["sockets"]
    assert not list(Path("/var/tmp").glob("crew-selftest-denied-*"))


def test_an_engine_left_as_root_fails_the_self_test(
    tmpfs_backend: BwrapBackend, var_home: Path
) -> None:
    if os.getuid() != 0:
        # An ordinary launcher's engines keep its uid: there is no root to stay.
        assert tmpfs_backend.engine_ids is None
        return
    assert tmpfs_backend.engine_ids is not None
    reason = self_test(Rewired(tmpfs_backend, "stays_root"), var_home, var_home / ".crew")
    # uid 0 without DAC_OVERRIDE cannot write the engine user's 0700 work dir: that
    # check comes first; had it passed, the last one names the uid.
    assert reason is not None, "a sandbox left as root passed the self-test"
    assert "did not run as the engine user" in reason or "allowed write" in reason, reason


@pytest.mark.parametrize("mode", list(LinuxMode))
@pytest.mark.parametrize("crew_outside_home", [False, True])
def test_the_real_backends_pass(
    mode: LinuxMode, crew_outside_home: bool, needs_bwrap: None, isolated_home: Path, tmp_path: Path
) -> None:
    # As the launcher opens them: with the tool shell, whose checks must pass too.
    backend, health = open_backend(mode, tool_shell_base=tmp_path / "tool-shell")
    assert backend is not None and health.ok, health
    assert isinstance(backend, BwrapBackend) and backend.tools.tool_shells is not None
    crew = tmp_path / "crew" if crew_outside_home else isolated_home / ".crew"
    assert self_test(backend, isolated_home, crew) is None
    assert [p.name for p in crew.iterdir()] == ["sockets"]


def as_uid_0(backend: BwrapBackend) -> BwrapBackend:
    """A root launcher's sandbox as uid 0 (as before issue 20): what the self-test must catch
    when only uid 0's mode bits stand in the way, not the engine user's ownership."""
    return dataclasses.replace(backend, tools=dataclasses.replace(backend.tools, engine_ids=None))


def test_a_writable_sysctl_fails_the_self_test(tmpfs_backend: BwrapBackend, var_home: Path) -> None:
    if os.getuid() != 0:
        required_in_ci("root (an ordinary user cannot write sysctls anyway)")
    broken = Rewired(as_uid_0(tmpfs_backend), "sysctl_writable")
    reason = self_test(broken, var_home, var_home / ".crew")
    assert reason is not None and "writing a sysctl (/proc/sys) was NOT denied" in reason


def test_open_unix_sockets_fail_the_self_test(hybrid_backend: BwrapBackend, var_home: Path) -> None:
    # hybrid: $HOME stays visible, so only seccomp stands between the agent and a socket there.
    broken = Rewired(as_uid_0(hybrid_backend), "unix_sockets_open", mode="hybrid")
    reason = self_test(broken, var_home, var_home / ".crew")
    assert reason is not None and "connecting to a host Unix socket was NOT denied" in reason
    assert not list(var_home.glob(".crew-st-*"))


@pytest.mark.parametrize("mode", ["tmpfs", "hybrid"])
def test_datagram_socketpairs_fail_the_self_test(
    mode: str, tmpfs_backend: BwrapBackend, hybrid_backend: BwrapBackend, var_home: Path
) -> None:
    # issue 20: socket(AF_UNIX) refused, but a socketpair's datagram end reached host sockets.
    inner = tmpfs_backend if mode == "tmpfs" else hybrid_backend
    broken = Rewired(inner, "datagram_pairs_open", mode=mode)  # type: ignore[arg-type]
    reason = self_test(broken, var_home, var_home / ".crew")
    assert reason is not None and "Unix datagram socket" in reason, reason
    assert not list(Path("/var/tmp").glob("crew-selftest-dgram-*"))


@pytest.mark.parametrize("mode", ["tmpfs", "hybrid"])
def test_a_shared_network_fails_the_self_test(
    mode: str, tmpfs_backend: BwrapBackend, hybrid_backend: BwrapBackend, var_home: Path
) -> None:
    # The sandbox without its own network namespace reaches the host's loopback services.
    inner = tmpfs_backend if mode == "tmpfs" else hybrid_backend
    broken = Rewired(inner, "shared_network", mode=mode)  # type: ignore[arg-type]
    reason = self_test(broken, var_home, var_home / ".crew")
    assert reason is not None and "host loopback port that is not forwarded" in reason
