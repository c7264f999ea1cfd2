"""The escapes of issue 12, as permanent tests: each must be denied, the agent's work must not be.

The real bwrap argv (`bwrap_argv`, the launcher's own builder) runs a probe in
both Linux modes, as the caller (root in CI) and as an unprivileged user
(a user the tests make, dropped to when the caller is root). Sources of the cases:

- red team 1 (root host sysctls): sandbox-runtime `integration.test.ts`
  "proc write", bubblewrap `tests/test-run.sh` (`/proc/sys` covered).
- red team 2 (host Unix sockets: `$HOME`, `/run/user/<uid>`, abstract):
  sandbox-runtime `seccomp-filter.test.ts`.
- red team 3 (aliases: `mount --bind ~/.kube /var/tmp/alias` and a bind of
  the whole `$HOME`; read through the alias and, in hybrid, by the real path).
- weaknesses: SysV IPC (bubblewrap `--unshare-ipc`), nested user namespaces
  (Codex `linux-sandbox` tests, bubblewrap `--disable-userns`), AF_VSOCK,
  keyctl, io_uring (sandbox-runtime/Docker seccomp), `/dev` and `/dev/shm`
  writes and a fork bomb (resource limits).

Each case first runs unsandboxed where that is harmless (sockets, SysV
shm): the control proves the probe itself can see the escape.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import json
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crew_common.engine_user import engine_identity
from sandbox_launcher.backend import BwrapBackend
from sandbox_launcher.bwrap import BwrapTools, LinuxMode, find_tools
from sandbox_launcher.policy import SandboxPolicy
from tests.support.ci import required_in_ci
from tests.support.users import unprivileged_uid

SYSTEM_PYTHON = "/usr/bin/python3"  # readable by every user (the test venv may not be)
NPROC = 64
SHM_KEY = 0x43524557

PROBE = r"""
import ctypes, json, os, platform, signal, socket, subprocess, sys

cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": {"keyctl": 250, "io_uring_setup": 425},
      "aarch64": {"keyctl": 219, "io_uring_setup": 425}}[platform.machine()]


def emit(name, worked, **more):
    print(json.dumps({"check": name, "worked": worked, **more}), flush=True)


def attempt(name, action):
    try:
        result = action()
    except OSError as exc:
        emit(name, False, errno=exc.errno, error=str(exc))
        return
    emit(name, True, result=repr(result)[:300])


def check_call(rc):
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return rc


def connect(address):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with s:
        s.connect(address)
    return "connected"


def sysctl_write():
    path = "/proc/sys/kernel/core_pattern"
    with open(path) as f:
        value = f.read()
    with open(path, "w") as f:  # its own value: harmless if it ever got through
        return f.write(value)


def proc_writable():
    entries = ["/proc/sys", "/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger",
               "/proc/irq", "/proc/bus", "/proc/mtrr", "/proc/pressure/memory"]
    return [p for p in entries if os.path.exists(p) and os.access(p, os.W_OK)]


def shm_fill():
    chunk = b"\0" * (1 << 20)
    with open("/dev/shm/crew-fill", "wb") as f:
        for _ in range(256):  # 256 MiB
            f.write(chunk)
            f.flush()
    return "wrote 256 MiB"


def fork_bomb():
    children = []
    try:
        for _ in range(cfg["nproc"] * 4):
            pid = os.fork()
            if pid == 0:
                signal.pause()
                os._exit(0)
            children.append(pid)
        return f"forked {len(children)}"
    except OSError as exc:
        raise OSError(exc.errno, f"fork failed after {len(children)} children") from exc
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def run(*argv, **kw):
    done = subprocess.run(list(argv), capture_output=True, text=True, **kw)
    if done.returncode != 0:
        raise OSError(0, f"{argv[0]} failed: {done.returncode} {done.stderr.strip()[:200]}")
    return done.stdout.strip()


def git_commit():
    work = cfg["work"]
    run("git", "init", "-q", work)
    with open(os.path.join(work, "a.txt"), "w") as f:
        f.write("a\n")
    run("git", "-C", work, "add", "a.txt")
    run("git", "-C", work, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "x")
    return run("git", "-C", work, "log", "--oneline")


