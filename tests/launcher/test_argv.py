"""The bwrap argv is a pure function of the policy: table tests, exact lists."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from sandbox_launcher.bwrap import (
    DEV_SHM_BYTES,
    NPROC_LIMIT,
    PROC_READ_ONLY,
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
    socket_dirs=(Path("/run/user"), Path("/run/dbus")),
    socket_files=(Path("/run/docker.sock"),),
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
PROC_RO = [a for entry in PROC_READ_ONLY for a in ("--ro-bind-try", entry, entry)]
HEAD = [
    "/usr/bin/env", "--ignore-signal=INT", "/usr/bin/bwrap",
    "--unshare-user", "--unshare-ipc",
    "--ro-bind", "/", "/", "--dev", "/dev",
    "--size", str(DEV_SHM_BYTES), "--perms", "1777", "--tmpfs", "/dev/shm",
    "--unshare-pid", "--proc", "/proc", *PROC_RO, "--die-with-parent", "--cap-drop", "ALL",
    "--bind", f"{R}/tmp", "/tmp",
    "--tmpfs", "/run/user", "--tmpfs", "/run/dbus", "--ro-bind", "/dev/null", "/run/docker.sock",
]  # fmt: skip
HELPER = [
    "--", "/usr/bin/env", "--default-signal=INT",
    "/usr/bin/python3.11", "-I", "-S", "/opt/crew/sandbox_launcher/landlock_exec.py",
    "--seccomp", "--nproc", str(NPROC_LIMIT),
]  # fmt: skip
TAIL = ["--remount-ro", "/run/user", "--remount-ro", "/run/dbus", "--remount-ro", "/dev"]

HYBRID = [
    *HEAD,
    "--bind", A, A, "--bind", R, R,
    "--tmpfs", "/home/u/.crew/sockets", "--remount-ro", "/home/u/.crew/sockets",
    *TAIL, "--chdir", f"{A}/work", *HELPER,
    "--deny", "/home/u", "--ro", BIN, "--ro", PY, "--ro", OC, "--rw", A, "--rw", R, "--",
    *CMD,
]  # fmt: skip

TMPFS = [
    *HEAD,
    "--tmpfs", "/home/u",
    "--ro-bind", BIN, BIN, "--ro-bind", PY, PY, "--ro-bind", OC, OC,
    "--bind", A, A, "--bind", R, R,
    "--remount-ro", "/home/u",
    *TAIL, "--chdir", f"{A}/work", *HELPER, "--",
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
    helper = hybrid[hybrid.index("--deny") :]
    assert helper[:4] == ["--deny", "/home/u", "--deny", "/srv/crew"]
    assert helper[4:6] == ["--ro", "/srv/crew/runtime/r1/bin"]
    tmpfs = bwrap_argv(p, LinuxMode.TMPFS, TOOLS, CMD)
    pairs = list(itertools.pairwise(tmpfs))
    for root in ("/home/u", "/srv/crew"):
        assert ("--tmpfs", root) in pairs and ("--remount-ro", root) in pairs


def test_home_below_tmp_shows_only_what_the_run_needs_over_the_private_tmp() -> None:
    # issue 20: the private /tmp gets a Landlock grant of its own (else what a tool writes
    # there is unreadable), so $HOME is not bound back whole below it (the grant would
    # reach it): only the run's own directories are.
    p = policy(home="/tmp/pytest/home0")
    argv = bwrap_argv(p, LinuxMode.HYBRID, TOOLS, CMD)
    sandbox, helper = argv[: argv.index("--")], argv[argv.index("--") :]
    private_tmp = sandbox.index("/tmp", sandbox.index("--bind"))
    assert ["--ro-bind", "/tmp/pytest/home0", "/tmp/pytest/home0"] not in [
        sandbox[i : i + 3] for i in range(len(sandbox))
    ]
    agent = sandbox.index(str(p.agent_dir))
    assert sandbox[agent - 1 : agent + 2] == ["--bind", str(p.agent_dir), str(p.agent_dir)]
    assert private_tmp < agent
    pairs = list(itertools.pairwise(helper))
    assert ("--rw", "/tmp") in pairs and ("--deny", "/tmp/pytest/home0") in pairs


def test_home_outside_tmp_gives_no_grant_of_the_whole_tmp() -> None:
    argv = bwrap_argv(policy(home="/var/tmp/h"), LinuxMode.HYBRID, TOOLS, CMD)
    assert ("--rw", "/tmp") not in list(itertools.pairwise(argv))


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
    # Every mode: own user and IPC namespaces, seccomp and a process cap in the helper.
    assert sandbox[3:5] == ["--unshare-user", "--unshare-ipc"]
    assert argv[argv.index("--") + 7 : argv.index("--") + 11] == [
        "--seccomp",
        "--nproc",
        str(NPROC_LIMIT),
        *(["--deny"] if mode is LinuxMode.HYBRID else ["--"]),
    ]
    # What uid 0 could write by mode bits is read-only; /dev only after its shm.
    for entry in ("/proc/sys", "/proc/sysrq-trigger"):
        i = sandbox.index(entry)
        assert sandbox[i - 1 : i + 2] == ["--ro-bind-try", entry, entry]
        assert sandbox.index("--proc") < i
    assert sandbox[-4:-2] == ["--remount-ro", "/dev"]
    assert sandbox.index("/dev/shm") < len(sandbox) - 3
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
