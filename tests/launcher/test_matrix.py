"""The hostile-agent matrix: attacks ported from other sandboxes' suites, with positive controls.

Both Linux modes, as the caller (root in CI) and as an unprivileged user
(the `sandbox` fixture of test_escapes.py). One sandbox run per cell batches
every probe. Cases already covered elsewhere are not repeated here:

- test_escapes.py: sysctls, host Unix sockets, mount aliases, SysV IPC,
  vsock, keyctl, nested user namespaces, io_uring, /dev writes, /dev/shm
  fill, fork bomb as an ordinary user; git, python, node, zsh heredoc.
- test_hostile.py / tests/faults/test_hostile_agent.py: `$HOME` secrets,
  other agents' tokens, the own token, crew sockets, the launcher's environ
  and signals, background processes, inherited descriptors.
- test_limits.py (resource limits), test_landlock.py (Landlock scopes
  without seccomp), test_engine_channel.py and tests/e2e (forged events,
  `crew reply` through the real chain with the loopback model).

Sources of the cases below, each named in `CASES`:
- srt: anthropic-experimental/sandbox-runtime `test/sandbox/integration.test.ts`
- codex: openai/codex `codex-rs/linux-sandbox/tests/suite/landlock.rs`
- bwrap: containers/bubblewrap `tests/test-run.sh`
- issue12: this project's issue 12 (Landlock scopes, positive controls)
- landlock.rst: the kernel's Documentation/userspace-api/landlock.rst
  (ptrace restrictions, scopes, REFER)
- warm-engine.md: docs/warm-engine.md (a tool rewriting its engine)
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from sandbox_launcher import landlock
from sandbox_launcher.backend import with_tool_shells
from sandbox_launcher.bwrap import LinuxMode
from sandbox_launcher.tool_shell import NATIVE_NAME, native_tool_shell
from tests.launcher.test_escapes import Sandbox, sandbox  # noqa: F401 - the fixture
from tests.support.ci import required_in_ci

MATRIX_PROBE = r"""
import ctypes, json, os, signal, stat, subprocess, sys

cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
work = cfg["work"]


def attempt(name, action):
    try:
        result = action()
    except OSError as exc:
        print(json.dumps({"check": name, "worked": False, "errno": exc.errno,
                          "error": str(exc)}), flush=True)
        return
    print(json.dumps({"check": name, "worked": True, "result": repr(result)[:300]}), flush=True)


def check_call(rc):
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return rc


