"""Planted git hooks and config (issue 12): denied for the repositories in `work/`, git still works.

The attack (sandbox-runtime's mandatory deny of `.git/hooks` and `.git/config`,
Codex's read-only `.git` under writable roots): an agent writes
`.git/hooks/pre-commit`, sets `core.fsmonitor`, points `commondir` elsewhere,
or swaps the whole `.git`; the user's next `git status` or `git commit` in
that directory would run the agent's program unsandboxed. The positive
control: `git init`, `git add`, `git commit` keep working. Both Linux modes,
as root and as an unprivileged user; the launcher process too (`commondir`
planted during a run is removed after it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_launcher.backend import BwrapBackend
from sandbox_launcher.bwrap import LinuxMode, git_guard_args
from sandbox_launcher.git_guard import find_git_dirs, guarded_git_dirs, prepare_guard
from sandbox_launcher.policy import SandboxPolicy
from sandbox_launcher.seatbelt import profile_text, seatbelt_params
from tests.launcher.helpers import (
    LauncherProcess,
    engine_lines,
    make_layout,
    probe_results,
    probe_uid,
    public_temp_dir,
    tools_for,
    write_fake_opencode,
)
from tests.support.ci import required_in_ci

# safe.directory: a root launcher hands the repositories to the engine user (issue 20).
GIT = ["git", "-c", "user.email=agent@crew", "-c", "user.name=agent", "-c", "safe.directory=*"]


def _git(repo: Path, *args: str, uid: int | None = None) -> str:
    """git as the user (or as `uid`, the repository's owner: git refuses other owners' repos)."""
    other = uid is not None and uid != os.getuid()
    done = subprocess.run(
        [*GIT, "-C", str(repo), *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "HOME": str(repo.parent)} if other else None,
        user=uid if other else None,
        group=uid if other else None,
        extra_groups=[] if other else None,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def make_repo(repo: Path) -> Path:
    """A repository with one commit, as an agent's earlier turn left it."""
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("a\n")
    _git(repo, "add", "a.txt")
    _git(repo, "commit", "-qm", "first")
    return repo / ".git"


# ---- finding and preparing (no sandbox) ----


def test_repositories_are_found_bounded_and_without_following_links(tmp_path: Path) -> None:
    work = tmp_path / "work"
    top = make_repo(work)
    nested = make_repo(work / "libs" / "inner")
    make_repo(work / "a" / "b" / "c" / "too-deep")
    make_repo(work / "node_modules" / "pkg")
    outside = make_repo(tmp_path / "outside")
    (work / "link").symlink_to(outside.parent)
    assert sorted(find_git_dirs(work)) == sorted([top, nested])


def test_missing_hooks_and_config_are_created_and_links_are_not_guarded(tmp_path: Path) -> None:
    git_dir = make_repo(tmp_path / "r")
    shutil.rmtree(git_dir / "hooks")
    (git_dir / "config").unlink()
    assert prepare_guard(git_dir)
    assert (git_dir / "hooks").is_dir() and (git_dir / "config").read_text() == ""
    linked = make_repo(tmp_path / "s")
    shutil.rmtree(linked / "hooks")
    (linked / "hooks").symlink_to(tmp_path)
    assert not prepare_guard(linked)
    assert guarded_git_dirs(tmp_path / "s") == ()


