"""Per-run resource limits (sandbox_launcher/limits.py): a fork bomb or a full /dev/shm ends
the run with a reason, and another agent's run at the same time is not harmed.

Through a real launcher (both Linux modes) as the caller — root in CI, where
RLIMIT_NPROC does not apply and the run's cgroup is what stops the bomb — and,
for the watch that serves machines without a usable cgroup, a real bwrap
sandbox as an unprivileged user. Sources: sandbox-runtime and Codex leave
resources alone; the cases are issue 12's ("a fork bomb or a 256 MiB write
to /dev/shm ends the turn with a clear failure and harms no other agent").
"""

from __future__ import annotations

import dataclasses
import errno
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crew_harness.waiting import wait_until
from sandbox_launcher.bwrap import LinuxMode, bwrap_argv, find_tools
from sandbox_launcher.limits import (
    CgroupParents,
    ResourceWatch,
    RunCgroup,
    TurnLimits,
    find_cgroup_parents,
    parse_mounts,
    parse_self_cgroup,
    v2_parents,
)
from sandbox_launcher.policy import SandboxPolicy
from tests.launcher.conftest import MODES
from tests.launcher.helpers import CrewLayout, LauncherProcess, engine_lines
from tests.launcher.test_runs import StreamReader
from tests.support.ci import required_in_ci
from tests.support.users import unprivileged_uid

MAX_PROCESSES = 96
SHM_MB = 16
MEMORY_MB = 256
DISK_MB = 24


@pytest.fixture(params=MODES)
def limited_launcher(
    request: pytest.FixtureRequest, needs_bwrap: None, layout: CrewLayout, fake_opencode: Path
) -> Iterator[LauncherProcess]:
    """A real launcher with small limits, in each Linux mode."""
    limits = ("--max-processes", str(MAX_PROCESSES), "--shm-mb", str(SHM_MB))
    limits += ("--memory-mb", str(MEMORY_MB), "--disk-mb", str(DISK_MB))
    proc = LauncherProcess(layout, fake_opencode, mode=request.param, extra_args=limits)
    try:
        yield proc
    finally:
        proc.stop()


def _exit(frames: list[dict[str, Any]]) -> dict[str, Any]:
    assert frames and frames[-1]["t"] == "exit", frames
    return frames[-1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("scenario", "reason"),
    [
        ("fork_bomb", "process_limit"),
        ("shm_fill", "shm_full"),
        ("memory_hog", "memory_limit"),
        ("disk_fill", "disk_limit"),  # issue 20, K19: an agent filling the user's disk
    ],
)
def test_a_run_at_its_limit_is_ended_and_the_other_agent_runs_on(
    limited_launcher: LauncherProcess, layout: CrewLayout, scenario: str, reason: str
) -> None:
    if os.getuid() == 0 and find_cgroup_parents() is None:
        required_in_ci("a cgroup for the runs (root without one has no process cap)")
    layout.add_agent("a1")
    layout.add_agent("a2")
    script = {"scenario": scenario, "big_mib": DISK_MB + 8, "files": DISK_MB}
    hostile = StreamReader(limited_launcher, layout.run_request("a1", script))
    try:
        assert hostile.first_line.wait(30), hostile.frames
        # The other agent's run, while the hostile one is at its limit.
        frames = limited_launcher.run(layout.run_request("a2", {"scenario": "echo"}))
        assert _exit(frames)["code"] == 0, frames
        assert engine_lines(frames)[0]["cwd"].endswith("/a2/work")
        # The cgroup's join shell leaves the engine's PWD (its project) as it was.
        assert engine_lines(frames)[0]["env"]["PWD"].endswith("/a2/work")
        assert hostile.done.wait(60), "the hostile run was never ended"
    finally:
        hostile.close()
    end = _exit(hostile.frames)
    assert end["reason"] == reason, end
    if scenario == "shm_fill":
        [refused] = [x for x in engine_lines(hostile.frames) if x.get("event") == "shm_refused"]
        assert refused["errno"] == 28 and refused["mib"] <= SHM_MB, refused  # ENOSPC at the size
    if scenario == "disk_fill":
        [big] = [x for x in engine_lines(hostile.frames) if x.get("event", "").startswith("big")]
        assert big == {"event": "big_refused", "errno": errno.EFBIG, "mib": DISK_MB}, big
    # No cgroup of the run is left behind.
    parents = find_cgroup_parents()
    if parents is not None:
        assert not list(parents.pids.glob(f"crew-{layout.run_id}-*"))


