"""The tool shell (`sandbox_launcher.tool_shell`): its scripts, its place in bwrap's argv,
and the helper's `--tool-shell` on its own, each rule for both helpers: the Python one
(`landlock.tool_shell`) and the native one (`native/crew-tool-shell.c`), run by hand and
through the `#!` script a sandbox's `$SHELL` is. Through a real sandbox: test_matrix.py."""

from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from crew_common.launcher_wire import SERVER_PASSWORD_KEY
from sandbox_launcher import backend as backend_module
from sandbox_launcher import landlock, landlock_exec, tool_shell
from sandbox_launcher.backend import (
    NO_RG_NOTE,
    NO_TOOL_DOMAIN_NOTE,
    SLOW_TOOL_SHELL_NOTE,
    TMPFS_NOTE,
    BwrapBackend,
    health_note,
    open_backend,
    with_tool_shells,
)
from sandbox_launcher.bwrap import LinuxMode, SandboxUnavailable, bwrap_argv
from sandbox_launcher.tool_shell import (
    NATIVE_NAME,
    NATIVE_SOURCE,
    engine_bin_dir,
    native_engine_child_script,
    native_tool_shell,
    native_tool_shell_script,
    tool_shell_path,
    tool_shell_script,
    write_tool_shells,
)
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


def test_the_python_shells_are_written_once_into_a_directory_named_by_their_content(
    tmp_path: Path,
) -> None:
    def write(python: str) -> Path:
        return write_tool_shells(tmp_path, python, "/opt/crew/landlock_exec.py", native=None)

    shells = write("/usr/bin/python3")
    assert shells.parent == tmp_path
    for mode in LinuxMode:
        path = tool_shell_path(shells, mode.value)
        assert path.name == "bash"  # what OpenCode tells the model and whose rules it follows
        assert path.stat().st_mode & 0o777 == 0o755
        assert f"--tool-shell {mode.value}" in path.read_text()
    assert not (shells / NATIVE_NAME).exists()
    before = {p: p.stat().st_mtime_ns for p in shells.rglob("bash")}
    assert write("/usr/bin/python3") == shells
    assert {p: p.stat().st_mtime_ns for p in shells.rglob("bash")} == before
    other = write("/usr/local/bin/python3")
    assert other != shells and tool_shell_path(shells, "hybrid").exists()


def _native() -> Path:
    """The native helper scripts/setup built (required in CI)."""
    native = native_tool_shell()
    if native is None:
        required_in_ci("the native tool shell (scripts/setup builds it with gcc)")
    assert native is not None
    return native


def test_the_native_shells_run_a_copy_of_the_helper_from_their_first_line(
    tmp_path: Path,
) -> None:
    native = _native()
    shells = write_tool_shells(tmp_path, "/usr/bin/python3", "/opt/crew/landlock_exec.py")
    copy = shells / NATIVE_NAME
    assert copy.read_bytes() == native.read_bytes() and copy.stat().st_mode & 0o777 == 0o755
    for mode in LinuxMode:
        assert tool_shell_path(shells, mode.value).read_text() == (
            f"#!{copy} --tool-shell={mode.value}\n"
        )
        git = engine_bin_dir(shells, mode.value) / "git"
        assert git.read_text().startswith(f"#!{copy} --engine-child={mode.value}:git:/")
    # Written once; another helper (a rebuilt source) is another directory.
    assert write_tool_shells(tmp_path, "/usr/bin/python3", "/opt/crew/landlock_exec.py") == shells
    other_helper = tmp_path / "other-helper"
    other_helper.write_bytes(native.read_bytes() + b"\0")
    other = write_tool_shells(
        tmp_path, "/usr/bin/python3", "/opt/crew/landlock_exec.py", native=other_helper
    )
    assert other != shells and (other / NATIVE_NAME).read_bytes().endswith(b"\0")


