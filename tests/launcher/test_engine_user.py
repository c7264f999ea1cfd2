"""A root launcher's engine user (issue 20): the argv, what is hidden, the hand-over, the user.

Pure parts as table tests; the hand-over on a real tree (as root: it chowns).
The whole chain as root is tests/faults/test_engine_user.py; the hostile
matrix (test_matrix.py) runs root's cells with the engine user too.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
from pathlib import Path

import pytest

from crew_common.engine_user import EngineUserMissing, engine_identity
from sandbox_launcher.bwrap import LinuxMode, bwrap_argv, can_search, hidden_roots
from sandbox_launcher.limits import disk_usage
from sandbox_launcher.ownership import hand_over
from sandbox_launcher.policy import SandboxPolicy
from tests.launcher.test_argv import CMD, TOOLS, policy
from tests.support.ci import required_in_ci

ENGINE = dataclasses.replace(TOOLS, engine_ids=(999, 995))
SETPRIV = ["/usr/bin/setpriv", "--reuid=999", "--regid=995", "--clear-groups"]
SETPRIV += ["--inh-caps=-all", "--bounding-set=-all", "--"]


@pytest.mark.parametrize("mode", list(LinuxMode))
def test_the_engine_user_argv_drops_root_before_the_helper(mode: LinuxMode) -> None:
    argv = bwrap_argv(policy(), mode, ENGINE, CMD, unreachable=(Path("/home/u"),))
    assert "--unshare-user" not in argv  # bwrap is root: it reaches every path it binds
    kept = [argv[i + 1] for i, a in enumerate(argv) if a == "--cap-add"]
    assert kept == ["CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_DAC_READ_SEARCH"]
    helper = argv.index("/usr/bin/python3.11", argv.index("--chdir"))
    assert argv[helper - len(SETPRIV) : helper] == SETPRIV
    assert "--nproc" not in argv  # one uid for all agents: the cgroup caps a run's pids
    # $HOME is hidden in both modes (the engine user could not search a 0700 one),
    # with the allowlist bound back on 0755 levels bwrap would otherwise make 0700.
    assert argv.count("--tmpfs") >= 1 and ("/home/u" in argv[argv.index("--tmpfs") + 1 :])
    bin_at = argv.index("/home/u/.crew/runtime/r1/bin")
    made = [argv[i + 1] for i in range(bin_at) if argv[i] == "--dir"]
    assert made[:3] == ["/home/u/.crew", "/home/u/.crew/runtime", "/home/u/.crew/runtime/r1"]
    assert argv[argv.index("/dev/shm") - 3 : argv.index("/dev/shm")] == [
        "--perms",
        "1777",
        "--tmpfs",
    ]
    if mode is LinuxMode.HYBRID:
        assert argv[argv.index("--deny") + 1] == "/home/u"  # Landlock still on top


def test_an_ordinary_callers_argv_is_unchanged() -> None:
    argv = bwrap_argv(policy(), LinuxMode.HYBRID, TOOLS, CMD)
    assert "--unshare-user" in argv and "--cap-add" not in argv and "/usr/bin/setpriv" not in argv
    assert "--nproc" in argv


def test_hidden_roots_drop_nested_ones_and_those_below_tmp() -> None:
    deny = (Path("/root/home"),)
    unreachable = (Path("/root"), Path("/tmp/pytest-of-root"), Path("/srv/x"))
    assert hidden_roots(deny, unreachable) == (Path("/root"), Path("/srv/x"))


@pytest.mark.parametrize(
    ("mode", "owner", "group", "searchable"),
    [
        (0o700, 0, 0, False),
        (0o701, 0, 0, True),
        (0o710, 0, 995, True),
        (0o710, 0, 5, False),
        (0o700, 999, 5, True),
        (0o070, 999, 995, False),  # the owner's bits count, not the group's
    ],
)
def test_can_search_by_mode_bits(mode: int, owner: int, group: int, searchable: bool) -> None:
    st = os.stat_result((0o40000 | mode, 0, 0, 2, owner, group, 0, 0, 0, 0))
    assert can_search(st, 999, 995) is searchable


def test_the_engine_user_is_none_unless_root_and_must_exist_and_be_unprivileged() -> None:
    assert engine_identity({}, euid=1000) is None
    with pytest.raises(EngineUserMissing, match="useradd --system"):
        engine_identity({"CREW_ENGINE_USER": "crew-no-such-user-xyz"}, euid=0)
    with pytest.raises(EngineUserMissing, match="must be an unprivileged user"):
        engine_identity({"CREW_ENGINE_USER": "root"}, euid=0)
    nobody = pwd.getpwnam("nobody")
    found = engine_identity({"CREW_ENGINE_USER": "nobody"}, euid=0)
    assert found is not None and (found.uid, found.gid) == (nobody.pw_uid, nobody.pw_gid)


def test_the_hand_over_changes_links_never_their_targets(tmp_path: Path) -> None:
    if os.getuid() != 0:
        required_in_ci("root (the hand-over chowns)")
    ids = (pwd.getpwnam("nobody").pw_uid, pwd.getpwnam("nobody").pw_gid)
    outside = tmp_path / "outside.txt"
    outside.write_text("root's\n")
    crew = tmp_path / "crew"
    agent, runtime = crew / "agents" / "a1", crew / "runtime" / "r1" / "agents" / "a1"
    for d in (agent / "work" / "old" / "deep", agent / "engines" / "opencode", runtime / "tmp"):
        d.mkdir(parents=True)
    (agent / "AGENTS.md").write_text("x")
    (runtime / "token").write_text("t")
    (agent / "work" / "old" / "deep" / "f").write_text("an earlier root run's")
    (agent / "link").symlink_to(outside)
    (agent / "engines" / "opencode" / "link").symlink_to(outside)
    p = SandboxPolicy(
        home=tmp_path,
        crew_home=crew,
        agent_dir=agent,
        runtime_dir=runtime,
        tmp_dir=runtime / "tmp",
        work_dir=agent / "work",
    )
    assert hand_over(p, ids) > 0
    for path in (agent, agent / "AGENTS.md", runtime / "token", runtime / "tmp",
                 agent / "work" / "old" / "deep" / "f", agent / "link"):  # fmt: skip
        st = path.lstat()
        assert (st.st_uid, st.st_gid) == ids, path
    assert outside.stat().st_uid == 0  # the link itself changed, not what it names
    # What the engine made is its own: a file of root's in an engine-owned directory
    # below work/ is not looked for (work/ is not walked), the top of work/ is.
    os.chown(agent / "work" / "old" / "deep" / "f", 0, 0)
    (agent / "work" / "MEMORY.md").write_text("the Computer's template")
    assert hand_over(p, ids) == 1
    assert (agent / "work" / "MEMORY.md").stat().st_uid == ids[0]
    assert (agent / "work" / "old" / "deep" / "f").stat().st_uid == 0


def test_disk_usage_counts_blocks_below_the_dirs_and_follows_no_link(tmp_path: Path) -> None:
    agent, outside = tmp_path / "agent", tmp_path / "outside"
    (agent / "work" / "deep").mkdir(parents=True)
    outside.mkdir()
    (outside / "big").write_bytes(b"x" * (4 << 20))
    (agent / "work" / "deep" / "f").write_bytes(b"y" * (1 << 20))
    (agent / "work" / "link").symlink_to(outside)
    used = disk_usage((agent,), 1 << 40)
    assert 1 << 20 <= used < 2 << 20  # the 1 MiB file, not the 4 MiB one behind the link
    assert disk_usage((agent, outside), 1 << 40) >= 5 << 20
    assert disk_usage((tmp_path / "gone",), 1 << 40) == 0
