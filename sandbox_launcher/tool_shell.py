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
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
from collections.abc import Mapping
from pathlib import Path

from sandbox_launcher.landlock import ENGINE_BIN_NAME

SHELL_NAME = "bash"
MODES = ("hybrid", "tmpfs")
# What OpenCode 1.18 starts from its PATH by itself (engine_child), and where the real
# ones are looked for: the system's directories only, never a PATH an agent could shape.
ENGINE_PROGRAMS = ("git", "rg")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


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


def engine_bin_dir(shells: Path, mode: str) -> Path:
    """The directory of the engine's own `git` and `rg` in `mode` (first on its PATH)."""
    return shells / mode / ENGINE_BIN_NAME


def tool_shell_path(shells: Path, mode: str) -> Path:
    """Where the tool shell of `mode` lies in a directory `write_tool_shells` made."""
    return shells / mode / SHELL_NAME


def write_tool_shells(
    base: Path, python: str, helper: str, programs: Mapping[str, str | None] | None = None
) -> Path:
    """Write the tool shells and the engine's own programs of both modes below `base`.

    Returns their directory. `base` must be the caller's own directory (the
    crew home's `tool-shell/`); `programs`: the real `git` and `rg`
    (`system_programs()` when not given). The directory is named by the
    scripts' content: written once, atomically. Directories 0755 and scripts
    0755 (the sandbox may run as another user in tests).
    """
    real = system_programs() if programs is None else programs
    scripts: dict[tuple[str, str], str] = {}
    for mode in MODES:
        scripts[(mode, SHELL_NAME)] = tool_shell_script(python, helper, mode)
        for name in ENGINE_PROGRAMS:
            text = engine_child_script(python, helper, mode, name, real.get(name))
            scripts[(mode, f"{ENGINE_BIN_NAME}/{name}")] = text
    digest = hashlib.sha256("".join(scripts.values()).encode()).hexdigest()[:16]
    shells = base / digest
    for (mode, name), text in scripts.items():
        path = shells / mode / name
        try:
            if path.read_text() == text:
                continue
        except OSError:
            pass
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        # `parents=True` made the levels by the umask; the engine user must search them.
        level = path.parent
        while level != shells.parent:
            level.chmod(0o755)
            level = level.parent
        part = path.with_name(f".{path.name}.{os.getpid()}")
        part.write_text(text)
        part.chmod(0o755)
        part.replace(path)
    return shells
