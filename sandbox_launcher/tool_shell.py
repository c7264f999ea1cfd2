"""The tool shell: `$SHELL` in every Linux sandbox, so each tool runs below the engine.

OpenCode runs each bash tool call as `$SHELL -c COMMAND` (OpenCode 1.18:
`$SHELL` when set and not fish or nu, else `bash` from `PATH`, else
`/bin/sh`), in the engine's own sandbox and with its uid. Without more, a
tool could open `/proc/<engine>/mem` for writing (same uid, the engine is
dumpable; seccomp cannot filter an `open`) and rewrite the engine — for a
warm server, into the agent's next turns (docs/warm-engine.md).

So bwrap sets `SHELL` to a script named `bash` (the name OpenCode shows the
model and whose argument rules it follows) that runs our Landlock helper
with `--tool-shell MODE`: the helper puts the tool in a Landlock domain
nested in the engine's, which restricts no file, then execs the real `bash`
(`sandbox_launcher.landlock.tool_shell`). Landlock denies ptrace,
`/proc/<pid>/mem` and (ABI ≥ 6) signals from a domain to any process outside
it or its descendants: the engine can still kill and wait for its tools,
they cannot reach it.

OpenCode also starts programs by itself, outside any tool: `git` (project and
file status) and `rg` (its grep and glob tools), from its `PATH` — and `rg`
from `$XDG_CACHE_HOME/opencode/bin`, which a tool can write, when none is on
it. So next to the shells lie the engine's own `git` and `rg`
(`engine_bin_dir`, first on the engine's `PATH`: `--path-first`), scripts that
run the helper with `--engine-child MODE NAME REAL`: the real program (found
at the launcher's start in the system's directories) in a tool's domain,
without the engine's secrets, and git without global or system config
(`sandbox_launcher.landlock.engine_child`). The tool shell takes that
directory off a tool's `PATH`: a tool's `git` is the real one.

The scripts are written by the launcher at start below the crew home (hidden
in the sandbox but for them), into a directory named by their content, so
launchers with different interpreters never overwrite each other's (a
directory an older interpreter's launcher wrote stays, a few hundred bytes).

The helper is native when `scripts/setup` could build it
(`native/crew-tool-shell.c`, `native_tool_shell()`), or, in an installed
Computer, the launcher could at its first start (`build_native_tool_shell`,
into the crew home's `tool-shell/native/`): a copy of it lies in
that directory and each script is a `#!` line running it directly, with
its mode (and for git and rg the real program) as the one argument the
kernel passes — no `/bin/sh`, no Python start-up on a tool call. When it is
not built the scripts run the Python helper above (`python -I -S`), the
same rules in the same order, and the launcher's health says so
(`backend.SLOW_TOOL_SHELL_NOTE`).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from sandbox_launcher.landlock import ENGINE_BIN_NAME

SHELL_NAME = "bash"
MODES = ("hybrid", "tmpfs")
# What OpenCode 1.18 starts from its PATH by itself (engine_child), and where the real
# ones are looked for: the system's directories only, never a PATH an agent could shape.
ENGINE_PROGRAMS = ("git", "rg")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
# The native helper: its source, where scripts/setup builds it (named by the source's
# hash, so a stale build is never used), and its copy's name in the shells directory.
NATIVE_SOURCE = Path(__file__).parent / "native" / "crew-tool-shell.c"
NATIVE_BUILD_DIR = Path(__file__).parent / "native" / "build"
NATIVE_NAME = "crew-tool-shell"
NATIVE_DIR_NAME = "native"  # below the tool shells' base: what build_native_tool_shell built
# How an installed launcher builds it when scripts/setup did not (build_native_tool_shell):
# the compilers it looks for in the system's directories and scripts/setup's flags.
COMPILERS = ("cc", "gcc")
NATIVE_CFLAGS = ("-std=c11", "-O2", "-Wall", "-Wextra", "-Werror")
# What the kernel reads of a `#!` line (BINPRM_BUF_SIZE, Linux 5.1+); longer: via /bin/sh.
SHEBANG_LIMIT = 255


def native_build_path(source: Path = NATIVE_SOURCE) -> Path:
    """Where scripts/setup puts the native helper built from `source`."""
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    return NATIVE_BUILD_DIR / f"{NATIVE_NAME}-{digest}"


def native_tool_shell() -> Path | None:
    """The native helper scripts/setup built from the current source, or None (not built)."""
    try:
        path = native_build_path()
    except OSError:
        return None  # no source (an install without it): the Python helper
    return path if os.access(path, os.X_OK) else None


def build_native_tool_shell(into: Path, path: str = SYSTEM_PATH) -> Path | None:
    """The native helper built from the packaged source into `into` (the launcher's own
    directory), for a Computer installed without a checkout's scripts/setup (a wheel,
    pipx, `pip install --user`); None when no C compiler is on `path` or it fails.

    The same flags as scripts/setup (static when libc.a is there), named by the
    source's hash: built once per source, atomically, then reused at every start.
    """
    try:
        source = NATIVE_SOURCE.read_bytes()
    except OSError:
        return None
    target = into / f"{NATIVE_NAME}-{hashlib.sha256(source).hexdigest()[:16]}"
    if os.access(target, os.X_OK):
        return target
    compiler = next((c for c in map(lambda n: shutil.which(n, path=path), COMPILERS) if c), None)
    if compiler is None:
        return None
    into.mkdir(mode=0o755, parents=True, exist_ok=True)
    part = target.with_name(f".{target.name}.{os.getpid()}")
    for static in (["-static"], []):
        argv = [compiler, *NATIVE_CFLAGS, *static, "-o", str(part), str(NATIVE_SOURCE)]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired):
            break
        if done.returncode == 0:
            part.chmod(0o755)
            part.replace(target)
            return target
    part.unlink(missing_ok=True)
    return None


def system_programs(path: str = SYSTEM_PATH) -> dict[str, str | None]:
    """The real `git` and `rg` of this machine (None: not installed), resolved."""
    found = {name: shutil.which(name, path=path) for name in ENGINE_PROGRAMS}
    return {name: os.path.realpath(p) if p else None for name, p in found.items()}


def tool_shell_base(crew_home: Path) -> Path:
    """Where a launcher writes its tool shells: `<crew home>/tool-shell/` (not `runtime/`,
    which the Computer empties after the launcher started)."""
    return crew_home / "tool-shell"


def tool_shell_script(python: str, helper: str, mode: str) -> str:
    """The `$SHELL` of a sandbox in `mode`: our helper nests a tool domain, then execs bash."""
    command = [python, "-I", "-S", helper, "--tool-shell", mode]
    return (
        "#!/bin/sh\n"
        "# crew: runs each tool in a Landlock domain nested in the engine's (tool_shell.py)\n"
        f'exec {shlex.join(command)} "$@"\n'
    )


def engine_child_script(python: str, helper: str, mode: str, name: str, real: str | None) -> str:
    """The engine's own `name` in `mode`: our helper confines the real program, then execs it."""
    command = [python, "-I", "-S", helper, "--engine-child", mode, name, real or ""]
    return (
        "#!/bin/sh\n"
        "# crew: a program OpenCode starts by itself, in a tool's domain (tool_shell.py)\n"
        f'exec {shlex.join(command)} "$@"\n'
    )


