"""Apply a Landlock read policy to this process, then exec a command.

Run inside bwrap through the tiny entry script ``landlock_exec.py``
(``python -I -S landlock_exec.py --deny D… --ro P… --rw P… -- CMD…``,
sandbox.md §2.2). Landlock must be applied *inside* bwrap: it forbids
mounts, so bwrap fails if the launcher applies it first.

Only ``READ_FILE`` and ``REFER`` are handled: bwrap already makes everything
but the writable binds read-only, and Landlock adds "file contents below the
deny roots are unreadable, except the allowlist" while ``stat`` keeps working.
``REFER`` must be handled and granted or every cross-directory rename fails
with EXDEV (any ABI ≥ 2 domain denies it otherwise).

Landlock is allow-list only, so "everything except the deny roots" is built by
granting every sibling along the way from ``/`` down to each deny root.
Symlinks are skipped (their targets are covered by their own sibling, and a
link into a deny root must not open it); entries created later next to an
ancestor of a deny root stay unreadable, which fails closed.

This runs before every sandboxed engine, so its start-up is on every turn's
path: it imports only built-in modules (``posix``, ``_ctypes``; no ``os``,
``stat`` or ``ctypes``, which cost milliseconds to import under ``-S``), reads
each directory once with ``scandir`` (no ``lstat`` per entry), and is loaded
from its cached bytecode (a script run as ``__main__`` would be compiled on
every start). The launcher also imports it for `abi()`.

With `--tool-shell MODE ARGS…` it is every sandbox's `$SHELL` instead
(`sandbox_launcher.tool_shell`): it nests a Landlock domain for the tool
below the engine's and execs `bash ARGS…` (`tool_shell`).
"""

import posix
import sys

from sandbox_launcher._libc import SetupError, errno_text, libc_call

_SYS_CREATE_RULESET = 444  # the same number on every architecture
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

READ_FILE = 1 << 2
REFER = 1 << 13
HANDLED = READ_FILE | REFER
# ABI 6 (Linux 6.12): no connect() to abstract Unix sockets and no signals to
# processes outside this Landlock domain (the engine and everything it starts).
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1
SCOPED = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
SCOPE_ABI = 6

EXIT_SETUP_FAILED = 126  # what `env` uses for "found but could not run"
DEFAULT_PATH = "/bin:/usr/bin"  # os.defpath, for a command given without a slash


class LandlockError(SetupError):
    """Landlock could not be applied; the command must not run."""


def _u64(value: int) -> bytes:
    return value.to_bytes(8, sys.byteorder)


def abi() -> int:
    """The kernel's Landlock ABI version, or 0 when Landlock is unavailable."""
    if not sys.platform.startswith("linux"):
        return 0
    return max(libc_call("syscall", _SYS_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION), 0)


# ---- the policy ----


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def minimal_roots(roots: list[str]) -> list[str]:
    """Drop roots that lie inside another root (their parent already covers them)."""
    unique = sorted(set(roots), key=len)
    kept: list[str] = []
    for root in unique:
        if not any(_inside(root, other) for other in kept):
            kept.append(root)
    return kept


def _ancestors(path: str) -> list[str]:
    """`/a/b/c` → [`/`, `/a`, `/a/b`] (strict ancestors, top-down)."""
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(len(parts))]


def _sibling_entries(deny_roots: list[str]) -> list[tuple[str, bool]]:
    """(path, is a directory) of every entry next to the way down to a deny root.

    Reads the directories as they are now (inside the sandbox). Entries on the
    way to a deny root, the deny roots themselves and symlinks are left out.
    The entry types come from the directory listing itself (`lstat` only
    where the file system does not say).
    """
    roots = minimal_roots(deny_roots)
    ancestors = {a for r in roots for a in _ancestors(r)}
    on_way = ancestors | set(roots)
    found: list[tuple[str, bool]] = []
    for ancestor in sorted(ancestors):
        prefix = ancestor.rstrip("/") + "/"
        try:
            with posix.scandir(ancestor) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError:
            continue  # unreadable ancestor: nothing below it is granted (fails closed)
        for entry in entries:
            path = prefix + entry.name
            if path in on_way:
                continue
            try:
                if entry.is_symlink():
                    continue
                found.append((path, entry.is_dir(follow_symlinks=False)))
            except OSError:
                continue
    return found


