"""This run's directory, `runtime/<run-id>/`, and the `crew` wrapper in it (computer.md §4).

`RunDirectory` cleans `runtime/` at start (moving aside what cannot be
deleted), writes `bin/crew`, names what that wrapper needs to read inside
the sandbox, and deletes the directory at exit. Every file operation goes
through `safe_fs`: agents can write below `runtime/`.
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import sys
from pathlib import Path

from computer_service import safe_fs
from computer_service.safe_fs import UnsafePath
from crew_common.layout import bin_dir, run_dir

log = logging.getLogger(__name__)

STALE_RUNTIME_PREFIX = "runtime.stale-"


class RunDirectoryError(Exception):
    """Preparing the run directory failed; the message says why."""


def crew_wrapper_script(interpreter: str, shim_dir: Path | None = None) -> str:
    """`bin/crew`: run the shim with this interpreter, isolated (no venv, no PYTHONPATH).

    `-S` as well: `site` (the venv's `.pth` files, an editable install's finder) cost
    more than the shim's own start, on the path of every reply (issue 26's trace). The
    shim needs only the standard library and itself, so its parent directory goes at the
    end of the path: the standard library is found first, and `crew_shim` (the one
    directory of the parent the sandbox grants) from there. A plain `sys.path` entry
    rather than `importlib.util` (which costs ~4 ms more: contextlib and its imports).
    """
    if shim_dir is None:
        shim_dir = _shim_dir()
    if shim_dir.name != "crew_shim":
        raise ValueError(f"the shim's directory must be named crew_shim, not {shim_dir.name}")
    boot = (
        f"import sys; sys.path.append({str(shim_dir.parent)!r}); "
        "from crew_shim.__main__ import main; sys.exit(main())"
    )
    return f'#!/bin/sh\nexec {shlex.quote(interpreter)} -I -S -c {shlex.quote(boot)} "$@"\n'


def _shim_dir() -> Path:
    import crew_shim

    return Path(crew_shim.__file__).resolve().parent


class RunDirectory:
    """`runtime/<run-id>/` of this Computer run: cleaned at start, deleted at exit."""

    def __init__(self, crew_home: Path, run_id: str, interpreter: str | None = None) -> None:
        self.crew_home = crew_home
        self.run_id = run_id
        self.interpreter = interpreter or sys.executable
        self.path = run_dir(crew_home, run_id)
        self.bin_dir = bin_dir(crew_home, run_id)

    def prepare(self) -> None:
        """Delete what earlier runs left in `runtime/`, create this run's dir and `bin/crew`.

        What cannot be deleted never stops the Computer (one agent could
        otherwise brick it for everyone, issue 12): `runtime/` is then moved
        aside to `runtime.stale-<hex>`, and later starts try again to delete it.
        Raises `RunDirectoryError` with the reason (the Computer then exits 1).
        """
        try:
            safe_fs.ensure_dir(self.crew_home, ".")
            self._remove_stale()
            safe_fs.ensure_dir(self.crew_home, "runtime")
            try:
                safe_fs.clear_dir(self.crew_home, "runtime")
            except (UnsafePath, OSError) as exc:
                aside = f"{STALE_RUNTIME_PREFIX}{secrets.token_hex(4)}"
                log.warning("could not empty runtime/ (%s); moving it aside to %s", exc, aside)
                safe_fs.move_aside(self.crew_home, "runtime", aside)
                safe_fs.ensure_dir(self.crew_home, "runtime")
            safe_fs.ensure_dir(self.crew_home, self.bin_dir)
            safe_fs.write_file_atomic(
                self.crew_home,
                self.bin_dir / "crew",
                crew_wrapper_script(self.interpreter).encode(),
                mode=0o700,
            )
        except (UnsafePath, OSError) as exc:
            raise RunDirectoryError(f"cannot prepare the run directory {self.path}: {exc}") from exc

    def _remove_stale(self) -> None:
        """Try again to delete what earlier starts moved aside; log what still resists."""
        with safe_fs.open_dir(self.crew_home, ".") as fd:
            names = [n for n in os.listdir(fd) if n.startswith(STALE_RUNTIME_PREFIX)]
        for name in names:
            try:
                safe_fs.remove_tree(self.crew_home, name)
            except (UnsafePath, OSError) as exc:
                log.warning("could not delete %s: %s", self.crew_home / name, exc)

    def remove(self) -> None:
        """Delete this run's directory (at exit). Logs, never raises."""
        try:
            safe_fs.remove_tree(self.crew_home, self.path)
        except (UnsafePath, OSError) as exc:
            log.warning("could not delete the run directory %s: %s", self.path, exc)

    def interpreter_dirs(self) -> list[Path]:
        """What `bin/crew` needs to read inside the sandbox: interpreter, stdlib, the shim.

        The interpreter may live in `$HOME` (pyenv, a venv in a checkout), so
        these are passed to the launcher as extra read roots. Only the shim's
        own directory is granted, not the checkout around it: the shim imports
        nothing but itself and the standard library (tests/launcher/test_shim_in_sandbox.py).
        """
        shim_dir = _shim_dir()
        candidates = [
            Path(sys.prefix),
            Path(sys.base_prefix),
            shim_dir,
        ]
        seen: list[Path] = []
        for c in candidates:
            c = c.resolve()
            if c not in seen:
                seen.append(c)
        return seen
