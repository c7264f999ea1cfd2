"""The programs OpenCode starts by itself run confined, as a tool does (issue 20, item 1).

OpenCode 1.18 runs `git` and `rg` from its `PATH` as its own children, outside
the tools' Landlock domain (`rg` from `$XDG_CACHE_HOME/opencode/bin`, which a
tool can write, when none is on it). The engine's `PATH` starts with our own
`git` and `rg` (`sandbox_launcher.tool_shell`, `landlock.engine_child`); this
shows, through a real sandbox in both modes, as the caller (root in CI) and as
an unprivileged user:

- the engine finds ours first; a tool's `PATH` does not have them (its `git`
  is the real one, with the agent's global config: the positive control);
- what they run (the real program, and what it starts: a git alias, a filter)
  cannot write or read the engine through `/proc`, nor signal it (ABI ≥ 6),
  and has none of the engine's secrets; the engine's git reads no global
  config (a filter a tool set with `git config --global` is not there);
- an `rg` that is not installed says so (exit 127) and runs nothing else.

The end-to-end attacks with the real OpenCode: tests/e2e/test_engine_children.py.
"""

from __future__ import annotations

import dataclasses
import errno
import shutil
import tempfile
from pathlib import Path

import pytest

from sandbox_launcher import landlock
from sandbox_launcher.bwrap import LinuxMode
from sandbox_launcher.tool_shell import engine_bin_dir, system_programs, write_tool_shells
from tests.launcher.test_escapes import Sandbox, sandbox  # noqa: F401 - the fixture
from tests.support.ci import required_in_ci

SECRETS = {
    "OPENCODE_SERVER_PASSWORD": "secret-of-the-server",
    "OPENCODE_AUTH_CONTENT": '{"acme": {"key": "sk-users-own-key"}}',
    "OPENCODE_CONFIG_CONTENT": '{"provider": {}}',
}

# The "engine": what OpenCode does, `git`/`rg` from PATH and `$SHELL -c` for a tool.
ENGINE_PROBE = r"""
import json, os, shutil, subprocess, sys

cfg = json.loads(sys.argv[1])
env = {**os.environ, **cfg["secrets"]}


def report(name, worked, detail):
    print(json.dumps({"check": name, "worked": worked, "result": detail}), flush=True)


def run(argv, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, env=env, **kwargs)


report("engine_git_is_ours", shutil.which("git") == cfg["bin"] + "/git", shutil.which("git"))
report("engine_rg_is_ours", shutil.which("rg") == cfg["bin"] + "/rg", shutil.which("rg"))
# What a git alias (or a filter, an fsmonitor hook) runs: the child probe, in git's domain.
alias = f"alias.probe=!{sys.executable} -I {cfg['child']} {os.getpid()} git"
done = run(["git", "-c", alias, "probe"])
print(done.stdout, flush=True)
report("engine_git_ran", done.returncode == 0, done.stderr[-300:])
done = run(["git", "config", "--global", "--list"])
report("engine_git_global_config", done.stdout.strip(), done.returncode)
done = run(["git", "init", "-q", "engine-repo"])
report("engine_git_init", done.returncode == 0, done.stderr[-300:])
try:
    done = run(["rg", str(os.getpid())])
    print(done.stdout, flush=True)
    report("engine_rg_ran", done.returncode == 0, done.stderr[-300:])
except OSError as exc:  # no rg on PATH (without ours)
    report("engine_rg_ran", False, str(exc))
# A tool: the real git, the agent's own global config, no engine bin on its PATH.
tool = "echo $PATH; command -v git; git config --global user.name"
done = run([os.environ["SHELL"], "-c", tool])
report("tool_path", done.stdout.splitlines(), done.stderr[-300:])
"""

# Run by the engine's git (as an alias) and as its rg, given the engine's pid.
CHILD_PROBE = r"""
import ctypes, json, os, sys

engine, who = int(sys.argv[1]), sys.argv[2]


def attempt(name, action):
    try:
        result = action()
    except OSError as exc:
        print(json.dumps({"check": f"{who}_{name}", "worked": False, "errno": exc.errno}))
        return
    print(json.dumps({"check": f"{who}_{name}", "worked": True, "result": repr(result)[:200]}))


def secrets():
    return sorted(k for k in os.environ if k.startswith("OPENCODE_"))


attempt("engine_mem_write", lambda: open(f"/proc/{engine}/mem", "r+b").close())
attempt("engine_environ", lambda: open(f"/proc/{engine}/environ", "rb").read())
attempt("engine_signal", lambda: os.kill(engine, 0))


def engine_stdout():
    # What a planted rg did in a cold run: take the engine's stdout, forge its events.
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = libc.syscall(434, engine, 0)  # pidfd_open: the same number on x86-64 and arm64
    if pidfd < 0:
        raise OSError(ctypes.get_errno(), "pidfd_open")
    fd = libc.syscall(438, pidfd, 1, 0)  # pidfd_getfd(pidfd, 1)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "pidfd_getfd")
    return fd


attempt("engine_stdout", engine_stdout)
attempt("secrets", secrets)
attempt("git_config_global", lambda: os.environ.get("GIT_CONFIG_GLOBAL"))
"""