def test_a_first_line_the_kernel_would_cut_or_split_goes_through_sh() -> None:
    assert native_tool_shell_script("/c/crew-tool-shell", "tmpfs") == (
        "#!/c/crew-tool-shell --tool-shell=tmpfs\n"
    )
    long = "/c" * 130 + "/crew-tool-shell"
    for helper in (long, "/my crew/crew-tool-shell"):
        assert native_tool_shell_script(helper, "hybrid").splitlines() == [
            "#!/bin/sh",
            f'exec {shlex.quote(helper)} --tool-shell hybrid "$@"',
        ]
    assert native_engine_child_script("/c/h", "tmpfs", "rg", None) == (
        "#!/c/h --engine-child=tmpfs:rg:\n"
    )
    assert native_engine_child_script("/c/h", "tmpfs", "git", "/opt/my git") == (
        "#!/bin/sh\nexec /c/h --engine-child tmpfs git '/opt/my git' \"$@\"\n"
    )


def test_the_sh_form_runs_the_native_helper_too(tmp_path: Path) -> None:
    # A crew home whose path the kernel would split: the script goes through /bin/sh.
    helper = tmp_path / "my crew" / NATIVE_NAME
    helper.parent.mkdir()
    shutil.copy(_native(), helper)
    script = tmp_path / "bash"
    script.write_text(native_tool_shell_script(str(helper), "tmpfs"))
    script.chmod(0o755)
    assert script.read_text().startswith("#!/bin/sh\n")
    done = subprocess.run(
        [str(script), "-c", 'echo "$0 $CREW_TOOL_DOMAIN"'],
        env={"PATH": "/usr/bin:/bin", "OPENCODE_AUTH_CONTENT": "x"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "bash 1\n"), done.stderr


def test_the_native_helper_knows_the_same_names_as_the_python_one() -> None:
    source = NATIVE_SOURCE.read_text()
    block = re.search(r"ENGINE_ONLY\[\] = \{(.*?)NULL", source, re.S)
    assert block is not None
    assert re.findall(r'"([A-Z_]+)"', block.group(1)) == [
        v.decode() for v in landlock.ENGINE_ONLY_VARIABLES
    ]
    assert f'#define TOOL_DOMAIN_MARKER "{landlock.TOOL_DOMAIN_MARKER.decode()}"' in source
    assert f'#define ENGINE_BIN_SUFFIX "/{landlock.ENGINE_BIN_NAME}"' in source
    assert f'#define TOOL_SHELL "{landlock.TOOL_SHELL}"' in source
    assert f'#define FALLBACK_SHELL "{landlock.FALLBACK_SHELL}"' in source
    assert f"#define SCOPE_ABI {landlock.SCOPE_ABI}" in source


def test_without_the_native_helper_health_says_so_and_ci_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert health_note(LinuxMode.HYBRID, 7, slow_tool_shell=True) == SLOW_TOOL_SHELL_NOTE
    # Nothing built and no compiler: the Python helper, outside CI.
    monkeypatch.setattr(tool_shell, "NATIVE_BUILD_DIR", tmp_path / "no-build")
    monkeypatch.setattr(
        backend_module,
        "build_native_tool_shell",
        lambda into: tool_shell.build_native_tool_shell(into, path=str(tmp_path / "none")),
    )
    monkeypatch.delenv("CI", raising=False)
    tools = with_tool_shells(TOOLS, tmp_path / "base")
    assert tools.tool_shells is not None and not (tools.tool_shells / NATIVE_NAME).exists()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(SandboxUnavailable, match="CI=true allows no fallback"):
        with_tool_shells(TOOLS, tmp_path / "base")
    # Asked for by name (the matrix's python column), the Python helper runs in CI too.
    tools = with_tool_shells(TOOLS, tmp_path / "base", native=None)
    assert tools.tool_shells is not None and not (tools.tool_shells / NATIVE_NAME).exists()


def test_an_installed_launcher_builds_the_native_helper_once_from_the_packaged_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wheel, pipx or `pip install --user` has no scripts/setup build: the launcher
    builds one with the system's cc below its tool shells' base, then reuses it."""
    if shutil.which("cc", path=tool_shell.SYSTEM_PATH) is None:
        required_in_ci("a C compiler (scripts/setup installs gcc)")
        pytest.skip("no C compiler on this machine")
    monkeypatch.setattr(tool_shell, "NATIVE_BUILD_DIR", tmp_path / "no-build")
    assert native_tool_shell() is None
    tools = with_tool_shells(TOOLS, tmp_path / "base")
    built = list((tmp_path / "base" / tool_shell.NATIVE_DIR_NAME).iterdir())
    assert [p.name for p in built] == [tool_shell.native_build_path().name]
    assert tools.tool_shells is not None
    assert (tools.tool_shells / NATIVE_NAME).read_bytes() == built[0].read_bytes()
    # It is the helper: it runs a command in a nested domain like scripts/setup's build.
    done = subprocess.run(
        [str(built[0]), "--tool-shell", "hybrid", "-c", "echo built"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "built\n"), done.stderr
    # The second start reuses it: no compiler needed any more.
    mtime = built[0].stat().st_mtime_ns
    assert tool_shell.build_native_tool_shell(built[0].parent, path=str(tmp_path)) == built[0]
    assert built[0].stat().st_mtime_ns == mtime


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


# Each helper as a sandbox's `$SHELL` starts it: Python, native by hand, native by `#!`.
HELPERS = ["python", "native", "native-script"]


@functools.cache
def _scripts_base() -> Path:
    """This test process's own directory for the `#!` scripts (removed at its exit)."""
    base = Path(tempfile.mkdtemp(prefix="crew-tool-shell-test-"))
    atexit.register(shutil.rmtree, base, ignore_errors=True)
    return base


def _helper_argv(helper: str, flag: str, *args: str) -> list[str]:
    """`--tool-shell MODE …` or `--engine-child MODE NAME REAL …` run by `helper`."""
    if helper == "python":
        return [PYTHON, "-I", "-S", landlock_exec.__file__, flag, *args]
    native = _native()
    if helper == "native":
        return [str(native), flag, *args]
    # The script a sandbox's $SHELL (or the engine's git) is: `#!<copy> --flag=…`.
    shells = write_tool_shells(_scripts_base(), PYTHON, landlock_exec.__file__)
    if flag == "--tool-shell":
        text = native_tool_shell_script(str(shells / NATIVE_NAME), args[0])
        rest = args[1:]
    else:
        text = native_engine_child_script(
            str(shells / NATIVE_NAME), args[0], args[1], args[2] or None
        )
        rest = args[3:]
    script = shells / f"{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    if not script.exists():
        script.write_text(text)
        script.chmod(0o755)
    return [str(script), *rest]


def _tool_shell(
    mode: str, command: str, helper: str = "python", **env: str
) -> subprocess.CompletedProcess[str]:
    argv = _helper_argv(helper, "--tool-shell", mode, "-c", command)
    env = {"PATH": "/usr/bin:/bin", **env}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=20, check=False)


