"""The Landlock helper on its own: argument parsing, the sibling enumeration, a real restriction."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from sandbox_launcher import landlock, landlock_exec
from sandbox_launcher._libc import SetupError
from sandbox_launcher.landlock import minimal_roots, parse_args, sibling_grants
from tests.launcher.helpers import PYTHON
from tests.support.ci import required_in_ci


def test_parse_args() -> None:
    plan = parse_args(["--deny", "/h", "--ro", "/h/a", "--rw", "/h/b", "--", "cat", "x"])
    assert (plan.deny, plan.ro, plan.rw, plan.command) == (["/h"], ["/h/a"], ["/h/b"], ["cat", "x"])
    assert (plan.seccomp, plan.nproc) == (False, None)
    plan = parse_args(["--seccomp", "--nproc", "64", "--", "cat"])
    assert (plan.deny, plan.seccomp, plan.nproc, plan.command) == ([], True, 64, ["cat"])
    for bad in (
        ["--deny", "/h", "cat"],
        ["--deny", "/h", "--"],
        ["--ro", "/a", "--", "cat"],
        ["--deny", "relative", "--", "cat"],
        ["--allow", "/x", "--", "cat"],
        ["--nproc", "0", "--", "cat"],
        ["--nproc", "many", "--", "cat"],
    ):
        with pytest.raises(SetupError):
            parse_args(bad)


def test_minimal_roots_drop_nested_ones() -> None:
    assert minimal_roots(["/home/u/.crew", "/home/u", "/srv/crew"]) == ["/home/u", "/srv/crew"]
    assert minimal_roots(["/home/u2", "/home/u"]) == ["/home/u", "/home/u2"]


def test_sibling_grants_cover_everything_but_the_way_to_the_deny_root(tmp_path: Path) -> None:
    home = tmp_path / "home" / "u"
    home.mkdir(parents=True)
    (tmp_path / "home" / "other").mkdir()
    (tmp_path / "opt").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "link-into-home").symlink_to(home)
    grants = sibling_grants([str(home)])
    assert str(tmp_path / "home" / "other") in grants
    assert str(tmp_path / "opt") in grants and str(tmp_path / "file") in grants
    assert str(tmp_path / "link-into-home") not in grants  # a link into HOME must not open it
    for path in grants:
        assert not str(home).startswith(path.rstrip("/") + "/") and path != str(home)


def test_the_helper_denies_contents_but_not_stat_and_keeps_renames(tmp_path: Path) -> None:
    if landlock.abi() < 2:
        required_in_ci("Landlock ABI 2+ (Linux 5.19+)")
    home = tmp_path / "home"
    (home / "ok").mkdir(parents=True)
    (home / "rw" / "a").mkdir(parents=True)
    (home / "rw" / "b").mkdir()
    (home / "secret").write_text("TOP-SECRET\n")
    (home / "ok" / "f").write_text("readable\n")
    (home / "rw" / "a" / "f").write_text("moved\n")
    script = (
        'cat "$1/secret"; echo "rc=$?"; cat "$1/ok/f"; stat -c %s "$1/secret"; '
        'mv "$1/rw/a/f" "$1/rw/b/f" && cat "$1/rw/b/f"'
    )
    argv = [PYTHON, "-I", "-S", landlock_exec.__file__, "--deny", str(home)]
    argv += ["--ro", str(home / "ok"), "--rw", str(home / "rw"), "--"]
    argv += ["/bin/sh", "-c", script, "sh", str(home)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    assert done.returncode == 0, done.stderr
    assert "TOP-SECRET" not in done.stdout
    assert done.stdout.splitlines() == ["rc=1", "readable", "11", "moved"]
    assert "Permission denied" in done.stderr


def test_the_helper_refuses_to_run_the_command_when_it_cannot_apply(tmp_path: Path) -> None:
    argv = [PYTHON, "-I", "-S", landlock_exec.__file__, "--deny", str(tmp_path)]
    argv += ["--ro", str(tmp_path / "missing"), "--", "/bin/echo", "RAN"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    assert done.returncode == landlock.EXIT_SETUP_FAILED
    assert "RAN" not in done.stdout and "not started" in done.stderr
    assert os.path.exists(tmp_path)


def test_the_helper_finds_a_bare_command_on_path_and_says_when_it_cannot(tmp_path: Path) -> None:
    if landlock.abi() < 2:
        required_in_ci("Landlock ABI 2+ (Linux 5.19+)")
    base = [PYTHON, "-I", "-S", landlock_exec.__file__, "--deny", str(tmp_path), "--"]
    env = {"PATH": f"{tmp_path / 'nowhere'}:/usr/bin:/bin"}
    done = subprocess.run(
        [*base, "sh", "-c", "echo found"], env=env, capture_output=True, text=True, timeout=20
    )
    assert (done.returncode, done.stdout) == (0, "found\n"), done.stderr
    missing = subprocess.run(
        [*base, "no-such-command-here"], env=env, capture_output=True, text=True, timeout=20
    )
    assert missing.returncode == 127
    assert "cannot run 'no-such-command-here'" in missing.stderr


def test_the_helper_starts_without_the_slow_imports() -> None:
    # It runs before every sandboxed engine: `os`, `stat` and `ctypes` cost
    # milliseconds under -S, so the helper uses `posix` and `_ctypes` only.
    root = str(Path(landlock_exec.__file__).resolve().parents[1])
    code = (
        f"import sys; sys.path.append({root!r}); import sandbox_launcher.landlock; "
        "print(sorted({'os', 'stat', 'ctypes', 'pathlib'} & set(sys.modules)))"
    )
    done = subprocess.run([PYTHON, "-I", "-S", "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"


SCOPE_PROBE = r"""
import json, os, signal, socket, subprocess, sys

