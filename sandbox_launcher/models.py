"""`POST /models`: `opencode models`, without writing anything into the user's home.

OpenCode writes on every start: its database, log and lock directories in
its XDG data/state dirs, a `.gitignore` in its config dir, a background
`npm install` of a plugin (REPORT.md §1, §6), and a project id into the
`.git` of its working directory. Run in the user's own environment, that
all landed in the user's real directories. So it runs here with scratch XDG
data/state/cache/config directories (the config one with the npm stub the
turns get) and a scratch working directory, all removed afterwards. What it
needs of the user's OpenCode setup the Computer reads and sends in the
request (`ModelsRequest`), the way a turn gets it: credentials as
`OPENCODE_AUTH_CONTENT`, the `provider` section in `OPENCODE_CONFIG_CONTENT`,
and the price table (the model catalog), written into the scratch cache. The
launcher reads none of the user's files itself. The rest of the user's
environment (API keys in variables, proxies) stays as it is.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

from crew_common.launcher_wire import ModelsRequest
from crew_common.layout import NPM_STUB_LOCK
from sandbox_launcher.engine_run import reap_group

log = logging.getLogger(__name__)

MODELS_TIMEOUT_S = 30.0
_MODEL_LINE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/\S+$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_XDG = {
    "XDG_DATA_HOME": "data",
    "XDG_CONFIG_HOME": "config",
    "XDG_CACHE_HOME": "cache",
    "XDG_STATE_HOME": "state",
}


class ModelsFailed(Exception):
    """`opencode models` did not give a list; `status`/`code` for the answer."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def listing_env(
    scratch: Path, request: ModelsRequest, environ: Mapping[str, str]
) -> dict[str, str]:
    """Prepare `scratch` (XDG dirs, npm stub, the price table) and return the run's environment."""
    env = {**environ, **request.env, "PWD": str(scratch / "work")}
    for name, sub in _XDG.items():
        env[name] = str(scratch / sub)
        (scratch / sub / "opencode").mkdir(parents=True)
    (scratch / "work").mkdir()
    (scratch / "config" / "opencode" / "node_modules").mkdir()
    (scratch / "config" / "opencode" / "package-lock.json").write_bytes(NPM_STUB_LOCK)
    if request.price_table is not None:
        (scratch / "cache" / "opencode" / "models.json").write_text(
            request.price_table, encoding="utf-8"
        )
    return env


async def list_models(
    opencode: str, request: ModelsRequest, environ: Mapping[str, str] | None = None
) -> list[str]:
    """Run `opencode models` (30 s cap) as the module doc says; keep the `provider/model` lines."""
    with tempfile.TemporaryDirectory(prefix="crew-models-") as scratch:
        try:
            env = await anyio.to_thread.run_sync(
                listing_env, Path(scratch), request, os.environ if environ is None else environ
            )
        except OSError as exc:
            raise ModelsFailed(
                502, "models_failed", f"cannot prepare a scratch directory for it: {exc}"
            ) from exc
        return await _run(opencode, env)


async def _run(opencode: str, env: dict[str, str]) -> list[str]:
    process = await anyio.open_process(
        [opencode, "models"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=env["PWD"],
        env=env,
        start_new_session=True,
    )
    out, err = bytearray(), bytearray()

    async def read_into(stream: Any, buf: bytearray) -> None:
        async for chunk in stream:
            buf.extend(chunk)

    try:
        with anyio.move_on_after(MODELS_TIMEOUT_S) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_into, process.stdout, out)
                tg.start_soon(read_into, process.stderr, err)
                await process.wait()
                _kill_group(process.pid)  # a child left holding the pipes must not delay us
    finally:
        with anyio.CancelScope(shield=True):
            _kill_group(process.pid)
            await process.wait()
            reap_group(process.pid)  # only after the leader was waited for
            await process.aclose()
    if scope.cancelled_caught:
        raise ModelsFailed(504, "models_timeout", "opencode models took over 30 s and was stopped")
    if process.returncode != 0:
        tail = _ANSI.sub("", err.decode("utf-8", "replace")).strip()[-300:]
        raise ModelsFailed(
            502, "models_failed", f"opencode models exited {process.returncode}: {tail}"
        )
    lines = out.decode("utf-8", "replace").splitlines()
    return [line.strip() for line in lines if _MODEL_LINE.match(line.strip())]


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone: the normal case
        os.killpg(pgid, signal.SIGKILL)
