"""The user's toolchains under `$HOME` run in the sandbox; secret places never open (issue 11).

A fake home with the layouts of pyenv (a version linked from `~/.local/bin`),
a venv tool (`#!` interpreter in `$HOME`), nvm, and rustup (`~/.cargo/bin`
proxies, toolchains in `~/.rustup`), next to secrets (`~/.ssh`, a keyring,
cargo's credentials). Checked three ways: which read roots the launcher
derives from `PATH` (pure table), a run of each tool inside the real sandbox
in both Linux modes as root and as an unprivileged user (the argv the
launcher builds), and the real launcher process (`/health`'s `not_granted`,
`RUSTUP_HOME`, `--read-only-root`).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from crew_common.secret_places import SECRET_PLACES
from sandbox_launcher.backend import BwrapBackend
from sandbox_launcher.bwrap import LinuxMode
from sandbox_launcher.policy import SandboxPolicy
from sandbox_launcher.seatbelt import profile_text, seatbelt_params
from sandbox_launcher.toolchains import read_only_roots, toolchain_roots
from tests.launcher.helpers import (
    LauncherProcess,
    engine_lines,
    make_layout,
    probe_uid,
    public_temp_dir,
    run_probe,
    tools_for,
    write_fake_opencode,
)

SSH_KEY = "-----BEGIN FAKE KEY-----\n"


def _script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def _data(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@dataclasses.dataclass
class FakeHome:
    """A home with toolchains and secrets; `path` is what the user's PATH holds."""

    home: Path

    def __post_init__(self) -> None:
        h = self.home
        pyenv = h / ".pyenv" / "versions" / "3.11.9"
        _script(pyenv / "bin" / "pytool", f"#!/bin/sh\ncat {pyenv}/lib/data.txt\n")
        _data(pyenv / "lib" / "data.txt", "pyenv-tool-ok\n")
        _script(h / ".pyenv" / "shims" / "pytool", f"#!/bin/sh\nexec {pyenv}/bin/pytool\n")
        (h / ".local" / "bin").mkdir(parents=True)
        (h / ".local" / "bin" / "pytool").symlink_to(pyenv / "bin" / "pytool")
        venv = h / ".venvs" / "tool"
        _script(venv / "bin" / "interp", f"#!/bin/sh\ncat {venv}/marker.txt\n")
        _data(venv / "marker.txt", "venv-tool-ok\n")
        _script(h / ".local" / "bin" / "venvtool", f"#!{venv}/bin/interp\n")
        _data(h / ".local" / "share" / "keyrings" / "login.keyring", "KEYRING\n")
        node = h / ".nvm" / "versions" / "node" / "v20.11.0"
        _script(node / "bin" / "nodetool", f"#!/bin/sh\ncat {node}/lib/node_modules/x.txt\n")
        _data(node / "lib" / "node_modules" / "x.txt", "node-tool-ok\n")
        _script(h / ".cargo" / "bin" / "rustup", "#!/bin/sh\necho rustup\n")
        cargo = '#!/bin/sh\ncat "$RUSTUP_HOME/toolchains/stable/lib/rust.txt"\n'
        _script(h / ".cargo" / "bin" / "cargo", cargo)
        _data(h / ".cargo" / "credentials.toml", "token = 'CARGO-SECRET'\n")
        _data(h / ".rustup" / "toolchains" / "stable" / "lib" / "rust.txt", "rust-tool-ok\n")
        _data(h / ".ssh" / "id_rsa", SSH_KEY)
        _script(h / ".ssh" / "bin" / "evil", "#!/bin/sh\necho evil-ran\n")
        _data(h / "src" / "repo" / "README", "repo-readme-ok\n")

    @property
    def path(self) -> str:
        h = self.home
        entries = [
            h / ".local" / "bin",
            h / ".nvm" / "versions" / "node" / "v20.11.0" / "bin",
            h / ".cargo" / "bin",
            h / ".ssh" / "bin",
        ]
        return ":".join([*map(str, entries), "/usr/bin", "/bin"])

    @property
    def repo(self) -> Path:
        return self.home / "src" / "repo"


# ---- which roots (no sandbox) ----


def test_path_entries_resolve_into_their_toolchain_roots(tmp_path: Path) -> None:
    home = tmp_path / "home"
    fake = FakeHome(home)
    roots = toolchain_roots(fake.path, home, home / ".crew", {})
    assert sorted(roots.dirs) == sorted(
        [
            home / ".local" / "bin",  # not ~/.local: it holds the keyring
            home / ".pyenv" / "versions" / "3.11.9",  # ~/.local/bin/pytool links there
            home / ".venvs" / "tool",  # the interpreter of ~/.local/bin/venvtool
            home / ".nvm" / "versions" / "node" / "v20.11.0",
            home / ".cargo" / "bin",  # not ~/.cargo: it holds credentials.toml
            home / ".rustup",  # rustup's proxies are in ~/.cargo/bin
        ]
    )
    assert roots.rustup_home == home / ".rustup"
    assert len(roots.refused) == 1 and str(home / ".ssh") in roots.refused[0]

    shims = toolchain_roots(str(home / ".pyenv" / "shims"), home, home / ".crew", {})
    assert shims.dirs == [home / ".pyenv"] and shims.refused == []