def _shebang(interpreter: str, argument: str) -> str | None:
    """`#!INTERPRETER ARGUMENT` when the kernel passes it exactly as given, else None."""
    line = f"#!{interpreter} {argument}\n"
    plain = not any(c in interpreter + argument for c in " \t\n")
    return line if plain and len(line.encode()) <= SHEBANG_LIMIT else None


def native_tool_shell_script(native: str, mode: str) -> str:
    """The `$SHELL` of a sandbox in `mode`, run by the native helper at `native` directly."""
    direct = _shebang(native, f"--tool-shell={mode}")
    if direct is not None:
        return direct
    command = [native, "--tool-shell", mode]
    return f'#!/bin/sh\nexec {shlex.join(command)} "$@"\n'


def native_engine_child_script(native: str, mode: str, name: str, real: str | None) -> str:
    """The engine's own `name` in `mode`, run by the native helper at `native` directly."""
    direct = _shebang(native, f"--engine-child={mode}:{name}:{real or ''}")
    if direct is not None:
        return direct
    command = [native, "--engine-child", mode, name, real or ""]
    return f'#!/bin/sh\nexec {shlex.join(command)} "$@"\n'


def engine_bin_dir(shells: Path, mode: str) -> Path:
    """The directory of the engine's own `git` and `rg` in `mode` (first on its PATH)."""
    return shells / mode / ENGINE_BIN_NAME