@pytest.mark.parametrize("helper", HELPERS)
@pytest.mark.parametrize("mode", ["hybrid", "tmpfs"])
def test_a_tool_cannot_open_the_memory_of_what_started_it(mode: str, helper: str) -> None:
    if landlock.abi() < 1:
        required_in_ci("Landlock (Linux 5.13+)")
    probe = 'echo "$0 $CREW_TOOL_DOMAIN"; exec 3<>"/proc/$PPID/mem"'
    done = _tool_shell(mode, probe, helper)
    assert done.stdout == "bash 1\n"  # bash, marked as nested for its own $SHELL -c
    assert done.returncode != 0 and "Permission denied" in done.stderr, done.stderr
    # Already nested (the marker): no new layer, the same shell.
    nested = _tool_shell(mode, 'echo "$0 $CREW_TOOL_DOMAIN"', helper, CREW_TOOL_DOMAIN="1")
    assert (nested.returncode, nested.stdout) == (0, "bash 1\n"), nested.stderr


@pytest.mark.parametrize("helper", HELPERS)
def test_a_tool_cannot_signal_what_started_it(helper: str) -> None:
    # Landlock's signal scope (ABI 6): the engine can kill its tools, they cannot kill it.
    if landlock.abi() < landlock.SCOPE_ABI:
        required_in_ci("Landlock ABI 6 (Linux 6.12+)")
    for mode in ("hybrid", "tmpfs"):
        done = _tool_shell(mode, 'kill -0 "$PPID" && echo REACHED', helper)
        assert "REACHED" not in done.stdout and "Operation not permitted" in done.stderr, (
            mode,
            done.stderr,
        )
    # The positive control: without the tool shell the same probe reaches its parent.
    plain = subprocess.run(
        ["bash", "-c", 'kill -0 "$PPID" && echo REACHED'], capture_output=True, text=True
    )
    assert plain.stdout == "REACHED\n", plain.stderr