SECRET_CASES = [*SECRET_PLACES, ".crew/agents/other"]


@pytest.mark.parametrize("place", SECRET_CASES)
@pytest.mark.parametrize("shape", ["the place", "a bin inside it", "a link into it"])
def test_a_secret_place_on_path_is_never_granted(tmp_path: Path, place: str, shape: str) -> None:
    home = tmp_path / "home"
    secret = home / place
    _script(secret / "bin" / "tool", "#!/bin/sh\necho tool\n")
    if shape == "the place":
        entry = secret
    elif shape == "a bin inside it":
        entry = secret / "bin"
    else:
        entry = home / "bin"
        entry.mkdir()
        (entry / "tool").symlink_to(secret / "bin" / "tool")
    roots = toolchain_roots(f"{entry}:/usr/bin", home, home / ".crew", {})
    assert not any(d == secret or secret in d.parents for d in roots.dirs), roots.dirs
    assert not any(secret in d.parents or d == secret for d in roots.dirs)
    assert len(roots.refused) == 1, roots.refused
    assert "secret place" in roots.refused[0] or "crew home" in roots.refused[0]


def test_seatbelt_grants_the_roots_as_read_params(tmp_path: Path) -> None:
    home = tmp_path / "home"
    fake = FakeHome(home)
    roots = toolchain_roots(fake.path, home, home / ".crew", {})
    policy = SandboxPolicy(
        home=home,
        crew_home=home / ".crew",
        agent_dir=home / ".crew" / "agents" / "a",
        runtime_dir=home / ".crew" / "runtime" / "r" / "agents" / "a",
        tmp_dir=home / ".crew" / "runtime" / "r" / "agents" / "a" / "tmp",
        work_dir=home / ".crew" / "agents" / "a" / "work",
        read_dirs=tuple(roots.dirs),
    )
    params = dict(seatbelt_params(policy))
    granted = {Path(v) for k, v in params.items() if k.startswith("READ_DIR_")}
    assert granted == set(roots.dirs)
    assert f'(subpath (param "READ_DIR_{len(roots.dirs) - 1}"))' in profile_text(len(roots.dirs), 0)