def tool_shell_path(shells: Path, mode: str) -> Path:
    """Where the tool shell of `mode` lies in a directory `write_tool_shells` made."""
    return shells / mode / SHELL_NAME


def write_tool_shells(
    base: Path,
    python: str,
    helper: str,
    programs: Mapping[str, str | None] | None = None,
    native: Path | Literal["built"] | None = "built",
) -> Path:
    """Write the tool shells and the engine's own programs of both modes below `base`.

    Returns their directory. `base` must be the caller's own directory (the
    crew home's `tool-shell/`); `programs`: the real `git` and `rg`
    (`system_programs()` when not given); `native`: the native helper to copy
    in and run ("built": the one scripts/setup built, if any; None: the
    Python helper). The directory is named by the scripts' and the helper's
    content: written once, atomically. Directories 0755, scripts and helper
    0755 (the sandbox may run as another user in tests).
    """
    real = system_programs() if programs is None else programs
    binary = native_tool_shell() if native == "built" else native
    files: dict[str, bytes] = {}
    if binary is not None:
        files[NATIVE_NAME] = binary.read_bytes()
    # The scripts name the helper's copy, so the digest must come first: of the helper
    # and of the scripts as they would be with a placeholder for the directory.
    digest_input = [hashlib.sha256(files.get(NATIVE_NAME, b"")).digest()]
    scripts = _scripts("{shells}", python, helper, real, binary is not None)
    digest_input += [text.encode() for text in scripts.values()]
    shells = base / hashlib.sha256(b"".join(digest_input)).hexdigest()[:16]
    for name, text in _scripts(str(shells), python, helper, real, binary is not None).items():
        files[name] = text.encode()
    for name, content in files.items():
        _write_once(shells, shells / name, content)
    return shells


def _scripts(
    shells: str, python: str, helper: str, real: Mapping[str, str | None], native: bool
) -> dict[str, str]:
    """Each script's path below the shells directory `shells` and its text."""
    helper_copy = f"{shells}/{NATIVE_NAME}"
    scripts: dict[str, str] = {}
    for mode in MODES:
        if native:
            scripts[f"{mode}/{SHELL_NAME}"] = native_tool_shell_script(helper_copy, mode)
        else:
            scripts[f"{mode}/{SHELL_NAME}"] = tool_shell_script(python, helper, mode)
        for name in ENGINE_PROGRAMS:
            if native:
                text = native_engine_child_script(helper_copy, mode, name, real.get(name))
            else:
                text = engine_child_script(python, helper, mode, name, real.get(name))
            scripts[f"{mode}/{ENGINE_BIN_NAME}/{name}"] = text
    return scripts


def _write_once(shells: Path, path: Path, content: bytes) -> None:
    """`content` at `path` (0755) unless it is there already; atomically."""
    try:
        if path.read_bytes() == content:
            return
    except OSError:
        pass
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    # `parents=True` made the levels by the umask; the engine user must search them.
    level = path.parent
    while level != shells.parent:
        level.chmod(0o755)
        level = level.parent
    part = path.with_name(f".{path.name}.{os.getpid()}")
    part.write_bytes(content)
    part.chmod(0o755)
    part.replace(path)