@pytest.mark.parametrize("helper", HELPERS)
def test_the_tool_shell_passes_arguments_as_bash_gets_them(helper: str) -> None:
    # `$SHELL -c COMMAND NAME ARGS…` as OpenCode and a tool's own scripts run it.
    done = subprocess.run(
        _helper_argv(helper, "--tool-shell", "tmpfs", "-c", 'echo "$0|$1|$#"', "n a", "x y"),
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "n a|x y|1\n"), done.stderr
    # Interactive, commands on stdin (a terminal's `bash -i`).
    done = subprocess.run(
        _helper_argv(helper, "--tool-shell", "tmpfs", "-s"),
        input='echo "from stdin $CREW_TOOL_DOMAIN"\nexit 3\n',
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout) == (3, "from stdin 1\n"), done.stderr


@pytest.mark.parametrize("helper", HELPERS)
def test_without_bash_the_tool_shell_falls_back_to_sh(tmp_path: Path, helper: str) -> None:
    # OpenCode's own fallback when no bash is on PATH.
    done = _tool_shell("tmpfs", "echo fallback", helper, PATH=str(tmp_path))
    assert (done.returncode, done.stdout) == (0, "fallback\n"), done.stderr


@pytest.mark.parametrize("helper", HELPERS)
def test_a_bash_that_cannot_run_is_said_not_replaced_by_sh(tmp_path: Path, helper: str) -> None:
    # As os.execvp: a later bash on PATH still runs, but when none does the first error
    # other than "not there" is said (no fallback to /bin/sh, which is for "no bash").
    (tmp_path / "bash").write_text("not a program")
    (tmp_path / "bash").chmod(0o644)
    later = _tool_shell("tmpfs", "echo RAN", helper, PATH=f"{tmp_path}:/usr/bin:/bin")
    assert (later.returncode, later.stdout) == (0, "RAN\n"), later.stderr
    done = _tool_shell("tmpfs", "echo RAN", helper, PATH=str(tmp_path))
    assert done.returncode == landlock.EXIT_SETUP_FAILED and "RAN" not in done.stdout
    assert "cannot run bash: Permission denied" in done.stderr, done.stderr


@pytest.mark.parametrize("helper", HELPERS)
def test_the_tool_shell_refuses_an_unknown_mode_and_runs_nothing(helper: str) -> None:
    done = _tool_shell("paranoid", "echo RAN", helper)
    assert done.returncode == landlock.EXIT_SETUP_FAILED
    assert "RAN" not in done.stdout and "expected hybrid or tmpfs" in done.stderr


ENGINE_SECRETS = {
    SERVER_PASSWORD_KEY: "secret-of-the-server",
    "OPENCODE_AUTH_CONTENT": '{"acme": {"type": "api", "key": "sk-users-own-key"}}',
    "OPENCODE_CONFIG_CONTENT": '{"provider": {"gw": {"options": {"apiKey": "sk-cfg"}}}}',
}


