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

The scripts are written by the launcher at start below the crew home (hidden
in the sandbox but for them), into a directory named by their content, so
launchers with different interpreters never overwrite each other's (a
directory an older interpreter's launcher wrote stays, a few hundred bytes).
"""

from __future__ import annotations

import hashlib
import os
import shlex
from pathlib import Path

SHELL_NAME = "bash"
MODES = ("hybrid", "tmpfs")


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


def tool_shell_path(shells: Path, mode: str) -> Path:
    """Where the tool shell of `mode` lies in a directory `write_tool_shells` made."""
    return shells / mode / SHELL_NAME


def write_tool_shells(base: Path, python: str, helper: str) -> Path:
    """Write the tool shells of both modes below `base`; returns their directory.

    `base` must be the caller's own directory (the crew home's `tool-shell/`).
    The directory is named by the scripts' content: written once, atomically.
    Directories 0755 and scripts 0755 (the sandbox may run as another user in tests).
    """
    scripts = {mode: tool_shell_script(python, helper, mode) for mode in MODES}
    digest = hashlib.sha256("".join(scripts.values()).encode()).hexdigest()[:16]
    shells = base / digest
    for mode, text in scripts.items():
        path = tool_shell_path(shells, mode)
        try:
            if path.read_text() == text:
                continue
        except OSError:
            pass
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        for level in (shells, path.parent):  # `parents=True` made `shells` by the umask
            level.chmod(0o755)
        part = path.with_name(f".{SHELL_NAME}.{os.getpid()}")
        part.write_text(text)
        part.chmod(0o755)
        part.replace(path)
    return shells
