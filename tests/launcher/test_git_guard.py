"""Planted git hooks and config (issues 12, 20): undone after each turn, git still works.

The attack (sandbox-runtime's mandatory deny of `.git/hooks` and `.git/config`):
an agent writes `.git/hooks/pre-commit`, sets `core.fsmonitor`,
`core.hooksPath`, a `!` alias or `include.path`, points `commondir`
elsewhere, swaps the whole `.git`, or does all that in a repository it makes
during the turn; the user's next `git status` or `git commit` in that
directory would run the agent's program unsandboxed. The positive controls:
`git init`, `add`, `commit`, `remote add` keep working, and (issue 20) a
repository made in an earlier turn can be removed with `rm -rf`. Both Linux
modes, as root and as an unprivileged user; the launcher process too, cold
runs and a warm server's turns.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from crew_common.launcher_wire import ServerRequest
from sandbox_launcher.backend import BwrapBackend
from sandbox_launcher.bwrap import LinuxMode
from sandbox_launcher.git_guard import (
    SAFE_CONFIG_KEYS,
    baseline,
    config_text,
    find_git_dirs,
    guarded_git_dirs,
    kept_entries,
    open_below,
    parse_config_list,
    prepare_guard,
    restore,
)
from sandbox_launcher.policy import SandboxPolicy
from sandbox_launcher.seatbelt import profile_text, seatbelt_params
from tests.launcher.helpers import (
    CrewLayout,
    LauncherProcess,
    engine_lines,
    make_layout,
    probe_uid,
    public_temp_dir,
    run_probe,
    tools_for,
    write_fake_opencode,
)
from tests.launcher.inprocess import SECRET, inprocess_app, inprocess_launcher
from tests.launcher.test_warm_requests import PASSWORD, server_body
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


def test_seatbelt_renders_the_guard(tmp_path: Path) -> None:
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
    # Linux binds nothing in a repository any more (a mount point cannot be removed).
    assert str(g) not in BwrapBackend(tools_for(os.getuid(), 64), LinuxMode.TMPFS).argv(
        policy, ["true"]
    )
    text = profile_text(0, 0, 1)
    used = set(re.findall(r'\(param "([A-Z_0-9]+)"\)', text))
    params = dict(seatbelt_params(policy))
    assert used == set(params)
    assert params["GIT_COMMONDIR_0"] == f"{g}/commondir"
    # The deny comes after the allow of the agent dir: in Seatbelt the last match wins.
    assert text.index('(deny file-write* (literal (param "GIT_DIR_0"))') > text.index(
        '(allow file-write*\n  (subpath (param "AGENT_DIR"))'
    )


def test_a_repository_reached_through_a_link_is_never_touched(tmp_path: Path) -> None:
    # A path swapped for a link (to the user's own repository) after it was found.
    work = tmp_path / "work"
    work.mkdir()
    users = make_repo(tmp_path / "dotfiles")
    (users / "hooks" / "pre-commit").write_text("#!/bin/sh\n# the user's\n")
    (work / "a").symlink_to(users.parent)
    with pytest.raises(OSError):
        open_below(work, work / "a" / ".git")
    assert restore(baseline(work)) == []
    assert (users / "hooks" / "pre-commit").exists()


# ---- the config filter (pure) ----


def test_config_entries_round_trip_and_only_safe_keys_are_added() -> None:
    listed = (
        b"core.repositoryformatversion\n0\0core.bare\nfalse\0core.fsmonitor\necho x\0"
        b'remote.My "R".url\nhttps://h/r\0branch.main.description\na\n"b"\\c\0core.flag\0'
    )
    entries = parse_config_list(listed)
    assert entries[-1] == ("core.flag", None)
    before = frozenset({("core.flag", None)})
    kept = kept_entries(entries, before)
    assert [k for k, _ in kept] == [
        "core.repositoryformatversion",
        "core.bare",
        'remote.My "R".url',
        "branch.main.description",
        "core.flag",
    ]
    text = config_text(kept).decode()
    assert '[remote "My \\"R\\""]' in text and '\tdescription = "a\\n\\"b\\"\\\\c"' in text
    for key in ("core.fsmonitor", "core.hookspath", "core.sshcommand", "core.pager", "alias.st"):
        assert not SAFE_CONFIG_KEYS.fullmatch(key), key
    for key in ("include.path", "includeif.gitdir:/x.path", "filter.x.clean", "diff.x.textconv"):
        assert not SAFE_CONFIG_KEYS.fullmatch(key), key


def test_the_rewritten_config_reads_back_the_same(tmp_path: Path) -> None:
    git_dir = make_repo(tmp_path / "r")
    entries = [("user.name", 'a "quoted"\\name'), ("remote.o r.url", "x\ty"), ("core.bare", None)]
    (git_dir / "config").write_bytes(config_text(entries))
    listed = subprocess.run(
        ["git", "config", "--file", str(git_dir / "config"), "--list", "-z"],
        capture_output=True,
        check=True,
    ).stdout
    assert parse_config_list(listed) == entries


# ---- the attack and the control, in the real sandbox ----

PROBE = """\
run() { name=$1; shift; out=$("$@" 2>&1); echo "$name $? $(echo $out | head -c 200)"; }
evil() { printf '#!/bin/sh\\necho pwned > %s/pwned\\n' "$WORK" > "$1" && chmod 755 "$1"; }
cd "$WORK"
# positive controls first (no planted hook may fire inside the sandbox)
run commit_existing sh -c 'echo b >> repo/a.txt && git -C repo add a.txt && git -C repo commit -qm second'
run remote_add git -C repo remote add origin https://example.invalid/r.git
run new_repo sh -c 'git init -q fresh && echo f > fresh/f && git -C fresh add f && git -C fresh commit -qm one'
run new_user git -C fresh config user.name agent-in-fresh
run rm_old_repo rm -rf old
# a repository of an earlier turn
run hook evil repo/.git/hooks/pre-commit
run changed_user_hook evil repo/.git/hooks/pre-push
run sample_made_executable chmod 755 repo/.git/hooks/pre-rebase.sample
run fsmonitor git -C repo config core.fsmonitor "echo pwned > $WORK/pwned"
run hookspath git -C repo config core.hooksPath "$WORK/evil-hooks"
run alias git -C repo config alias.st "!echo pwned > $WORK/pwned"
run commondir sh -c 'echo "$WORK/evil-git" > repo/.git/commondir'
# a repository made during the turn
run new_hook evil fresh/.git/hooks/pre-commit
run new_fsmonitor git -C fresh config core.fsmonitor "echo pwned > $WORK/pwned"
run new_include git -C fresh config include.path "$WORK/evil.config"
run new_hooks_link sh -c 'git init -q linked && rm -rf linked/.git/hooks && ln -s "$WORK/evil-hooks" linked/.git/hooks'
run evil_hooks sh -c 'mkdir -p evil-hooks && printf "#!/bin/sh\\necho pwned > $WORK/pwned\\n" > evil-hooks/pre-commit && chmod 755 evil-hooks/pre-commit'
run evil_config sh -c 'printf "[core]\\n\\tfsmonitor = echo pwned > $WORK/pwned\\n" > evil.config'
# a swapped .git
run swap_git sh -c 'mv swap/.git swap/.git-old && git init -q swap && git -C swap config core.fsmonitor "echo pwned > $WORK/pwned"'
"""
USER_HOOK = "#!/bin/sh\n# the user's own pre-push\nexit 0\n"


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
    assert not (work / "pwned").exists(), f"a planted hook or config ran as the user in {repo}"
    config = (repo / ".git" / "config").read_text()
    for planted in ("fsmonitor", "hooksPath", "hookspath", "alias", "include"):
        assert planted not in config, (repo, config)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", list(LinuxMode))
def test_what_a_turn_plants_is_undone_and_git_keeps_working(
    mode: LinuxMode, run_as: int, base: Path
) -> None:
    home = base / "home"
    crew = home / ".crew"
    agent, runtime = crew / "agents" / "a1", crew / "runtime" / "r1" / "agents" / "a1"
    work = agent / "work"
    for path in (work, runtime / "tmp", crew / "sockets"):
        path.mkdir(parents=True, mode=0o700)
    make_repo(work / "repo")
    (work / "repo" / ".git" / "hooks" / "pre-push").write_text(USER_HOOK)
    (work / "repo" / ".git" / "hooks" / "pre-push").chmod(0o755)
    make_repo(work / "old")
    make_repo(work / "swap")
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
    before = baseline(work)  # as the launcher does when a turn starts…
    results = run_probe(argv, run_as, env, work)
    # The sandbox no longer stands in the way (the repository stays the agent's)…
    for name, (rc, out) in results.items():
        assert rc == 0, f"{name} failed in the sandbox: {out}"
    assert (work / "repo" / ".git" / "hooks" / "pre-commit").exists()

    undone = restore(before)  # …and when it ends

    assert undone, "nothing was undone"
    assert not (work / "old").exists(), "rm -rf of a repository of an earlier turn"
    hooks = work / "repo" / ".git" / "hooks"
    assert not (hooks / "pre-commit").exists()
    assert (hooks / "pre-push").read_text() == USER_HOOK and os.access(hooks / "pre-push", os.X_OK)
    assert (hooks / "pre-push").stat().st_uid == run_as
    assert (hooks / "pre-commit.sample").exists()
    assert not (work / "repo" / ".git" / "commondir").exists()
    assert not (work / "fresh" / ".git" / "hooks" / "pre-commit").exists()
    assert not (work / "linked" / ".git" / "hooks").is_symlink()
    assert "second" in _git(work / "repo", "log", "--oneline", uid=run_as)
    remotes = _git(work / "repo", "remote", "-v", uid=run_as)
    assert "https://example.invalid/r.git" in remotes
    assert "agent-in-fresh" in (work / "fresh" / ".git" / "config").read_text()
    assert (work / "repo" / ".git" / "config").stat().st_uid == run_as
    for repo in ("repo", "fresh", "swap"):
        _host_git_runs_nothing_planted(work / repo, work, run_as)
    # nothing left to undo the next time
    assert restore(baseline(work)) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["hybrid", "tmpfs"])
def test_through_the_launcher_what_a_run_plants_is_undone_after_it(
    mode: str, needs_bwrap: None, isolated_home: Path, tmp_path: Path
) -> None:
    if shutil.which("git") is None:
        required_in_ci("git")
    layout = make_layout(isolated_home)
    layout.add_agent("alice")
    work = layout.agent_dir("alice") / "work"
    make_repo(work / "repo")
    make_repo(work / "old")
    evil = work / "evil-git"
    evil.mkdir()
    (evil / "config").write_text(f"[core]\n\tfsmonitor = echo pwned > {work}/pwned\n")
    opencode = write_fake_opencode(tmp_path / "engine-bin")
    launcher = LauncherProcess(layout, opencode, mode=mode)
    env_path = f"{layout.bin_dir}:/usr/local/bin:/usr/bin:/bin"
    pwn = f"echo pwned > {work}/pwned"
    first = {
        "config": ["git", "-C", f"{work}/repo", "config", "core.fsmonitor", pwn],
        "commondir": ["sh", "-c", f"echo {evil} > {work}/repo/.git/commondir"],
        "new_repo": ["git", "init", "-q", f"{work}/fresh"],
        "new_hook": ["sh", "-c", f"echo '{pwn}' > {work}/fresh/.git/hooks/pre-commit"],
        "new_config": ["git", "-C", f"{work}/fresh", "config", "core.fsmonitor", pwn],
    }
    second = {
        "rm_old_repo": ["rm", "-rf", f"{work}/old"],
        "rm_fresh": ["rm", "-rf", f"{work}/fresh"],
    }
    try:
        runs: list[dict[str, int]] = []
        states: list[dict[str, Any]] = []
        for commands in (first, second):
            body = layout.run_request("alice", {"scenario": "commands", "commands": commands})
            body["env"]["PATH"] = env_path
            lines = engine_lines(launcher.run(body))
            runs.append({x["check"]: x["rc"] for x in lines if "rc" in x})
            states.append(
                {
                    "commondir": (work / "repo" / ".git" / "commondir").exists(),
                    "new_hook": (work / "fresh" / ".git" / "hooks" / "pre-commit").exists(),
                    "fresh_config": (work / "fresh" / ".git" / "config").read_text()
                    if (work / "fresh").exists()
                    else "",
                }
            )
            if commands is first:
                _host_git_runs_nothing_planted(work / "repo", work)
                _git(work / "fresh", "status", "--short")
                assert not (work / "pwned").exists()
    finally:
        launcher.stop()
    assert all(rc == 0 for rc in runs[0].values()), runs[0]
    assert not states[0]["commondir"] and not states[0]["new_hook"], states[0]
    assert "repositoryformatversion" in states[0]["fresh_config"]
    assert "fsmonitor" not in states[0]["fresh_config"]
    assert runs[1] == {"rm_old_repo": 0, "rm_fresh": 0}
    assert not (work / "old").exists() and not (work / "fresh").exists()


@pytest.mark.anyio
async def test_a_warm_servers_turns_are_undone_at_each_sweep_and_at_its_stop(
    layout: CrewLayout, fake_opencode: Path
) -> None:
    # A warm server spans turns: the launcher learns a turn ended from its sweep.
    if shutil.which("git") is None:
        required_in_ci("git")
    layout.add_agent("alice")
    work = layout.agent_dir("alice") / "work"
    make_repo(work / "repo")
    launcher = inprocess_launcher(layout, fake_opencode)
    body = server_body(layout, "alice", OPENCODE_SERVER_PASSWORD=PASSWORD)
    server = launcher.prepare_server(ServerRequest.model_validate(body))
    launcher.servers.claim(server)  # as `Launcher.start_server` does (never started here)
    transport = httpx.ASGITransport(app=inprocess_app(launcher))
    headers = {"Authorization": f"Bearer {SECRET}"}
    hook = work / "repo" / ".git" / "hooks" / "pre-commit"
    async with httpx.AsyncClient(transport=transport, base_url="http://l", headers=headers) as c:
        # turn 1 plants a hook in the repository and makes a new one with a hook
        hook.write_text("#!/bin/sh\necho pwned\n")
        make_repo(work / "fresh")
        (work / "fresh" / ".git" / "hooks" / "post-commit").write_text("#!/bin/sh\necho pwned\n")
        assert (await c.post("/servers/alice/sweep")).status_code == 200
        assert (
            not hook.exists() and not (work / "fresh" / ".git" / "hooks" / "post-commit").exists()
        )
        # turn 2 (the last) sets fsmonitor in the repository made by turn 1
        _git(work / "fresh", "config", "core.fsmonitor", "echo pwned")
        assert (await c.post("/servers/alice/stop")).status_code == 200
    assert "fsmonitor" not in (work / "fresh" / ".git" / "config").read_text()
    assert "alice" not in launcher.server_git_baselines