def test_backends_render_the_guard(tmp_path: Path) -> None:
    g = Path("/home/u/.crew/agents/a1/work/.git")
    policy = SandboxPolicy(
        home=Path("/home/u"),
        crew_home=Path("/home/u/.crew"),
        agent_dir=Path("/home/u/.crew/agents/a1"),
        runtime_dir=Path("/home/u/.crew/runtime/r/agents/a1"),
        tmp_dir=Path("/home/u/.crew/runtime/r/agents/a1/tmp"),
        work_dir=Path("/home/u/.crew/agents/a1/work"),
        guarded_git=(g,),
    )
    assert git_guard_args(policy) == [
        *("--bind", str(g), str(g)),
        *("--ro-bind", f"{g}/hooks", f"{g}/hooks"),
        *("--ro-bind", f"{g}/config", f"{g}/config"),
    ]
    text = profile_text(0, 0, 1)
    used = set(re.findall(r'\(param "([A-Z_0-9]+)"\)', text))
    params = dict(seatbelt_params(policy))
    assert used == set(params)
    assert params["GIT_COMMONDIR_0"] == f"{g}/commondir"
    # The deny comes after the allow of the agent dir: in Seatbelt the last match wins.
    assert text.index('(deny file-write* (literal (param "GIT_DIR_0"))') > text.index(
        '(allow file-write*\n  (subpath (param "AGENT_DIR"))'
    )


# ---- the attack and the control, in the real sandbox ----

PROBE = """\
run() { name=$1; shift; out=$("$@" 2>&1); echo "$name $? $(echo $out | head -c 200)"; }
cd "$WORK"
run hook sh -c 'printf "#!/bin/sh\\necho pwned > $WORK/pwned\\n" > repo/.git/hooks/pre-commit'
run hook_chmod chmod 755 repo/.git/hooks/post-checkout.sample
run fsmonitor git -C repo config core.fsmonitor "echo pwned > $WORK/pwned"
run hookspath git -C repo config core.hooksPath "$WORK/evil-hooks"
run swap_git mv repo/.git repo/.git-old
run remove_hooks rm -rf repo/.git/hooks
run commit_existing sh -c 'echo b >> repo/a.txt && git -C repo add a.txt && git -C repo commit -qm second'
run new_repo sh -c 'git init -q fresh && echo f > fresh/f && git -C fresh add f && git -C fresh commit -qm one'
"""


@pytest.fixture(params=["caller", "unprivileged"])
def run_as(request: pytest.FixtureRequest, needs_bwrap: None) -> int:
    if shutil.which("git") is None:
        required_in_ci("git")
    return probe_uid(request.param)


@pytest.fixture
def base() -> Iterator[Path]:
    with public_temp_dir("crew-git-") as path:
        yield path


def _host_git_runs_nothing_planted(repo: Path, work: Path, uid: int | None = None) -> None:
    """What the user would run later: status and a commit, with hooks and fsmonitor honoured."""
    (repo / "user.txt").write_text("u\n")
    if uid is not None:
        os.chown(repo / "user.txt", uid, uid)
    _git(repo, "status", "--short", uid=uid)
    _git(repo, "add", "user.txt", uid=uid)
    _git(repo, "commit", "-qm", "by the user", uid=uid)
    assert not (work / "pwned").exists(), "a planted hook or fsmonitor ran as the user"
    assert "fsmonitor" not in (repo / ".git" / "config").read_text()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", list(LinuxMode))