def run(*argv):
    done = subprocess.run(list(argv), capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(0, f"{argv[0]}: {done.returncode} {done.stderr.strip()[:200]}")
    return done.stdout.strip()


def status(field):
    with open("/proc/self/status") as f:
        return next(line.split(":", 1)[1].strip() for line in f if line.startswith(field + ":"))


def write(path, text="escaped\n"):
    with open(path, "w") as f:
        return f.write(text)


def symlink_write(target, name):
    link = os.path.join(work, name)
    os.symlink(target, link)
    return write(link)


def pids_seen():
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    if len(pids) >= 30:
        raise OSError(0, f"{len(pids)} processes visible: not a private pid namespace")
    return len(pids)


def venv():
    env_dir = os.path.join(work, "venv")
    run(sys.executable, "-m", "venv", "--without-pip", env_dir)
    return run(os.path.join(env_dir, "bin", "python"), "-c", "import sys; print(sys.prefix)")


def ptrace_init():
    check_call(libc.ptrace(16, 1, None, None))  # PTRACE_ATTACH
    os.waitpid(1, 0x40000000)  # __WALL: the tracee's stop
    libc.ptrace(17, 1, None, None)  # PTRACE_DETACH: a failing test must not hang the run
    return "attached"


def kill_job():
    out = run("bash", "-c", "sleep 30 & kill %1; wait %1; echo $?")
    if out != "143":
        raise OSError(0, f"kill %1 gave {out!r}")
    return out


# attacks
attempt("see_host_pid", lambda: os.kill(cfg["host_pid"], 0))
attempt("pid_namespace", pids_seen)
attempt("symlink_out_var_tmp", lambda: symlink_write(cfg["outside"], "escape-link"))
attempt("write_host_file", lambda: write(cfg["outside"]))
attempt("chmod_outside", lambda: os.chmod("/etc/hostname", 0o777))
attempt("hardlink_etc_passwd", lambda: os.link("/etc/passwd", os.path.join(work, "passwd")))
attempt("mknod_device", lambda: os.mknod(os.path.join(work, "null2"), stat.S_IFCHR | 0o666,
                                         os.makedev(1, 3)))
attempt("mount_tmpfs", lambda: check_call(libc.mount(b"none", b"/mnt", b"tmpfs", 0, None)))
attempt("read_etc_shadow", lambda: open("/etc/shadow").read(1))
attempt("read_root_only_file", lambda: open(cfg["root_only"]).read(1))
attempt("getxattr_home", lambda: os.getxattr(cfg["xattr_file"], "user.crew"))
attempt("listxattr_home", lambda: os.listxattr(cfg["xattr_file"]))
attempt("list_root_only_dir", lambda: os.listdir(os.path.dirname(cfg["root_only"])))
attempt("signal_outside_domain", lambda: os.kill(1, 0))
attempt("ptrace_outside_domain", ptrace_init)
# what the sandbox is, as seen from inside
attempt("no_new_privs", lambda: status("NoNewPrivs"))
attempt("whoami", os.getuid)
attempt("capabilities", lambda: [status(f) for f in ("CapInh", "CapPrm", "CapEff", "CapBnd",
                                                      "CapAmb")])
attempt("shm_size", lambda: os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize)
# positive controls
attempt("symlink_into_private_tmp", lambda: symlink_write(cfg["host_tmp_file"], "tmp-link"))
attempt("ls_bin", lambda: len(run("ls", "/bin").split()))
attempt("ls_l_work", lambda: run("ls", "-la", work))
attempt("dev_null", lambda: write("/dev/null"))
attempt("mkfifo_work", lambda: os.mkfifo(os.path.join(work, "fifo")))
attempt("venv", venv)
attempt("kill_own_job", kill_job)
"""

# name → (source, expected): "denied" with errnos, or "worked".
CASES: dict[str, tuple[str, tuple[int, ...] | None]] = {
    "see_host_pid": ("srt: should isolate PID namespace", (errno.ESRCH,)),
    "pid_namespace": ("srt: should isolate PID namespace", None),
    "symlink_out_var_tmp": (
        "srt: should prevent symlink-based filesystem escape attempts",
        (errno.EROFS, errno.EACCES),
    ),
    "write_host_file": ("codex: test_root_write", (errno.EROFS, errno.EACCES)),
    "chmod_outside": ("research sandbox.md §0: Landlock does not mediate chmod", (errno.EROFS,)),
    "hardlink_etc_passwd": (
        "srt: should prevent creation of special file types (hard link)",
        (errno.EXDEV, errno.EPERM, errno.EROFS),
    ),
    "mknod_device": (
        "srt: should prevent creation of special file types (device node)",
        (errno.EPERM,),
    ),
    "mount_tmpfs": ("bwrap: we have no caps (no CAP_SYS_ADMIN)", (errno.EPERM,)),
    # As root too: the engine runs as the engine user, never as uid 0 (crew_common.engine_user).
    "read_etc_shadow": ("issue20 R21: /etc/shadow (root:shadow 0640)", (errno.EACCES,)),
    "read_root_only_file": ("issue20 R22: a 0600 file of root's", (errno.EACCES,)),
    "list_root_only_dir": ("issue20 R22: a 0700 directory of root's", (errno.EACCES,)),
    "symlink_into_private_tmp": ("srt: symlink escape into /tmp (ours is private)", None),
    "ls_bin": ("codex: test_root_read", None),
    "ls_l_work": ("issue20 R18: ls -l (it asks for ACLs) with no xattrs to read", None),
    # Landlock does not govern xattrs: in hybrid they told what a file in $HOME holds.
    "getxattr_home": ("issue20 R18: xattrs of a file in $HOME", (errno.EOPNOTSUPP, errno.ENOENT)),
    "listxattr_home": ("issue20 R18: xattr names in $HOME", (errno.EOPNOTSUPP, errno.ENOENT)),
    "dev_null": ("codex: test_dev_null_write", None),
    "mkfifo_work": ("srt: should prevent creation of special file types (FIFO allowed)", None),
    "venv": ("issue12: positive control, a venv", None),
    "kill_own_job": ("issue12: positive control, `kill %1` of its own job", None),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", list(LinuxMode))
def test_the_hostile_matrix(mode: LinuxMode, sandbox: Sandbox) -> None:  # noqa: F811
    tag = uuid.uuid4().hex[:8]
    outside = Path(f"/var/tmp/crew-matrix-{tag}.txt")
    host_tmp_file = Path(f"/tmp/crew-matrix-{tag}.txt")
    # R22: a directory of the launcher's own user (root in CI), 0700, with a 0600 file.
    root_only = Path(tempfile.mkdtemp(prefix="crew-matrix-root-only-", dir="/var/tmp"))
    (root_only / "secret").write_text("ROOT-ONLY\n")
    (root_only / "secret").chmod(0o600)
    xattr_file = sandbox.home / f"xattr-{tag}"
    xattr_file.write_text("content denied anyway\n")
    os.setxattr(xattr_file, "user.crew", b"SECRET-IN-AN-XATTR")
    policy = sandbox.policy
    (policy.agent_dir / "probe.py").write_text(MATRIX_PROBE)
    cfg: dict[str, Any] = {
        "work": str(policy.work_dir),
        "host_pid": os.getpid(),
        "outside": str(outside),
        "host_tmp_file": str(host_tmp_file),
        "root_only": str(root_only / "secret"),
        "xattr_file": str(xattr_file),
    }
    try:
        results = sandbox.probe(mode, cfg)
        assert not outside.exists() and not host_tmp_file.exists()
    finally:
        outside.unlink(missing_ok=True)
        host_tmp_file.unlink(missing_ok=True)
        shutil.rmtree(root_only, ignore_errors=True)

    # Only root can make a file no engine owns; an ordinary caller's engine owns its own.
    root_only_cases = ("read_root_only_file", "list_root_only_dir")
    cases = {k: v for k, v in CASES.items() if os.getuid() == 0 or k not in root_only_cases}
    for name, (source, errnos) in cases.items():
        r = results[name]
        if errnos is None:
            assert r["worked"], f"{name} ({source}) should work: {r}"
        else:
            assert not r["worked"], f"{name} ({source}) was NOT denied: {r}"
            assert r["errno"] in errnos, f"{name} ({source}): unexpected error {r}"
    # The symlink into /tmp lands in the agent's own temp dir.
    assert (policy.tmp_dir / host_tmp_file.name).read_text() == "escaped\n"
    # codex: test_no_new_privs_is_enabled; srt: should prevent privilege escalation attempts
    assert results["no_new_privs"]["result"] == "'1'"
    # bwrap: "we have no caps" — none at all, as uid 0 too (--cap-drop ALL)
    assert results["capabilities"]["result"] == repr(["0000000000000000"] * 5)
    # bwrap: "tmpfs has expected size" — /dev/shm is the size the limits give it
    assert results["shm_size"]["result"] == str(sandbox.tools.shm_bytes)
    # As root the engine is the engine user, who owns its files (issue 20).
    assert results["whoami"]["result"] == repr(sandbox.owner)
    # issue12: Landlock scopes (ABI ≥ 6) keep signals and ptrace inside the run's domain;
    # pid 1 of the sandbox (bwrap's init) lies outside it.
    if landlock.abi() >= landlock.SCOPE_ABI:
        for name in ("signal_outside_domain", "ptrace_outside_domain"):
            assert results[name].get("errno") == errno.EPERM, (
                f"{name} was NOT denied: {results[name]}"
            )


# ---- tools against their engine (docs/warm-engine.md, "Tools cannot reach the engine") ----

# The "engine": starts each tool as OpenCode 1.18 does, `$SHELL -c COMMAND` (bash
# when $SHELL is unset), and afterwards checks it still governs its tools.
ENGINE_PROBE = r"""
import json, os, shutil, signal, subprocess, sys, time

cfg = json.loads(sys.argv[1])
shell = os.environ.get("SHELL") or shutil.which("bash")


def report(name, worked, detail):
    print(json.dumps({"check": name, "worked": worked, "result": detail}), flush=True)


def tool(command, **kwargs):
    return subprocess.Popen([shell, "-c", command], **kwargs)


# A warm server's password is in its environment, so in what it gives its tools.
done = tool(f"exec {sys.executable} -I {cfg['tool']} {os.getpid()}", stdout=subprocess.PIPE,
            text=True, env={**os.environ, "OPENCODE_SERVER_PASSWORD": "secret-of-the-engine"})
print(done.communicate()[0], flush=True)  # the tool's own checks, one JSON line each
report("tool_exit", done.returncode == 0, done.returncode)
# positive controls: the engine can still read, kill and wait for a tool of its own
sleeper = tool("exec sleep 60")
time.sleep(0.2)  # the tool shell has exec'd sleep (or not: /proc/<pid>/mem is the same process)
try:
    with open(f"/proc/{sleeper.pid}/mem", "rb"):
        report("engine_opens_tool_mem", True, sleeper.pid)
except OSError as exc:
    report("engine_opens_tool_mem", False, str(exc))
sleeper.kill()
report("engine_kills_and_waits_tool", sleeper.wait() == -signal.SIGKILL, sleeper.returncode)
"""

# The "tool": run by the engine through the tool shell, given the engine's pid.
TOOL_PROBE = r"""
import ctypes, errno, json, os, subprocess, sys

engine = int(sys.argv[1])
work = os.getcwd()
libc = ctypes.CDLL(None, use_errno=True)


def attempt(name, action):
    try:
        result = action()
    except OSError as exc:
        print(json.dumps({"check": name, "worked": False, "errno": exc.errno,
                          "error": str(exc)}), flush=True)
        return
    print(json.dumps({"check": name, "worked": True, "result": repr(result)[:300]}), flush=True)


def run(*argv):
    done = subprocess.run(list(argv), capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(0, f"{argv[0]}: {done.returncode} {done.stderr.strip()[:200]}")
    return done.stdout.strip()


def write_engine_mem():
    with open(f"/proc/{engine}/mem", "r+b") as f:
        return f.fileno()


def read_engine_environ():
    with open(f"/proc/{engine}/environ", "rb") as f:
        return len(f.read())


def ptrace_engine():
    if libc.ptrace(16, engine, None, None) != 0:  # PTRACE_ATTACH
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    libc.ptrace(17, engine, None, None)  # PTRACE_DETACH: a failing test must not hang
    return "attached"


def engine_password():
    value = os.environ.get("OPENCODE_SERVER_PASSWORD")
    if value is None:
        raise OSError(errno.ENOENT, "not in the tool's environment")
    return value


def rename_across_dirs():
    os.makedirs("from", exist_ok=True)
    os.makedirs("to", exist_ok=True)
    with open("from/f", "w") as f:
        f.write("f")
    os.rename("from/f", "to/f")
    return open("to/f").read()


def git_commit():
    run("git", "init", "-q", "repo")
    with open("repo/a.txt", "w") as f:
        f.write("a\n")
    run("git", "-C", "repo", "add", "a.txt")
    run("git", "-C", "repo", "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "x")
    return run("git", "-C", "repo", "log", "--oneline")


def own_child_mem():
    child = subprocess.Popen(["sleep", "30"])
    try:
        with open(f"/proc/{child.pid}/mem", "rb"):
            return child.pid
    finally:
        child.kill()
        child.wait()


# attacks on the engine
attempt("engine_is_parent", lambda: os.getppid() == engine or os.getppid())
attempt("engine_mem_write", write_engine_mem)
attempt("engine_environ", read_engine_environ)
attempt("engine_ptrace", ptrace_engine)
attempt("engine_signal", lambda: os.kill(engine, 0))
attempt("engine_password", engine_password)
# positive controls: the tool's own work
attempt("work_write", lambda: open(os.path.join(work, "t.txt"), "w").write("t"))
attempt("rename_across_dirs", rename_across_dirs)
attempt("git", git_commit)
attempt("python", lambda: run(sys.executable, "-c", "print(6 * 7)"))
attempt("kill_own_job", lambda: run("bash", "-c", "sleep 30 & kill %1; wait %1; echo $?"))
attempt("own_child_mem", own_child_mem)
attempt("nested_shell", lambda: run(os.environ.get("SHELL", "bash"), "-c", "echo nested"))
"""

# name → (source, expected): "denied" with errnos, or "worked" (None).
TOOL_CASES: dict[str, tuple[str, tuple[int, ...] | None]] = {
    "engine_mem_write": (
        "warm-engine.md: a tool rewriting its engine through /proc/<pid>/mem",
        (errno.EACCES, errno.EPERM),
    ),
    "engine_environ": ("landlock.rst: ptrace restrictions (PTRACE_MODE_READ)", (errno.EACCES,)),
    "engine_ptrace": ("landlock.rst: ptrace restrictions (and our seccomp)", (errno.EPERM,)),
    "engine_password": ("warm-engine.md: the server's password drives its API", (errno.ENOENT,)),
    "work_write": ("positive control: the tool writes its work dir", None),
    "rename_across_dirs": ("landlock.rst: REFER, a nested layer must not deny it", None),
    "git": ("positive control: git init, add, commit", None),
    "python": ("positive control: python", None),
    "kill_own_job": ("issue12: positive control, `kill %1` of its own job", None),
    "own_child_mem": ("landlock.rst: a domain reaches its own descendants", None),
    "nested_shell": ("positive control: a tool's own `$SHELL -c`", None),
    "tool_exit": ("positive control: the tool shell ran the tool", None),
    "engine_opens_tool_mem": ("landlock.rst: a parent domain reaches a nested one", None),
    "engine_kills_and_waits_tool": ("positive control: OpenCode stops its tools", None),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("helper", ["native", "python"])
@pytest.mark.parametrize("mode", list(LinuxMode))
def test_tools_cannot_reach_their_engine(
    mode: LinuxMode,
    helper: str,
    sandbox: Sandbox,  # noqa: F811
) -> None:
    """A tool started through `$SHELL -c` cannot write its engine's memory, trace or signal it.

    With either tool shell helper: the native one (scripts/setup) or the Python fallback."""
    native = native_tool_shell() if helper == "native" else None
    if helper == "native" and native is None:
        required_in_ci("the native tool shell (scripts/setup builds it with gcc)")
    shells = Path(tempfile.mkdtemp(prefix="tool-shell-", dir=sandbox.home.parent))
    shells.chmod(0o755)
    tools = with_tool_shells(sandbox.tools, shells, native=native)
    assert tools.tool_shells is not None
    assert (tools.tool_shells / NATIVE_NAME).exists() == (native is not None)
    box = dataclasses.replace(sandbox, tools=tools)
    policy = box.policy
    (policy.agent_dir / "probe.py").write_text(ENGINE_PROBE)
    (policy.agent_dir / "tool.py").write_text(TOOL_PROBE)
    results = box.probe(mode, {"tool": str(policy.agent_dir / "tool.py")})

    # The tool really is the engine's child: the denials below are about the engine.
    assert results["engine_is_parent"]["result"] == "True", results["engine_is_parent"]
    for name, (source, errnos) in TOOL_CASES.items():
        r = results[name]
        if errnos is None:
            assert r["worked"], f"{name} ({source}) should work: {r}"
        else:
            assert not r["worked"], f"{name} ({source}) was NOT denied: {r}"
            assert r["errno"] in errnos, f"{name} ({source}): unexpected error {r}"
    assert results["kill_own_job"]["result"] == "'143'"
    # Signals need Landlock's signal scope (ABI ≥ 6); before it a tool can still kill its engine.
    if landlock.abi() >= landlock.SCOPE_ABI:
        r = results["engine_signal"]
        assert r.get("errno") == errno.EPERM, f"engine_signal was NOT denied: {r}"
