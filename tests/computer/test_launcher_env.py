"""The Computer's token stays in the Computer (issue 20, item 8).

With `crew-computer run --config` the token may come from `$CREW_COMPUTER_TOKEN`.
The launcher the Computer starts, and what the launcher runs unsandboxed in the
user's environment (`opencode --version` at its start, `opencode models` for the
model list), must not have it: anything that reads `/proc/<pid>/environ` of
the user's processes, or such a child itself, would. A stand-in `opencode`
writes its whole environment down for each call; the real launcher runs it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from computer_service.bootstrap import TOKEN_ENV, Bootstrap
from computer_service.parts import LocalParts, launcher_env

pytestmark = pytest.mark.anyio

TOKEN = "computer-token-0123456789abcdef"

STANDIN = """#!/bin/sh
env > "{dumps}/$1.env"
case "$1" in
  --version) echo 1.18.33 ;;
  models) echo scripted/model ;;
esac
"""


def test_the_launchers_environment_is_the_computers_without_its_token() -> None:
    environ = {"PATH": "/usr/bin", TOKEN_ENV: TOKEN, "ACME_API_KEY": "k"}
    assert launcher_env(environ) == {"PATH": "/usr/bin", "ACME_API_KEY": "k"}


def test_the_launcher_gets_no_key_the_users_config_names(tmp_path: Path) -> None:
    """A `{env:VAR}` key of the OpenCode config is the model gateway's (issue 23)."""
    config = tmp_path / ".config" / "opencode" / "opencode.json"
    config.parent.mkdir(parents=True)
    options = {"apiKey": "{env:MY_MODEL_KEY}", "headers": {"X-Org": "{env:MY_ORG}"}}
    config.write_text(json.dumps({"provider": {"p": {"options": options}}}))
    environ = {"HOME": str(tmp_path), "PATH": "/usr/bin", "MY_MODEL_KEY": "k", "MY_ORG": "o"}
    assert launcher_env(environ) == {"HOME": str(tmp_path), "PATH": "/usr/bin"}


async def test_the_token_reaches_neither_the_launcher_nor_its_opencode_children(
    tmp_path: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv("ACME_API_KEY", "the-users-key")  # the user's environment is kept
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    opencode = tmp_path / "opencode"
    opencode.write_text(STANDIN.format(dumps=dumps))
    opencode.chmod(0o755)
    boot = Bootstrap(
        server_url="http://127.0.0.1:9",
        token=TOKEN,
        crew_home=isolated_home / ".crew",
        opencode_path=opencode,
    )
    parts = LocalParts(boot)
    status = await parts.start_launcher()
    try:
        assert status.engine_version == "1.18.33", status
        pid = parts._process.pid if parts._process else None
        assert pid is not None
        launcher = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"ACME_API_KEY=the-users-key" in launcher
        assert TOKEN.encode() not in launcher
        assert await parts.models() == ["scripted/model"]
    finally:
        await parts.stop_launcher()
    for call in ("--version", "models"):
        child = (dumps / f"{call}.env").read_text()
        assert "ACME_API_KEY=the-users-key" in child, call
        assert TOKEN not in child and TOKEN_ENV not in child, call
    assert os.environ[TOKEN_ENV] == TOKEN  # the Computer itself still has it