DENIED = {
    "engine_mem_write": (errno.EACCES, errno.EPERM),
    "engine_environ": (errno.EACCES,),
    "engine_stdout": (errno.EPERM, errno.ENOSYS),  # Landlock's ptrace rule (or seccomp)
}


def _shells(box: Sandbox, rg: str | None) -> tuple[Sandbox, Path]:
    """`box` with tool shells whose real `rg` is `rg` (None: not installed)."""
    if shutil.which("git", path="/usr/bin:/bin") is None:
        required_in_ci("git (Debian package git)")
    base = Path(tempfile.mkdtemp(prefix="engine-children-", dir=box.home.parent))
    base.chmod(0o755)
    programs = {**system_programs(), "rg": rg}
    shells = write_tool_shells(base, box.tools.python, box.tools.helper, programs)
    return dataclasses.replace(
        box, tools=dataclasses.replace(box.tools, tool_shells=shells)
    ), shells


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", list(LinuxMode))
def test_the_engines_own_git_and_rg_run_as_confined_as_a_tool(
    mode: LinuxMode,
    sandbox: Sandbox,  # noqa: F811
) -> None:
    if landlock.abi() < 1:
        required_in_ci("Landlock (Linux 5.13+)")
    policy = sandbox.policy
    child = policy.agent_dir / "child.py"
    child.write_text(CHILD_PROBE)
    # The stand-in for a real rg: a program outside the agent's reach that probes.
    stand_in = Path(tempfile.mkdtemp(prefix="rg-", dir=sandbox.home.parent))
    stand_in.chmod(0o755)
    rg = stand_in / "rg"
    rg.write_text(f"#!{sandbox.tools.python} -I\nimport sys\nsys.argv.append('rg')\n{CHILD_PROBE}")
    rg.chmod(0o755)
    box, shells = _shells(sandbox, str(rg))
    box = dataclasses.replace(
        box, tools=dataclasses.replace(box.tools, support_dirs=(*box.tools.support_dirs, stand_in))
    )
    # What a tool set earlier with `git config --global`.
    (policy.agent_dir / ".gitconfig").write_text(
        '[user]\n\tname = agent\n[filter "x"]\n\tclean = touch ran\n'
    )
    (policy.agent_dir / "probe.py").write_text(ENGINE_PROBE)
    results = box.probe(
        mode,
        {"bin": str(engine_bin_dir(shells, mode.value)), "child": str(child), "secrets": SECRETS},
    )
    assert results["engine_git_ran"]["worked"], results["engine_git_ran"]
    for who in ("git", "rg"):
        for name, errnos in DENIED.items():
            r = results.get(f"{who}_{name}", {"worked": "did not run"})
            assert not r["worked"] and r["errno"] in errnos, (who, name, r)
    for name in ("engine_git_is_ours", "engine_rg_is_ours", "engine_rg_ran"):
        assert results[name]["worked"], results[name]
    assert results["engine_git_init"]["worked"], results["engine_git_init"]  # positive control
    assert results["engine_git_global_config"]["worked"] == "", results["engine_git_global_config"]
    for who in ("git", "rg"):
        for name, errnos in DENIED.items():
            r = results[f"{who}_{name}"]
            assert not r["worked"] and r["errno"] in errnos, (who, name, r)
        assert results[f"{who}_secrets"]["result"] == "[]", results[f"{who}_secrets"]
        if landlock.abi() >= landlock.SCOPE_ABI:
            r = results[f"{who}_engine_signal"]
            assert r.get("errno") == errno.EPERM, (who, r)
    assert results["git_git_config_global"]["result"] == "'/dev/null'"
    path, git, name = results["tool_path"]["worked"]
    assert "crew-engine-bin" not in path and git == "/usr/bin/git" and name == "agent"


@pytest.mark.timeout(120)
def test_an_rg_that_is_not_installed_says_so_and_runs_nothing(
    sandbox: Sandbox,  # noqa: F811
) -> None:
    if landlock.abi() < 1:
        required_in_ci("Landlock (Linux 5.13+)")
    box, _ = _shells(sandbox, None)
    script = "\n".join(
        [
            "import json, subprocess",
            "done = subprocess.run(['rg', 'x'], capture_output=True, text=True)",
            "print(json.dumps({'check': 'rg', 'worked': done.returncode == 0,",
            "                  'result': [done.returncode, done.stderr]}))",
        ]
    )
    (box.policy.agent_dir / "probe.py").write_text(script)
    [code, stderr] = box.probe(LinuxMode.TMPFS, {})["rg"]["result"]
    assert code == landlock.EXIT_NOT_FOUND
    assert "rg is not installed on this Computer" in stderr