for name, address in cfg["sockets"].items():
    attempt(name, lambda: connect(address))
for name, path in cfg["reads"].items():
    attempt(name, lambda: open(path).read())
attempt("sysv_shm", lambda: check_call(libc.shmget(cfg["shm_key"], 0, 0)))
if cfg["control"]:
    sys.exit(0)

attempt("sysctl_write", sysctl_write)
attempt("proc_writable", proc_writable)
attempt("dev_write", lambda: open("/dev/crew-probe", "w").close())
attempt("shm_256mib", shm_fill)
attempt("vsock", lambda: socket.socket(40, socket.SOCK_STREAM).close())
attempt("keyctl", lambda: check_call(libc.syscall(NR["keyctl"], 0, -3, 0)))
attempt("unshare_user", lambda: check_call(libc.unshare(0x10000000)))
attempt("unshare_command", lambda: run("unshare", "-U", "true"))
attempt("io_uring", lambda: check_call(libc.syscall(NR["io_uring_setup"], 8, bytes(120))))
if cfg["fork_bomb"]:
    attempt("fork_bomb", fork_bomb)
# positive controls: the agent's daily work
attempt("socketpair", lambda: len(socket.socketpair()))
attempt("git", git_commit)
attempt("python", lambda: run(sys.executable, "-c", "print(6 * 7)"))
attempt("node", lambda: run("node", "-e", "console.log(6 * 7)"))
attempt("zsh_heredoc", lambda: run("zsh", "-c", "cat <<EOF\nheredoc-ok\nEOF"))
attempt("write_work", lambda: open(os.path.join(cfg["work"], "w.txt"), "w").write("w"))
attempt("inet_socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close())
"""


@dataclasses.dataclass
class Sandbox:
    """A crew home for one agent, owned by `uid`, and the tools that run it.

    As root, `uid` runs bwrap and the engine runs as the engine user
    (`tools.engine_ids`, as a root launcher's: issue 20), who owns the agent's files.
    """

    uid: int
    home: Path
    tools: BwrapTools

    @property
    def owner(self) -> int:
        """Who the agent's files belong to: the engine's uid (gid: the same number or its own)."""
        return self.tools.engine_ids[0] if self.tools.engine_ids else self.uid

    @property
    def owner_gid(self) -> int:
        return self.tools.engine_ids[1] if self.tools.engine_ids else self.uid

    @property
    def policy(self) -> SandboxPolicy:
        crew = self.home / ".crew"
        agent = crew / "agents" / "a1"
        runtime = crew / "runtime" / "r1" / "agents" / "a1"
        return SandboxPolicy(
            home=self.home,
            crew_home=crew,
            agent_dir=agent,
            runtime_dir=runtime,
            tmp_dir=runtime / "tmp",
            work_dir=agent / "work",
        )

    def env(self) -> dict[str, str]:
        p = self.policy
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(p.agent_dir),
            "TMPDIR": str(p.tmp_dir),
            "TMPPREFIX": f"{p.tmp_dir}/zsh",
            "LANG": "C.UTF-8",
        }

    def probe(self, mode: LinuxMode | None, cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Run the probe (sandboxed in `mode`, or bare when None) as `uid`; its checks."""
        p = self.policy
        script = p.agent_dir / "probe.py"
        command = [SYSTEM_PYTHON, "-I", str(script), json.dumps(cfg)]
        argv = command if mode is None else BwrapBackend(self.tools, mode).argv(p, command)
        as_other = self.uid != os.getuid()
        done = subprocess.run(
            argv,
            env=self.env(),
            cwd=p.work_dir,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            start_new_session=True,
            user=self.uid if as_other else None,
            group=self.uid if as_other else None,
            extra_groups=[] if as_other else None,
        )
        checks = {}
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                checks[row["check"]] = row
        assert done.returncode == 0 and checks, (done.returncode, done.stdout, done.stderr)
        return checks


def _unprivileged_tools(tools: BwrapTools) -> BwrapTools:
    # The system Python runs the helper: the test's own interpreter may sit in /root.
    helper_dir = Path(tools.helper).parent
    return dataclasses.replace(
        tools, python=SYSTEM_PYTHON, support_dirs=(Path("/usr"), helper_dir), nproc=NPROC
    )


@pytest.fixture(params=["caller", "unprivileged"])
def sandbox(request: pytest.FixtureRequest, needs_bwrap: None) -> Iterator[Sandbox]:
    yield from make_sandbox(request.param, "/var/tmp")


def make_sandbox(who: str, parent: str) -> Iterator[Sandbox]:
    """A `Sandbox` for `who` ("caller" or "unprivileged") whose $HOME lies below `parent`."""
    if not os.path.exists(SYSTEM_PYTHON):
        required_in_ci(f"{SYSTEM_PYTHON} (Debian package python3)")
    uid = os.getuid()
    if who == "unprivileged" and uid == 0:
        uid = unprivileged_uid()
    tools = find_tools()
    tools = dataclasses.replace(tools, nproc=NPROC)
    if uid != os.getuid():
        tools = _unprivileged_tools(tools)
    elif (engine := engine_identity()) is not None:
        tools = dataclasses.replace(tools, engine_ids=(engine.uid, engine.gid))
    base = Path(tempfile.mkdtemp(prefix="crew-escape-", dir=parent))
    base.chmod(0o755)
    box = Sandbox(uid=uid, home=base / "home", tools=tools)
    p = box.policy
    for path in (p.work_dir, p.tmp_dir, p.crew_home / "sockets"):
        path.mkdir(parents=True, mode=0o700)
    (p.agent_dir / "probe.py").write_text(PROBE)
    for path in [base / "home", *(base / "home").rglob("*")]:
        os.lchown(path, box.owner, box.owner_gid)
    try:
        yield box
    finally:
        shutil.rmtree(base, ignore_errors=True)


class HostSockets:
    """Live Unix sockets of the host: in `$HOME`, in `/run/user/<uid>`, abstract."""

    def __init__(self, home: Path, uid: int) -> None:
        self.tag = uuid.uuid4().hex[:8]
        self.listeners: list[socket.socket] = []
        self.made_run_user = False
        self.addresses: dict[str, str] = {}
        self._listen("home_socket", str(home / f"agent-{self.tag}.sock"))
        run_user = Path(f"/run/user/{uid}")
        if not run_user.exists() and os.getuid() == 0 and Path("/run/user").is_dir():
            run_user.mkdir(mode=0o700)
            os.chown(run_user, uid, uid)
            self.made_run_user = True
        self.run_user = run_user
        if run_user.is_dir():
            self._listen("run_user_socket", str(run_user / f"ssh-agent-{self.tag}.socket"))
        elif os.getuid() == 0:
            required_in_ci("/run/user (a host directory for per-user sockets)")
        self._listen("abstract_socket", f"\0crew-escape-{self.tag}")

    def _listen(self, name: str, address: str) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(address)
        if not address.startswith("\0"):
            os.chmod(address, 0o777)  # only the sandbox may stand between it and the probe
        s.listen(8)
        self.listeners.append(s)
        self.addresses[name] = address

    def close(self) -> None:
        for s in self.listeners:
            s.close()
        for address in self.addresses.values():
            if not address.startswith("\0"):
                Path(address).unlink(missing_ok=True)
        if self.made_run_user:
            shutil.rmtree(self.run_user, ignore_errors=True)


@pytest.fixture
def host_sockets(sandbox: Sandbox) -> Iterator[HostSockets]:
    sockets = HostSockets(sandbox.home, sandbox.uid)
    try:
        yield sockets
    finally:
        sockets.close()


@pytest.fixture
def host_shm() -> Iterator[int]:
    """A SysV shared memory segment of the host, open to everyone."""
    libc = ctypes.CDLL(None, use_errno=True)
    shmid = libc.shmget(SHM_KEY, 4096, 0o1000 | 0o666)  # IPC_CREAT
    if shmid < 0:
        pytest.fail(f"shmget failed on the host: errno {ctypes.get_errno()}")
    try:
        yield SHM_KEY
    finally:
        libc.shmctl(shmid, 0, None)  # IPC_RMID


KUBE_SECRET = "apiVersion: v1 # the user's cluster credentials\n"


class Aliases:
    """`~/.kube` bind-mounted at one place, all of `$HOME` at another (outside both deny roots)."""

    def __init__(self, home: Path, uid: int) -> None:
        if os.getuid() != 0:
            required_in_ci("root (to bind-mount the aliases)")
        kube = home / ".kube"
        kube.mkdir()
        (kube / "config").write_text(KUBE_SECRET)
        for path in (kube, kube / "config"):
            os.chown(path, uid, uid)
        tag = uuid.uuid4().hex[:8]
        self.kube_alias = Path(f"/var/tmp/crew-kube-alias-{tag}")
        self.home_alias = Path(f"/var/tmp/crew-home-alias-{tag}")
        self.mounted: list[Path] = []
        for source, alias in ((kube, self.kube_alias), (home, self.home_alias)):
            alias.mkdir()
            subprocess.run(["mount", "--bind", str(source), str(alias)], check=True)
            self.mounted.append(alias)
        self.reads = {
            "read_kube_alias": str(self.kube_alias / "config"),
            "read_kube_real": str(kube / "config"),
            "read_home_alias": str(self.home_alias / ".kube" / "config"),
        }

    def close(self) -> None:
        for alias in self.mounted:
            subprocess.run(["umount", str(alias)], check=False)
            alias.rmdir()


@pytest.fixture
def aliases(sandbox: Sandbox) -> Iterator[Aliases]:
    found = Aliases(sandbox.home, sandbox.owner)
    try:
        yield found
    finally:
        found.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", list(LinuxMode))
def test_escapes_are_denied_and_work_is_not(
    mode: LinuxMode, sandbox: Sandbox, host_sockets: HostSockets, host_shm: int, aliases: Aliases
) -> None:
    unprivileged = sandbox.uid != 0
    cfg: dict[str, Any] = {
        "sockets": host_sockets.addresses,
        "reads": aliases.reads,
        "shm_key": host_shm,
        "work": str(sandbox.policy.work_dir),
        "nproc": NPROC,
        # RLIMIT_NPROC does not apply to uid 0 (see bwrap.py): only as an ordinary user.
        "fork_bomb": unprivileged,
        "control": True,
    }
    control = sandbox.probe(None, cfg)
    for name in (*host_sockets.addresses, "sysv_shm", *aliases.reads):
        assert control[name]["worked"], f"control: {name} must work unsandboxed: {control[name]}"

    results = sandbox.probe(mode, {**cfg, "control": False})

    def denied(name: str, *errnos: int) -> None:
        r = results[name]
        assert not r["worked"], f"{name} was NOT denied: {r}"
        if errnos:
            assert r["errno"] in errnos, f"{name}: unexpected error {r}"

    def worked(name: str) -> str:
        r = results[name]
        assert r["worked"], f"{name} should work: {r}"
        return str(r["result"])

    # 1. sysctls and the rest of /proc that uid 0 could write by mode bits
    denied("sysctl_write", errno.EROFS, errno.EACCES)
    assert worked("proc_writable") == "[]"
    # 2. host Unix sockets (seccomp refuses socket(AF_UNIX) itself)
    for name in host_sockets.addresses:
        denied(name, errno.EPERM)
    # 3. aliases of deny roots: masked, and never granted (so the real path stays denied)
    for name in aliases.reads:
        denied(name, errno.EACCES, errno.ENOENT)
    # weaknesses
    denied("sysv_shm", errno.ENOENT)
    denied("vsock", errno.EPERM)
    denied("keyctl", errno.EPERM)
    denied("unshare_user", errno.EPERM)
    denied("unshare_command")
    denied("io_uring", errno.EPERM)
    denied("dev_write", errno.EROFS, errno.EACCES)
    denied("shm_256mib", errno.ENOSPC)
    if unprivileged:
        denied("fork_bomb", errno.EAGAIN)
        assert "after" in results["fork_bomb"]["error"]
    # positive controls
    assert worked("socketpair") == "2"
    assert "x" in worked("git")
    assert worked("python") == "'42'"
    assert worked("node") == "'42'"
    assert worked("zsh_heredoc") == "'heredoc-ok'"
    worked("write_work")
    worked("inet_socket")
    assert (sandbox.policy.work_dir / "w.txt").read_text() == "w"
