"""The bwrap argv is a pure function of the policy: table tests, exact lists."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from sandbox_launcher.bwrap import (
    BwrapTools,
    LinuxMode,
    SandboxUnavailable,
    bwrap_argv,
    choose_mode,
    preflight_reason,
)
from sandbox_launcher.policy import SandboxPolicy

TOOLS = BwrapTools(
    bwrap="/usr/bin/bwrap",
    env="/usr/bin/env",
    python="/usr/bin/python3.11",
    helper="/opt/crew/sandbox_launcher/landlock_exec.py",
    support_dirs=(Path("/usr"), Path("/opt/crew/sandbox_launcher")),
)
CMD = ["/home/u/.opencode/bin/opencode", "run", "--model", "a/b"]


def policy(home: str = "/home/u", crew: str | None = None) -> SandboxPolicy:
    crew_home = Path(crew or f"{home}/.crew")
    agent = crew_home / "agents" / "a1"
    runtime = crew_home / "runtime" / "r1" / "agents" / "a1"
    return SandboxPolicy(
        home=Path(home),
        crew_home=crew_home,
        agent_dir=agent,
        runtime_dir=runtime,
        tmp_dir=runtime / "tmp",
        work_dir=agent / "work",
        read_dirs=(crew_home / "runtime" / "r1" / "bin", Path(f"{home}/.pyenv/versions/3.11.7")),
        read_files=(Path(f"{home}/.opencode/bin/opencode"),),
    )


A = "/home/u/.crew/agents/a1"
R = "/home/u/.crew/runtime/r1/agents/a1"
BIN = "/home/u/.crew/runtime/r1/bin"
PY = "/home/u/.pyenv/versions/3.11.7"
OC = "/home/u/.opencode/bin/opencode"
HEAD = [
    "/usr/bin/env", "--ignore-signal=INT", "/usr/bin/bwrap",
    "--ro-bind", "/", "/", "--dev", "/dev",
    "--unshare-pid", "--proc", "/proc", "--die-with-parent", "--cap-drop", "ALL",
    "--bind", f"{R}/tmp", "/tmp",
]  # fmt: skip

HYBRID = [
    *HEAD,
    "--bind", A, A, "--bind", R, R,
    "--tmpfs", "/home/u/.crew/sockets",
    "--chdir", f"{A}/work", "--", "/usr/bin/env", "--default-signal=INT",
    "/usr/bin/python3.11", "-I", "-S", "/opt/crew/sandbox_launcher/landlock_exec.py",
    "--deny", "/home/u", "--ro", BIN, "--ro", PY, "--ro", OC, "--rw", A, "--rw", R, "--",
    *CMD,
]  # fmt: skip

TMPFS = [
    *HEAD,
    "--tmpfs", "/home/u",
    "--ro-bind", BIN, BIN, "--ro-bind", PY, PY, "--ro-bind", OC, OC,
    "--bind", A, A, "--bind", R, R,
    "--remount-ro", "/home/u",
    "--chdir", f"{A}/work", "--", "/usr/bin/env", "--default-signal=INT",
    *CMD,
]  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "expected"), [(LinuxMode.HYBRID, HYBRID), (LinuxMode.TMPFS, TMPFS)]
)
def test_argv_exact(mode: LinuxMode, expected: list[str]) -> None:
    assert bwrap_argv(policy(), mode, TOOLS, CMD) == expected


def test_crew_home_outside_home_is_a_second_deny_root() -> None:
    p = policy(crew="/srv/crew")
    hybrid = bwrap_argv(p, LinuxMode.HYBRID, TOOLS, CMD)
    helper = hybrid[hybrid.index("/opt/crew/sandbox_launcher/landlock_exec.py") :]
    assert helper[:5] == [
        "/opt/crew/sandbox_launcher/landlock_exec.py",
        "--deny",
        "/home/u",
        "--deny",
        "/srv/crew",
    ]
    assert helper[5:7] == ["--ro", "/srv/crew/runtime/r1/bin"]
    tmpfs = bwrap_argv(p, LinuxMode.TMPFS, TOOLS, CMD)
    pairs = list(itertools.pairwise(tmpfs))
    for root in ("/home/u", "/srv/crew"):
        assert ("--tmpfs", root) in pairs and ("--remount-ro", root) in pairs


def test_home_below_tmp_is_bound_back_over_the_private_tmp() -> None:
    p = policy(home="/tmp/pytest/home0")
    argv = bwrap_argv(p, LinuxMode.HYBRID, TOOLS, CMD)
    private_tmp = argv.index("/tmp", argv.index("--bind"))
    back = argv.index("/tmp/pytest/home0")
    assert argv[back - 1 : back + 2] == ["--ro-bind", "/tmp/pytest/home0", "/tmp/pytest/home0"]
    assert private_tmp < back < argv.index("--bind", back)


@pytest.mark.parametrize("mode", list(LinuxMode))
@pytest.mark.parametrize("home", ["/home/u", "/tmp/h", "/var/tmp/h"])
def test_argv_invariants(mode: LinuxMode, home: str) -> None:
    argv = bwrap_argv(policy(home=home), mode, TOOLS, CMD)
    sandbox = argv[: argv.index("--")]
    assert argv[:3] == ["/usr/bin/env", "--ignore-signal=INT", "/usr/bin/bwrap"]
    assert "--new-session" not in argv  # it would break the group semantics
    assert sandbox[sandbox.index("--cap-drop") :][:2] == ["--cap-drop", "ALL"]
    assert "--unshare-pid" in sandbox and "--die-with-parent" in sandbox
    # The private /dev comes before every writable bind (else devices are nodev).
    assert sandbox.index("--dev") < sandbox.index("--bind")
    assert argv[argv.index("--") + 1 : argv.index("--") + 3] == [
        "/usr/bin/env",
        "--default-signal=INT",
    ]
    assert argv[-len(CMD) :] == CMD
    # Nothing writable but the agent's own directories.
    binds = [sandbox[i + 1] for i, a in enumerate(sandbox) if a == "--bind"]
    p = policy(home=home)
    assert binds == [str(p.tmp_dir), str(p.agent_dir), str(p.runtime_dir)]


def test_choose_mode() -> None:
    assert choose_mode(None, 7) is LinuxMode.HYBRID
    assert choose_mode(None, 1) is LinuxMode.TMPFS
    assert choose_mode(None, 0) is LinuxMode.TMPFS
    assert choose_mode(LinuxMode.TMPFS, 7) is LinuxMode.TMPFS
    with pytest.raises(SandboxUnavailable, match="--mode tmpfs"):
        choose_mode(LinuxMode.HYBRID, 1)


@pytest.mark.parametrize(
    ("stderr", "expected"),
    [
        ("bwrap: setting up uid map: Permission denied\n", "user namespaces"),
        ("bwrap: No permissions to create a new namespace, likely because", "user namespaces"),
        ("bwrap: Failed to make / slave: Operation not permitted", "mount namespaces"),
        ("bwrap: something else entirely", "check the bubblewrap installation"),
    ],
)
def test_preflight_reasons_are_actionable(stderr: str, expected: str) -> None:
    reason = preflight_reason(1, stderr)
    assert reason is not None and expected in reason
    assert stderr.strip().splitlines()[0] in reason
    assert preflight_reason(0, "") is None