# ---- the watch without a cgroup: a real sandbox as an ordinary user ----

WATCHED = r"""
import os, signal, sys
mode = sys.argv[1]
if mode == "tasks":
    try:
        for _ in range(int(sys.argv[2])):
            if os.fork() == 0:
                signal.pause()
                os._exit(0)
    except OSError:
        pass  # RLIMIT_NPROC: this is as far as it goes
else:
    with open("/dev/shm/fill", "wb") as f:
        try:
            while True:
                f.write(b"x" * 65536)
                f.flush()
        except OSError:
            pass
print("ready", flush=True)
signal.pause()
"""


@pytest.fixture
def unprivileged_box(needs_bwrap: None) -> Iterator[SandboxPolicy]:
    if os.getuid() != 0:
        required_in_ci("root (to drop to an unprivileged user)")
    base = Path(tempfile.mkdtemp(prefix="crew-limits-", dir="/var/tmp"))
    base.chmod(0o755)
    home = base / "home"
    crew = home / ".crew"
    agent = crew / "agents" / "a"
    runtime = crew / "runtime" / "r" / "a"
    for path in (agent / "work", runtime / "tmp", crew / "sockets"):
        path.mkdir(parents=True)
    (agent / "watched.py").write_text(WATCHED)
    for path in [home, *home.rglob("*")]:
        os.lchown(path, unprivileged_uid(), unprivileged_uid())
    try:
        yield SandboxPolicy(
            home=home,
            crew_home=crew,
            agent_dir=agent,
            runtime_dir=runtime,
            tmp_dir=runtime / "tmp",
            work_dir=agent / "work",
        )
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", list(LinuxMode))
@pytest.mark.parametrize("what", ["tasks", "shm"])
def test_the_watch_sees_a_run_at_its_limit_without_a_cgroup(
    unprivileged_box: SandboxPolicy, mode: LinuxMode, what: str
) -> None:
    limits = TurnLimits(max_processes=48, shm_bytes=4 * 1024 * 1024)
    tools = dataclasses.replace(
        find_tools(),
        python="/usr/bin/python3",
        support_dirs=(Path("/usr"), Path(find_tools().helper).parent),
        nproc=limits.max_processes,
        shm_bytes=limits.shm_bytes,
    )
    script = str(unprivileged_box.agent_dir / "watched.py")
    # Below the threshold first: the watch must not call that a hit.
    few = ["/usr/bin/python3", "-I", script, "tasks", "8"]
    many = ["/usr/bin/python3", "-I", script, what, str(limits.max_processes)]
    for command, expected in (
        (few, None),
        (many, "process_limit" if what == "tasks" else "shm_full"),
    ):
        argv = bwrap_argv(unprivileged_box, mode, tools, command)
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            user=unprivileged_uid(),
            group=unprivileged_uid(),
            extra_groups=[],
            start_new_session=True,
            env={"PATH": "/usr/bin:/bin"},
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line == b"ready\n", (line, proc.stderr.read() if proc.stderr else b"")
            watch = ResourceWatch(limits, None, proc.pid)
            if expected is None:
                assert watch.hit() is None
            else:
                sees = lambda w=watch, e=expected: w.hit() == e  # noqa: E731
                wait_until(f"the watch to see {expected}", sees, 10)
        finally:
            os.killpg(proc.pid, 9)
            proc.wait()


