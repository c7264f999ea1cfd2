"""LocalParts.models: which launcher failures end the run (ModelsFailed) and which are retried."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from computer_service.bootstrap import Bootstrap
from computer_service.launcher_client import (
    LauncherError,
    LauncherRefused,
    LauncherUnavailable,
    ModelsRequest,
)
from computer_service.parts import LocalParts, models_request
from computer_service.parts_protocol import ModelsFailed

pytestmark = pytest.mark.anyio


class ModelsClient:
    """Stands in for the LauncherClient: `models()` raises `error` or answers `names`."""

    def __init__(self, error: Exception | None = None, names: list[str] | None = None) -> None:
        self.error = error
        self.names = names or []
        self.requests: list[ModelsRequest] = []

    async def models(self, request: ModelsRequest) -> list[str]:
        self.requests.append(request)
        if self.error is not None:
            raise self.error
        return self.names

    async def aclose(self) -> None:
        return None


def parts_with(tmp_path: Path, client: ModelsClient | None) -> LocalParts:
    boot = Bootstrap(server_url="http://crew.test", token="t", crew_home=tmp_path / "crew")
    parts = LocalParts(boot, run_id="0123456789abcdef")
    parts.client = client  # type: ignore[assignment]
    return parts


async def test_models_answered(tmp_path: Path, isolated_home: Path) -> None:
    client = ModelsClient(names=["a/b", "c/d"])
    parts = parts_with(tmp_path, client)
    assert await parts.models() == ["a/b", "c/d"]
    # Not logged in, no price table: OpenCode's variables still go along, nothing else.
    [sent] = client.requests
    assert sent.price_table is None and "OPENCODE_AUTH_CONTENT" not in sent.env
    assert sent.env["OPENCODE_DISABLE_PROJECT_CONFIG"] == "1"


async def test_models_request_carries_the_users_setup(isolated_home: Path) -> None:
    auth = isolated_home / ".local" / "share" / "opencode" / "auth.json"
    auth.parent.mkdir(parents=True)
    auth.write_text('{"acme": {"type": "api", "key": "k"}}')
    prices = isolated_home / ".cache" / "opencode" / "models.json"
    prices.parent.mkdir(parents=True)
    prices.write_text('{"acme": {}}')
    sent = models_request(os.environ)
    assert sent.env["OPENCODE_AUTH_CONTENT"] == auth.read_text()
    assert sent.price_table == '{"acme": {}}'
    prices.write_bytes(b"\xff not utf-8")  # left out, logged: the listing still runs
    assert models_request(os.environ).price_table is None


@pytest.mark.parametrize(
    "error",
    [
        LauncherRefused(504, "models_timeout", "opencode models took over 30 s and was stopped"),
        LauncherRefused(502, "models_failed", "opencode models exited 1: boom"),
        LauncherError("the launcher's /models answer is not a list of names"),
    ],
)
async def test_opencode_giving_no_list_is_final(tmp_path: Path, error: Exception) -> None:
    with pytest.raises(ModelsFailed, match=str(error)):
        await parts_with(tmp_path, ModelsClient(error)).models()


async def test_a_launcher_that_is_gone_is_worth_a_retry(tmp_path: Path) -> None:
    with pytest.raises(LauncherUnavailable):
        await parts_with(tmp_path, ModelsClient(LauncherUnavailable("socket gone"))).models()
    with pytest.raises(LauncherUnavailable, match="being restarted"):
        await parts_with(tmp_path, None).models()