def sibling_grants(deny_roots: list[str]) -> list[str]:
    """Every entry next to the way down to a deny root: what stays readable."""
    return [path for path, _ in _sibling_entries(deny_roots)]


_S_IFMT = 0o170000
_S_IFDIR = 0o040000


class _Ruleset:
    def __init__(self, handled: int, scoped: int) -> None:
        # struct landlock_ruleset_attr: handled_access_fs, handled_access_net, scoped
        # (u64 each); older kernels know only the first field, so send only what is used.
        attr = _u64(handled) + (_u64(0) + _u64(scoped) if scoped else b"")
        fd = libc_call("syscall", _SYS_CREATE_RULESET, attr, len(attr), 0)
        if fd < 0:
            raise LandlockError(f"landlock_create_ruleset failed: {errno_text()}")
        self.fd = fd
        self.handled = handled

    def allow(self, path: str, *, required: bool, is_dir: bool | None = None) -> None:
        """Grant reads below `path`; `is_dir` when the caller already knows (else fstat)."""
        try:
            fd = posix.open(path, posix.O_PATH | posix.O_CLOEXEC)
        except OSError as exc:
            if required:
                raise LandlockError(f"cannot open allowed path {path!r}: {exc.strerror}") from exc
            return
        try:
            if is_dir is None:
                is_dir = posix.fstat(fd).st_mode & _S_IFMT == _S_IFDIR
            # REFER only exists on directories; files get READ_FILE alone. Writes
            # stay bwrap's business, so REFER on read-only dirs grants nothing.
            access = ((READ_FILE | REFER) if is_dir else READ_FILE) & self.handled
            # struct landlock_path_beneath_attr is packed: u64 access, s32 fd (12 bytes).
            rule = _u64(access) + fd.to_bytes(4, sys.byteorder, signed=True)
            rc = libc_call("syscall", _SYS_ADD_RULE, self.fd, _RULE_PATH_BENEATH, rule, 0)
            if rc < 0 and required:
                raise LandlockError(f"landlock_add_rule({path!r}) failed: {errno_text()}")
        finally:
            posix.close(fd)

    def restrict_self(self) -> None:
        if libc_call("prctl", _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise LandlockError(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {errno_text()}")
        if libc_call("syscall", _SYS_RESTRICT_SELF, self.fd, 0) < 0:
            raise LandlockError(f"landlock_restrict_self failed: {errno_text()}")
        posix.close(self.fd)


def scopes(version: int) -> int:
    """The scopes this kernel's Landlock ABI can enforce (none before ABI 6)."""
    return SCOPED if version >= SCOPE_ABI else 0


def apply(deny: list[str], ro: list[str], rw: list[str]) -> None:
    """Make file contents below `deny` unreadable except `ro` and `rw` paths (and scope)."""
    version = abi()
    if version < 2:
        raise LandlockError(
            f"Landlock ABI {version} is too old (need 2 or newer for REFER); "
            "use the launcher's tmpfs mode on this kernel"
        )
    ruleset = _Ruleset(HANDLED, scopes(version))
    for path, is_dir in _sibling_entries(deny):
        ruleset.allow(path, required=False, is_dir=is_dir)
    for path in [*ro, *rw]:
        ruleset.allow(path, required=True)
    ruleset.restrict_self()


class HelperPlan:
    """What the helper does before exec: Landlock (when `deny` is given), rlimits, seccomp."""

    __slots__ = ("command", "deny", "fsize", "nproc", "path_first", "ro", "rw", "seccomp")

    def __init__(self) -> None:
        self.path_first: str | None = None  # put first on the engine's PATH
        self.deny: list[str] = []
        self.ro: list[str] = []
        self.rw: list[str] = []
        self.seccomp = False
        self.nproc: int | None = None
        self.fsize: int | None = None  # RLIMIT_FSIZE: no one file bigger than the agent's disk
        self.command: list[str] = []


def parse_args(argv: list[str]) -> HelperPlan:
    """`[--deny P --ro P --rw P …] [--seccomp] [--nproc N] [--fsize B] [--path-first D] -- CMD…`."""
    plan = HelperPlan()
    lists = {"--deny": plan.deny, "--ro": plan.ro, "--rw": plan.rw}
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag == "--":
            plan.command = argv[i + 1 :]
            if not plan.command:
                raise SetupError("no command given after --")
            if (plan.ro or plan.rw) and not plan.deny:
                raise LandlockError("--ro/--rw given without a --deny root")
            return plan
        if flag == "--seccomp":
            plan.seccomp = True
            i += 1
            continue
        if flag not in (*lists, "--nproc", "--fsize", "--path-first") or i + 1 >= len(argv):
            raise SetupError(f"unexpected argument {flag!r}")
        value = argv[i + 1]
        if flag == "--path-first" and value.startswith("/"):
            plan.path_first = value
        elif flag in ("--nproc", "--fsize"):
            if not value.isdigit() or int(value) < 1:
                raise SetupError(f"{flag} needs a positive number, got {value!r}")
            if flag == "--nproc":
                plan.nproc = int(value)
            else:
                plan.fsize = int(value)
        elif not value.startswith("/"):
            raise LandlockError(f"{flag} needs an absolute path, got {value!r}")
        else:
            lists[flag].append(value)
        i += 2
    raise SetupError("missing -- before the command")


_RLIMIT_CORE = 4  # the same numbers on x86-64 and arm64
_RLIMIT_NPROC = 6
_RLIMIT_FSIZE = 1


def set_limit(resource: int, value: int) -> None:
    """setrlimit(resource, value, value) through libc (no `resource` module under -S)."""
    limit = _u64(value) + _u64(value)  # struct rlimit: soft, hard
    if libc_call("setrlimit", resource, limit, 0) != 0:
        raise SetupError(f"setrlimit({resource}, {value}) failed: {errno_text()}")


def _machine() -> str:
    return posix.uname().machine


def _exec(command: list[str]) -> None:
    """`os.execvp` without `os`: a name with a slash as is, else looked up on `$PATH`."""
    name = command[0]
    if "/" in name:
        posix.execv(name, command)
    path = posix.environ.get(b"PATH")
    dirs = path.decode("utf-8", "surrogateescape") if path is not None else DEFAULT_PATH
    first_error: OSError | None = None  # as os.execvp: the first error other than "not there"
    last_error: OSError = FileNotFoundError(2, posix.strerror(2))
    for directory in dirs.split(":"):
        try:
            posix.execv(f"{directory or '.'}/{name}", command)
        except (FileNotFoundError, NotADirectoryError) as exc:
            last_error = exc
        except OSError as exc:
            last_error = exc
            first_error = first_error or exc
    raise first_error or last_error


# ---- the tool shell: each tool in a Landlock domain nested in the engine's ----

# Set in a tool's environment once it has its own domain: a `$SHELL -c` the tool
# runs itself stays in that domain (Landlock allows at most 16 layers). Never
# in an engine's environment: the launcher builds that one and unsets it.
TOOL_DOMAIN_MARKER = b"CREW_TOOL_DOMAIN"
TOOL_SHELL = "bash"  # what OpenCode itself picks when $SHELL is unset
FALLBACK_SHELL = "/bin/sh"  # … and when there is no bash on PATH
TOOL_SHELL_MODES = ("hybrid", "tmpfs")
# The engine's own secrets: a warm server's password (`schema.SERVER_PASSWORD_KEY`:
# with it a tool could drive its server's HTTP API, `POST /mcp` starts a command of
# its choosing), the user's provider login and the config that holds its providers.
# OpenCode read them at its start; no tool and no child of the engine needs them.
ENGINE_ONLY_VARIABLES = (
    b"OPENCODE_SERVER_PASSWORD",
    b"OPENCODE_AUTH_CONTENT",
    b"OPENCODE_CONFIG_CONTENT",
)
# The directory of the engine's own `git` and `rg` (`sandbox_launcher.tool_shell`),
# first on the engine's PATH; the tool shell takes it off a tool's PATH again.
ENGINE_BIN_NAME = "crew-engine-bin"
# What OpenCode's own git gets: no system or global config, so a filter, an fsmonitor
# or an alias a tool set with `git config --global` never runs as the engine's child.
ENGINE_GIT_ENV = ((b"GIT_CONFIG_NOSYSTEM", b"1"), (b"GIT_CONFIG_GLOBAL", b"/dev/null"))
EXIT_NOT_FOUND = 127


def nest_tool_domain(outer_handles_files: bool) -> None:
    """Put this process in a new Landlock domain below its current one, restricting no file.

    Landlock lets a process ptrace, open `/proc/<pid>/mem` of, or (scoped, ABI
    ≥ 6) signal only processes in its own domain or one nested below it: a tool
    in such a domain cannot reach the engine that started it, while the engine
    can still kill and wait for its tools. The layer must match the engine's:
    every layer that handles file access denies cross-directory renames unless
    it grants REFER, a layer that handles none adds no such check. So below a
    file-handling domain (hybrid) it handles READ_FILE and REFER and grants
    both on `/`; below a scopes-only domain or none (tmpfs) it only scopes
    when the ABI can, else it is the same whole-tree grant.
    """
    version = abi()
    if version == 0:
        return  # no Landlock here: nothing to nest in (the launcher's health says so)
    scoped = scopes(version)
    if scoped and not outer_handles_files:
        _Ruleset(0, scoped).restrict_self()
        return
    ruleset = _Ruleset(READ_FILE | (REFER if version >= 2 else 0), scoped)
    ruleset.allow("/", required=True, is_dir=True)
    ruleset.restrict_self()


def _enter_tool_domain(mode: str, who: str) -> bool:
    """Nest a tool domain (once: the marker), drop the engine's secrets; False on failure."""
    if posix.environ.get(TOOL_DOMAIN_MARKER) is None:
        try:
            nest_tool_domain(outer_handles_files=mode == "hybrid")
        except SetupError as exc:
            sys.stderr.write(f"{who}: {exc}; the command was not started\n")
            return False
        posix.putenv(TOOL_DOMAIN_MARKER, b"1")
    for name in ENGINE_ONLY_VARIABLES:
        posix.unsetenv(name)
    return True


def without_engine_bin(path: bytes) -> bytes:
    """`PATH` without the engine's own bin directories (`ENGINE_BIN_NAME`)."""
    suffix = b"/" + ENGINE_BIN_NAME.encode()
    return b":".join(d for d in path.split(b":") if not d.rstrip(b"/").endswith(suffix))


def _drop_engine_bin() -> None:
    path = posix.environ.get(b"PATH")
    if path is not None:
        posix.putenv(b"PATH", without_engine_bin(path))
        posix.environ[b"PATH"] = without_engine_bin(path)  # `_exec` looks it up here


def engine_child(argv: list[str]) -> int:
    """`--engine-child MODE NAME REAL ARGS…`: a program OpenCode starts by itself, confined.

    OpenCode runs `git` (its project and file status) and `rg` (grep, glob) from
    its `PATH`, and `rg` from `$XDG_CACHE_HOME/opencode/bin` when there is none
    on it: a place a tool can write. So the engine's `PATH` starts with our own
    `git` and `rg` (`sandbox_launcher.tool_shell`), which run this: the child
    gets a tool's domain (it cannot reach the engine's memory, environment or
    descriptors, nor signal it), none of the engine's secrets, and a git without
    global or system config. `REAL` is the program found at the launcher's start
    in the system's directories; empty when there is none (said, not searched
    for elsewhere).
    """
    if len(argv) < 3 or argv[0] not in TOOL_SHELL_MODES:
        sys.stderr.write(f"crew-engine-child: expected MODE NAME PATH, got {argv[:3]}\n")
        return EXIT_SETUP_FAILED
    mode, name, real, args = argv[0], argv[1], argv[2], argv[3:]
    if not real:
        sys.stderr.write(
            f"crew: {name} is not installed on this Computer (looked in /usr/local/bin, "
            f"/usr/bin, /bin); install it for OpenCode's tools that need it\n"
        )
        return EXIT_NOT_FOUND
    if not _enter_tool_domain(mode, "crew-engine-child"):
        return EXIT_SETUP_FAILED
    _drop_engine_bin()
    if name == "git":
        for key, value in ENGINE_GIT_ENV:
            posix.putenv(key, value)
    try:
        posix.execv(real, [name, *args])
    except OSError as exc:
        sys.stderr.write(f"crew-engine-child: cannot run {real}: {exc.strerror}\n")
    return EXIT_SETUP_FAILED


def tool_shell(argv: list[str]) -> int:
    """`--tool-shell MODE ARGS…`: nest a tool domain (once per tool), then exec `bash ARGS…`.

    Every Linux sandbox's `$SHELL` (`sandbox_launcher.tool_shell`) runs this, so
    each bash tool call OpenCode makes (`$SHELL -c COMMAND`) starts here. The
    engine's own credentials (`ENGINE_ONLY_VARIABLES`) do not reach the tool:
    its domain keeps it out of the engine's `/proc/<pid>/environ` as well.
    Nor does the engine's own `git` and `rg` (`engine_child`): a tool's `PATH`
    loses their directory.
    """
    if not argv or argv[0] not in TOOL_SHELL_MODES:
        sys.stderr.write(f"crew-tool-shell: expected hybrid or tmpfs, got {argv[:1]}\n")
        return EXIT_SETUP_FAILED
    mode, args = argv[0], argv[1:]
    if not _enter_tool_domain(mode, "crew-tool-shell"):
        return EXIT_SETUP_FAILED
    # A tool's `git` is the real one, with the agent's own config.
    _drop_engine_bin()
    try:
        _exec([TOOL_SHELL, *args])
    except FileNotFoundError:
        pass
    except OSError as exc:
        sys.stderr.write(f"crew-tool-shell: cannot run {TOOL_SHELL}: {exc.strerror}\n")
        return EXIT_SETUP_FAILED
    try:
        posix.execv(FALLBACK_SHELL, [FALLBACK_SHELL, *args])
    except OSError as exc:
        sys.stderr.write(f"crew-tool-shell: cannot run {FALLBACK_SHELL}: {exc.strerror}\n")
    return EXIT_SETUP_FAILED


def main(argv: list[str]) -> int:
    """Confine this process as asked and exec the command; returns only on failure.

    Landlock's scopes (ABI ≥ 6: abstract Unix sockets and signals stay inside
    the run's own domain) apply in both modes. The order matters: the seccomp
    module is imported before Landlock may hide its source; rlimits before either (setrlimit is not filtered anyway);
    seccomp last, so nothing the helper still does is filtered but `exec`.
    RLIMIT_NPROC counts per user namespace (bwrap gives each run a fresh
    one), so it caps this run's processes and threads, not the user's; the
    kernel exempts uid 0 from it. No core dumps: a crash writes nothing.
    """
    if argv[:1] == ["--tool-shell"]:
        return tool_shell(argv[1:])
    if argv[:1] == ["--engine-child"]:
        return engine_child(argv[1:])
    try:
        plan = parse_args(argv)
        if plan.seccomp:
            from sandbox_launcher import seccomp

            machine = _machine()
            seccomp.program(machine)  # unsupported machines fail before anything runs
        set_limit(_RLIMIT_CORE, 0)
        if plan.nproc is not None:
            set_limit(_RLIMIT_NPROC, plan.nproc)
        if plan.fsize is not None:
            set_limit(_RLIMIT_FSIZE, plan.fsize)
        if plan.deny:
            apply(plan.deny, plan.ro, plan.rw)
        elif scoped := scopes(abi()):
            _Ruleset(0, scoped).restrict_self()  # tmpfs mode: the scopes alone
        elif libc_call("prctl", _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise SetupError(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {errno_text()}")
        if plan.seccomp:
            seccomp.install(machine)
    except SetupError as exc:
        sys.stderr.write(f"crew-landlock: {exc}; the command was not started\n")
        return EXIT_SETUP_FAILED
    command = plan.command
    if plan.path_first is not None:
        # The engine's own `git` and `rg` (`engine_child`) before anything on its PATH.
        path = posix.environ.get(b"PATH")
        first = plan.path_first.encode()
        posix.putenv(b"PATH", first + b":" + path if path else first)
    try:
        _exec(command)
    except OSError as exc:
        sys.stderr.write(f"crew-landlock: cannot run {command[0]!r}: {exc.strerror}\n")
        return 127 if isinstance(exc, FileNotFoundError) else EXIT_SETUP_FAILED
    return EXIT_SETUP_FAILED  # not reached: exec does not return