def test_planted_hooks_and_config_are_denied_and_git_keeps_working(
    mode: LinuxMode, run_as: int, base: Path
) -> None:
    home = base / "home"
    crew = home / ".crew"
    agent, runtime = crew / "agents" / "a1", crew / "runtime" / "r1" / "agents" / "a1"
    work = agent / "work"
    for path in (work, runtime / "tmp", crew / "sockets"):
        path.mkdir(parents=True, mode=0o700)
    make_repo(work / "repo")
    (agent / "probe.sh").write_text(PROBE)
    for path in [home, *home.rglob("*")]:
        os.lchown(path, run_as, run_as)
    policy = SandboxPolicy(
        home=home,
        crew_home=crew,
        agent_dir=agent,
        runtime_dir=runtime,
        tmp_dir=runtime / "tmp",
        work_dir=work,
        guarded_git=guarded_git_dirs(work),
    )
    assert policy.guarded_git == (work / "repo" / ".git",)
    argv = BwrapBackend(tools_for(run_as, 256), mode).argv(
        policy, ["/bin/sh", str(agent / "probe.sh")]
    )
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(agent),
        "TMPDIR": str(runtime / "tmp"),
        "LANG": "C.UTF-8",
        "WORK": str(work),
        "GIT_CONFIG_NOSYSTEM": "1",
        **{
            f"GIT_{who}_{what}": value
            for who in ("AUTHOR", "COMMITTER")
            for what, value in (("NAME", "agent"), ("EMAIL", "agent@crew"))
        },
    }
    other = run_as != os.getuid()
    done = subprocess.run(
        argv,
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        start_new_session=True,
        user=run_as if other else None,
        group=run_as if other else None,
        extra_groups=[] if other else None,
    )
    results = probe_results(done.stdout)
    assert done.returncode == 0 and results, (done.returncode, done.stdout, done.stderr)
    for attack in ("hook", "hook_chmod", "fsmonitor", "hookspath", "swap_git", "remove_hooks"):
        rc, out = results[attack]
        assert rc != 0, f"{attack} was NOT denied: {out}"
    assert results["commit_existing"][0] == 0, results["commit_existing"]
    assert results["new_repo"][0] == 0, results["new_repo"]
    assert not (work / "repo" / ".git" / "hooks" / "pre-commit").exists()
    assert (work / "repo" / ".git" / "hooks" / "pre-commit.sample").exists()
    assert "second" in _git(work / "repo", "log", "--oneline", uid=run_as)
    _host_git_runs_nothing_planted(work / "repo", work, run_as)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["hybrid", "tmpfs"])
def test_through_the_launcher_a_planted_commondir_is_removed_and_new_repos_guarded_next(
    mode: str, needs_bwrap: None, isolated_home: Path, tmp_path: Path
) -> None:
    if shutil.which("git") is None:
        required_in_ci("git")
    layout = make_layout(isolated_home)
    layout.add_agent("alice")
    work = layout.agent_dir("alice") / "work"
    make_repo(work / "repo")
    evil = work / "evil-git"
    evil.mkdir()
    (evil / "config").write_text(f"[core]\n\tfsmonitor = echo pwned > {work}/pwned\n")
    opencode = write_fake_opencode(tmp_path / "engine-bin")
    launcher = LauncherProcess(layout, opencode, mode=mode)
    env_path = f"{layout.bin_dir}:/usr/local/bin:/usr/bin:/bin"
    first = {
        "commondir": ["sh", "-c", f"echo {evil} > {work}/repo/.git/commondir"],
        "config": ["git", "-C", f"{work}/repo", "config", "core.fsmonitor", "true"],
        "new_repo": ["git", "init", "-q", f"{work}/fresh"],
        "new_hook": ["sh", "-c", f"echo x > {work}/fresh/.git/hooks/pre-commit"],
    }
    second = {"new_hook": ["sh", "-c", f"echo y > {work}/fresh/.git/hooks/post-commit"]}
    try:
        runs = []
        for commands in (first, second):
            body = layout.run_request("alice", {"scenario": "commands", "commands": commands})
            body["env"]["PATH"] = env_path
            lines = engine_lines(launcher.run(body))
            runs.append({x["check"]: x["rc"] for x in lines if "rc" in x})
    finally:
        launcher.stop()
    assert runs[0]["commondir"] == 0  # cannot be denied before it exists on Linux…
    assert not (work / "repo" / ".git" / "commondir").exists()  # …so it is removed after the run
    assert runs[0]["config"] != 0
    # A repository made during a turn is writable in that turn (the documented residual)…
    assert runs[0]["new_repo"] == 0 and runs[0]["new_hook"] == 0
    # …and guarded from the next turn on.
    assert runs[1]["new_hook"] != 0
    assert not (work / "fresh" / ".git" / "hooks" / "post-commit").exists()
    _host_git_runs_nothing_planted(work / "repo", work)