@pytest.mark.parametrize("entry", ["", "{home}", "/"])
def test_home_itself_on_path_is_refused_and_relative_entries_ignored(
    tmp_path: Path, entry: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    text = entry.format(home=home)
    roots = toolchain_roots(f"{text}:relative/bin", home, home / ".crew", {})
    assert roots.dirs == []
    if text == str(home):
        assert roots.refused and "contains $HOME" in roots.refused[0]


def test_read_only_roots_are_checked_against_the_same_list(tmp_path: Path) -> None:
    home = tmp_path / "home"
    fake = FakeHome(home)
    texts = [str(fake.repo), str(home / ".ssh"), str(home / ".local"), str(home / "nope")]
    roots = read_only_roots(texts, home, home / ".crew")
    assert roots.dirs == [fake.repo]
    assert [r.split(": ")[:2] for r in roots.refused] == [
        ["read_only_roots entry", f"{home / '.ssh'} is never readable in a sandbox"],
        ["read_only_roots entry", f"{home / '.local'} is never readable in a sandbox"],
        [f"read_only_roots entry {home / 'nope'}", "No such file or directory"],
    ]


# ---- inside the real sandbox, both modes, root and unprivileged ----

PROBE = """\
run() { name=$1; shift; out=$("$@" 2>&1); echo "$name $? $out"; }
run pytool pytool
run venvtool venvtool
run nodetool nodetool
run cargo cargo
run evil evil
run ssh_key cat "$REAL_HOME/.ssh/id_rsa"
run cargo_secret cat "$REAL_HOME/.cargo/credentials.toml"
run keyring cat "$REAL_HOME/.local/share/keyrings/login.keyring"
run repo_read cat "$REPO/README"
run repo_write sh -c "echo x > $REPO/new"
"""


@pytest.fixture(params=["caller", "unprivileged"])
def run_as(request: pytest.FixtureRequest, needs_bwrap: None) -> int:
    return probe_uid(request.param)


@pytest.fixture
def base() -> Iterator[Path]:
    with public_temp_dir("crew-tools-") as path:
        yield path


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", list(LinuxMode))
def test_toolchains_run_inside_the_sandbox_and_secrets_stay_shut(
    mode: LinuxMode, run_as: int, base: Path
) -> None:
    home = base / "home"
    fake = FakeHome(home)
    crew = home / ".crew"
    agent, runtime = crew / "agents" / "a1", crew / "runtime" / "r1" / "agents" / "a1"
    for path in (agent / "work", runtime / "tmp", crew / "sockets"):
        path.mkdir(parents=True, mode=0o700)
    (agent / "probe.sh").write_text(PROBE)
    for path in [home, *home.rglob("*")]:
        os.lchown(path, run_as, run_as)
    roots = toolchain_roots(fake.path, home, crew, {})
    extra = read_only_roots([str(fake.repo)], home, crew)
    policy = SandboxPolicy(
        home=home,
        crew_home=crew,
        agent_dir=agent,
        runtime_dir=runtime,
        tmp_dir=runtime / "tmp",
        work_dir=agent / "work",
        read_dirs=(*roots.dirs, *extra.dirs),
    )
    command = ["/bin/sh", str(agent / "probe.sh")]
    argv = BwrapBackend(tools_for(run_as, 64), mode).argv(policy, command)
    env = {
        "PATH": fake.path,
        "HOME": str(agent),
        "TMPDIR": str(runtime / "tmp"),
        "LANG": "C.UTF-8",
        "RUSTUP_HOME": str(roots.rustup_home),
        "REAL_HOME": str(home),
        "REPO": str(fake.repo),
    }
    results = run_probe(argv, run_as, env, agent / "work")
    assert results["pytool"] == (0, "pyenv-tool-ok")
    assert results["venvtool"] == (0, "venv-tool-ok")
    assert results["nodetool"] == (0, "node-tool-ok")
    assert results["cargo"] == (0, "rust-tool-ok")
    assert results["repo_read"] == (0, "repo-readme-ok")
    for denied in ("evil", "ssh_key", "cargo_secret", "keyring", "repo_write"):
        rc, out = results[denied]
        assert rc != 0 and "evil-ran" not in out and "SECRET" not in out, (denied, out)
        assert SSH_KEY.strip() not in out and "KEYRING" not in out
    assert not (fake.repo / "new").exists()


# ---- through the real launcher process ----


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["hybrid", "tmpfs"])
def test_the_launcher_grants_path_toolchains_and_read_only_roots(
    mode: str, needs_bwrap: None, isolated_home: Path, tmp_path: Path
) -> None:
    fake = FakeHome(isolated_home)
    layout = make_layout(isolated_home)
    layout.add_agent("alice")
    opencode = write_fake_opencode(tmp_path / "engine-bin")
    launcher = LauncherProcess(
        layout, opencode, mode=mode, env={"PATH": fake.path}, read_only_roots=(fake.repo,)
    )
    try:
        with launcher.client() as client:
            health = client.get("/health").json()
        assert health["sandbox"]["ok"], health
        not_granted = health["sandbox"]["not_granted"]
        assert len(not_granted) == 1 and str(isolated_home / ".ssh" / "bin") in not_granted[0]
        commands = {
            "pytool": ["pytool"],
            "cargo": ["cargo"],
            "repo_read": ["cat", str(fake.repo / "README")],
            "repo_write": ["sh", "-c", f"echo x > {fake.repo}/new"],
            "ssh_key": ["cat", str(isolated_home / ".ssh" / "id_rsa")],
        }
        body = layout.run_request("alice", {"scenario": "commands", "commands": commands})
        body["env"]["PATH"] = f"{layout.bin_dir}:{fake.path}"
        lines = engine_lines(launcher.run(body))
    finally:
        _, err = launcher.stop()
    results = {line["check"]: (line["rc"], line["out"].strip()) for line in lines if "rc" in line}
    assert results["pytool"] == (0, "pyenv-tool-ok"), err[-2000:]
    assert results["cargo"] == (0, "rust-tool-ok")  # RUSTUP_HOME set by the launcher
    assert results["repo_read"] == (0, "repo-readme-ok")
    assert results["repo_write"][0] != 0 and not (fake.repo / "new").exists()
    assert results["ssh_key"][0] != 0 and SSH_KEY.strip() not in results["ssh_key"][1]
    assert "not readable by agents" in err and ".ssh/bin" in err  # logged once at start
    assert err.count("not readable by agents") == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["hybrid", "tmpfs"])
def test_the_readme_recipe_names_the_users_real_path(
    mode: str, needs_bwrap: None, isolated_home: Path
) -> None:
    """README: `crew-launcher sandbox … -- sh -c 'cat /home/alice/.ssh/id_rsa'` is denied,
    `~` inside is the agent's home, and a toolchain on the user's PATH runs."""
    fake = FakeHome(isolated_home)
    layout = make_layout(isolated_home)
    layout.add_agent("alice")
    agent, runtime = layout.agent_dir("alice"), layout.runtime_dir("alice")
    script = (
        f'cat {isolated_home}/.ssh/id_rsa; echo "real_rc=$?"; '
        'cat ~/.ssh/id_rsa; echo "tilde_rc=$?"; echo "home=$HOME"; pytool'
    )
    argv = [sys.executable, "-m", "sandbox_launcher", "sandbox", "--mode", mode]
    argv += ["--agent-dir", str(agent), "--runtime-dir", str(runtime), "--", "sh", "-c", script]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "PATH": fake.path},
    )
    assert done.returncode == 0, done.stderr
    assert SSH_KEY.strip() not in done.stdout
    assert "real_rc=1" in done.stdout and "tilde_rc=1" in done.stdout
    assert f"home={agent}" in done.stdout
    assert "pyenv-tool-ok" in done.stdout