# ---- pure parts and the cgroup files ----

MOUNTINFO = """\
25 30 0:22 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755
33 25 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 25 0:33 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
38 25 0:34 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
SELF_CGROUP = "8:pids:/\n4:memory:/process_api/abc\n0::/\n"


def test_mounts_and_membership_are_read() -> None:
    v2, v1 = parse_mounts(MOUNTINFO)
    assert v2 == Path("/sys/fs/cgroup/unified")
    assert v1 == {"memory": Path("/sys/fs/cgroup/memory"), "pids": Path("/sys/fs/cgroup/pids")}
    assert parse_self_cgroup(SELF_CGROUP) == ("/", {"pids": "/", "memory": "/process_api/abc"})


@pytest.mark.parametrize("version", [1, 2])
def test_a_run_cgroup_sets_its_limits_and_reads_its_events(tmp_path: Path, version: int) -> None:
    parents = CgroupParents(version, tmp_path / "pids", tmp_path / "memory")  # type: ignore[arg-type]
    for d in (parents.pids, parents.memory):
        d.mkdir()
    limits = TurnLimits(max_processes=100, memory_bytes=1 << 30)
    group = RunCgroup.create(parents, "crew-r-1", limits)
    assert (group.pids / "pids.max").read_text() == "100"
    memory_file = "memory.max" if version == 2 else "memory.limit_in_bytes"
    assert (group.memory / memory_file).read_text() == str(1 << 30)
    assert group.join_prefix()[-1] == "--"
    (group.pids / "pids.events").write_text("max 0\n")
    oom_file = "memory.events" if version == 2 else "memory.oom_control"
    (group.memory / oom_file).write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    assert group.hit() is None
    (group.pids / "pids.events").write_text("max 3\n")
    assert group.hit() == "process_limit"
    (group.memory / oom_file).write_text("oom_kill 1\n")
    assert group.hit() == "memory_limit"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups are Linux only")
def test_the_join_prefix_puts_the_command_into_the_run_cgroup() -> None:
    parents = find_cgroup_parents()
    if parents is None:
        if os.getuid() == 0:
            required_in_ci("a cgroup for the runs")
        pytest.skip("no cgroup delegated to this user")
    group = RunCgroup.create(parents, f"crew-test-{os.getpid()}", TurnLimits(max_processes=50))
    try:
        done = subprocess.run(
            [*group.join_prefix(), "cat", "/proc/self/cgroup"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert f"crew-test-{os.getpid()}" in done.stdout
    finally:
        group.remove()
    assert not group.pids.exists()


def test_a_cgroup_that_cannot_be_joined_stops_the_run_with_a_sandbox_line(tmp_path: Path) -> None:
    group = RunCgroup(1, tmp_path / "gone", tmp_path / "gone")
    done = subprocess.run(
        [*group.join_prefix(), "echo", "RAN"], capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stdout) == (126, "")
    # The Computer reads lines with this prefix as the sandbox's (engine/failures.py).
    assert done.stderr.startswith("crew-cgroup: cannot join the run's cgroup (")


def test_a_delegated_v2_cgroup_gets_a_launcher_leaf_and_the_controllers(tmp_path: Path) -> None:
    own = tmp_path / "user.slice" / "app"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu memory pids\n")
    (own / "cgroup.subtree_control").write_text("\n")
    parents = v2_parents(tmp_path, "/user.slice/app")
    assert parents == CgroupParents(2, own, own)
    # The launcher moved itself into a leaf, then handed memory and pids to the children.
    assert (own / "crew-launcher" / "cgroup.procs").read_text() == "0"
    assert (own / "cgroup.subtree_control").read_text() == "+memory +pids"
    (own / "cgroup.controllers").write_text("cpu io\n")  # not delegated: rlimits only
    assert v2_parents(tmp_path, "/user.slice/app") is None