def attempt(name, action):
    try:
        result = action()
    except OSError as exc:
        print(json.dumps({"check": name, "worked": False, "errno": exc.errno}), flush=True)
        return
    print(json.dumps({"check": name, "worked": True, "result": result}), flush=True)

def connect(address):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(address)
    return "connected"

def kill_own_child():
    child = subprocess.Popen(["sleep", "30"])
    os.kill(child.pid, signal.SIGTERM)
    return child.wait()

def kill_job():
    done = subprocess.run(["bash", "-c", "sleep 30 & kill %1 && wait %1; echo $?"],
                          capture_output=True, text=True)
    if done.stdout.strip() != "143":
        raise OSError(0, f"kill %1 failed: {done.stdout!r} {done.stderr!r}")
    return "killed"

attempt("abstract_socket", lambda: connect("\0" + sys.argv[1]))
attempt("signal_outside", lambda: os.kill(int(sys.argv[2]), 0))
attempt("signal_own_child", kill_own_child)
attempt("kill_job", kill_job)
"""


@pytest.mark.parametrize("mode", ["hybrid", "tmpfs"])
def test_the_helper_scopes_abstract_sockets_and_signals_to_the_run(
    tmp_path: Path, mode: str
) -> None:
    """Landlock ABI 6 scopes (issue 12): nothing outside the run's domain is reachable.

    Without seccomp here, so Landlock alone answers; the control runs the same
    probe unconfined and reaches both. Sources: sandbox-runtime
    `seccomp-filter.test.ts` (abstract sockets), Codex `linux-sandbox` tests
    (signals to processes outside the sandbox); positive controls: signals to
    the run's own children and `kill %1` of its own job.
    """
    if landlock.abi() < landlock.SCOPE_ABI:
        required_in_ci("Landlock ABI 6+ (Linux 6.12+)")
    name = f"crew-scope-{os.getpid()}-{mode}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(8)
    outsider = subprocess.Popen(["sleep", "60"])
    probe = tmp_path / "probe.py"
    probe.write_text(SCOPE_PROBE)
    command = [PYTHON, "-I", str(probe), name, str(outsider.pid)]
    helper = [PYTHON, "-I", "-S", landlock_exec.__file__]
    if mode == "hybrid":
        helper += ["--deny", str(tmp_path / "denied"), "--ro", str(tmp_path)]
        (tmp_path / "denied").mkdir()

    def run(argv: list[str]) -> dict[str, dict[str, object]]:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, done.stderr
        return {row["check"]: row for row in map(json.loads, done.stdout.splitlines())}

    try:
        control = run(command)
        confined = run([*helper, "--", *command])
    finally:
        listener.close()
        outsider.kill()
        outsider.wait()
    assert control["abstract_socket"]["worked"] and control["signal_outside"]["worked"], control
    for name in ("abstract_socket", "signal_outside"):
        assert confined[name] == {"check": name, "worked": False, "errno": errno.EPERM}, confined
    assert confined["signal_own_child"] == {
        "check": "signal_own_child",
        "worked": True,
        "result": -15,
    }
    assert confined["kill_job"]["worked"], confined