@pytest.mark.parametrize("helper", HELPERS)
@pytest.mark.parametrize("mode", ["hybrid", "tmpfs"])
def test_the_engines_secrets_do_not_reach_the_tool(mode: str, helper: str) -> None:
    # With the password a tool could drive its warm server's API (`POST /mcp` starts a
    # command); the other two hold the user's provider keys (issue 20: `printenv`).
    if landlock.abi() < 1:
        required_in_ci("Landlock (Linux 5.13+)")
    assert {k.encode() for k in ENGINE_SECRETS} == set(landlock.ENGINE_ONLY_VARIABLES)
    done = _tool_shell(mode, "printenv; echo end", helper, KEPT="yes", **ENGINE_SECRETS)
    assert done.returncode == 0, done.stderr
    assert "KEPT=yes" in done.stdout and done.stdout.endswith("end\n")
    for name, value in ENGINE_SECRETS.items():
        assert name not in done.stdout and value not in done.stdout


@pytest.mark.parametrize("helper", HELPERS)
def test_a_tools_path_loses_the_engines_own_programs(helper: str) -> None:
    engine_bin = f"{SHELLS}/hybrid/crew-engine-bin"
    path = f"{engine_bin}:/usr/bin:{engine_bin}/::crew-engine-bin:/bin"
    done = _tool_shell("tmpfs", 'echo "$PATH"', helper, PATH=path)
    assert (done.returncode, done.stdout) == (0, "/usr/bin::crew-engine-bin:/bin\n"), done.stderr


def _engine_child(
    helper: str, name: str, real: str, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    argv = _helper_argv(helper, "--engine-child", "hybrid", name, real, *args)
    env = {"PATH": f"{SHELLS}/hybrid/crew-engine-bin:/usr/bin:/bin", **env}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=20, check=False)


@pytest.mark.parametrize("helper", HELPERS)
def test_an_engine_child_runs_the_real_program_confined_and_without_secrets(
    helper: str,
) -> None:
    if landlock.abi() < 1:
        required_in_ci("Landlock (Linux 5.13+)")
    probe = (
        'echo "$0|$1|$CREW_TOOL_DOMAIN|$PATH|$GIT_CONFIG_GLOBAL|$GIT_CONFIG_NOSYSTEM";'
        ' env | grep -c ^OPENCODE_; exec 3<>"/proc/$PPID/mem"'
    )
    done = _engine_child(helper, "git", "/bin/sh", "-c", probe, "arg", **ENGINE_SECRETS)
    # $0 is the argument after -c, as bash has it; the tool's marker set; no engine bin.
    assert done.stdout == "arg||1|/usr/bin:/bin|/dev/null|1\n0\n", done.stderr
    assert "Permission denied" in done.stderr, done.stderr
    rg = _engine_child(
        helper, "rg", "/bin/sh", "-c", 'echo "$0 $CREW_TOOL_DOMAIN $GIT_CONFIG_GLOBAL"'
    )
    assert (rg.returncode, rg.stdout) == (0, "rg 1 \n"), rg.stderr  # no git config for rg


@pytest.mark.parametrize("helper", HELPERS)
def test_an_engine_child_that_is_not_installed_says_so(helper: str) -> None:
    done = _engine_child(helper, "rg", "", "pattern")
    assert done.returncode == landlock.EXIT_NOT_FOUND
    assert "rg is not installed on this Computer" in done.stderr


def test_the_launcher_uses_the_native_helper_when_it_is_built(
    needs_bwrap: None, tmp_path: Path
) -> None:
    # As the launcher opens its backend: the shells run the native helper, the health
    # has no word about a slow tool shell (it has one without: the test above).
    native = _native()
    backend, health = open_backend(LinuxMode.TMPFS, tool_shell_base=tmp_path / "tool-shell")
    assert isinstance(backend, BwrapBackend) and health.ok, health
    shells = backend.tools.tool_shells
    assert shells is not None and (shells / NATIVE_NAME).read_bytes() == native.read_bytes()
    assert SLOW_TOOL_SHELL_NOTE not in (health.reason or "")
