"""The tool shell (`sandbox_launcher.tool_shell`): its scripts, its place in bwrap's argv,
and the helper's `--tool-shell` on its own. Through a real sandbox: test_matrix.py."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from crew_common.launcher_wire import SERVER_PASSWORD_KEY
from sandbox_launcher import landlock, landlock_exec
from sandbox_launcher.backend import NO_RG_NOTE, NO_TOOL_DOMAIN_NOTE, TMPFS_NOTE, health_note
from sandbox_launcher.bwrap import LinuxMode, bwrap_argv
from sandbox_launcher.tool_shell import tool_shell_path, tool_shell_script, write_tool_shells
from tests.launcher.helpers import PYTHON
from tests.launcher.test_argv import CMD, TOOLS, policy
from tests.support.ci import required_in_ci

SHELLS = Path("/home/u/.crew/tool-shell/0123456789abcdef")


def test_the_script_runs_the_helper_in_tool_shell_mode_and_quotes_its_paths() -> None:
    script = tool_shell_script("/opt/my python/bin/python3", "/opt/crew/landlock_exec.py", "tmpfs")
    assert script.startswith("#!/bin/sh\n")
    assert script.splitlines()[-1] == (
        "exec '/opt/my python/bin/python3' -I -S /opt/crew/landlock_exec.py"
        ' --tool-shell tmpfs "$@"'
    )


def test_the_shells_are_written_once_into_a_directory_named_by_their_content(
    tmp_path: Path,
) -> None:
    shells = write_tool_shells(tmp_path, "/usr/bin/python3", "/opt/crew/landlock_exec.py")
    assert shells.parent == tmp_path
    for mode in LinuxMode:
        path = tool_shell_path(shells, mode.value)
        assert path.name == "bash"  # what OpenCode tells the model and whose rules it follows
        assert path.stat().st_mode & 0o777 == 0o755
        assert f"--tool-shell {mode.value}" in path.read_text()
    before = {p: p.stat().st_mtime_ns for p in shells.rglob("bash")}
    assert write_tool_shells(tmp_path, "/usr/bin/python3", "/opt/crew/landlock_exec.py") == shells
    assert {p: p.stat().st_mtime_ns for p in shells.rglob("bash")} == before
    other = write_tool_shells(tmp_path, "/usr/local/bin/python3", "/opt/crew/landlock_exec.py")
    assert other != shells and tool_shell_path(shells, "hybrid").exists()


@pytest.mark.parametrize("mode", list(LinuxMode))
def test_the_sandbox_gets_the_tool_shell_as_shell_and_can_read_it(mode: LinuxMode) -> None:
    plain = bwrap_argv(policy(), mode, TOOLS, CMD)
    argv = bwrap_argv(policy(), mode, dataclasses.replace(TOOLS, tool_shells=SHELLS), CMD)
    shell = ["--unsetenv", "CREW_TOOL_DOMAIN", "--setenv", "SHELL", f"{SHELLS}/{mode}/bash"]
    at = argv.index("--chdir")
    assert argv[at - len(shell) : at] == shell
    del argv[at - len(shell) : at]
    # Below the crew home (a deny root): bound back (tmpfs), or a Landlock grant (hybrid).
    grant = ["--ro", str(SHELLS)] if mode is LinuxMode.HYBRID else ["--ro-bind", *[str(SHELLS)] * 2]
    at = next(i for i in range(len(argv)) if argv[i : i + len(grant)] == grant)
    del argv[at : at + len(grant)]
    # The engine's own git and rg first on its PATH (the helper puts them there).
    first = ["--path-first", f"{SHELLS}/{mode}/crew-engine-bin"]
    at = argv.index("--path-first")
    assert argv[at : at + 2] == first and argv[at - 2 : at] == ["--nproc", str(TOOLS.nproc)]
    assert argv[:at] + argv[at + 2 :] == plain


def test_without_tool_shells_there_is_no_shell() -> None:
    for mode in LinuxMode:
        argv = bwrap_argv(policy(), mode, TOOLS, CMD)
        assert "SHELL" not in argv and "--unsetenv" not in argv


def test_health_says_when_tools_cannot_be_nested() -> None:
    assert health_note(LinuxMode.HYBRID, 7) is None
    assert health_note(LinuxMode.TMPFS, 7) == TMPFS_NOTE
    assert health_note(LinuxMode.TMPFS, 0) == f"{TMPFS_NOTE}; {NO_TOOL_DOMAIN_NOTE}"
    assert "no Landlock" in NO_TOOL_DOMAIN_NOTE
    assert health_note(LinuxMode.HYBRID, 7, no_rg=True) == NO_RG_NOTE


def _tool_shell(mode: str, command: str, **env: str) -> subprocess.CompletedProcess[str]:
    argv = [PYTHON, "-I", "-S", landlock_exec.__file__, "--tool-shell", mode, "-c", command]
    env = {"PATH": "/usr/bin:/bin", **env}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=20, check=False)


@pytest.mark.parametrize("mode", ["hybrid", "tmpfs"])
def test_a_tool_cannot_open_the_memory_of_what_started_it(mode: str) -> None:
    if landlock.abi() < 1:
        required_in_ci("Landlock (Linux 5.13+)")
    probe = 'echo "$0 $CREW_TOOL_DOMAIN"; exec 3<>"/proc/$PPID/mem"'
    done = _tool_shell(mode, probe)
    assert done.stdout == "bash 1\n"  # bash, marked as nested for its own $SHELL -c
    assert done.returncode != 0 and "Permission denied" in done.stderr, done.stderr
    # Already nested (the marker): no new layer, the same shell.
    nested = _tool_shell(mode, 'echo "$0 $CREW_TOOL_DOMAIN"', CREW_TOOL_DOMAIN="1")
    assert (nested.returncode, nested.stdout) == (0, "bash 1\n"), nested.stderr


def test_without_bash_the_tool_shell_falls_back_to_sh(tmp_path: Path) -> None:
    # OpenCode's own fallback when no bash is on PATH.
    done = _tool_shell("tmpfs", "echo fallback", PATH=str(tmp_path))
    assert (done.returncode, done.stdout) == (0, "fallback\n"), done.stderr


def test_the_tool_shell_refuses_an_unknown_mode_and_runs_nothing() -> None:
    done = _tool_shell("paranoid", "echo RAN")
    assert done.returncode == landlock.EXIT_SETUP_FAILED
    assert "RAN" not in done.stdout and "expected hybrid or tmpfs" in done.stderr


ENGINE_SECRETS = {
    SERVER_PASSWORD_KEY: "secret-of-the-server",
    "OPENCODE_AUTH_CONTENT": '{"acme": {"type": "api", "key": "sk-users-own-key"}}',
    "OPENCODE_CONFIG_CONTENT": '{"provider": {"gw": {"options": {"apiKey": "sk-cfg"}}}}',
}


@pytest.mark.parametrize("mode", ["hybrid", "tmpfs"])
def test_the_engines_secrets_do_not_reach_the_tool(mode: str) -> None:
    # With the password a tool could drive its warm server's API (`POST /mcp` starts a
    # command); the other two hold the user's provider keys (issue 20: `printenv`).
    if landlock.abi() < 1:
        required_in_ci("Landlock (Linux 5.13+)")
    assert {k.encode() for k in ENGINE_SECRETS} == set(landlock.ENGINE_ONLY_VARIABLES)
    done = _tool_shell(mode, "printenv; echo end", KEPT="yes", **ENGINE_SECRETS)
    assert done.returncode == 0, done.stderr
    assert "KEPT=yes" in done.stdout and done.stdout.endswith("end\n")
    for name, value in ENGINE_SECRETS.items():
        assert name not in done.stdout and value not in done.stdout


def test_a_tools_path_loses_the_engines_own_programs() -> None:
    engine_bin = f"{SHELLS}/hybrid/crew-engine-bin"
    done = _tool_shell("tmpfs", 'echo "$PATH"', PATH=f"{engine_bin}:/usr/bin:{engine_bin}/:/bin")
    assert (done.returncode, done.stdout) == (0, "/usr/bin:/bin\n"), done.stderr
