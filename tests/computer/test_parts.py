"""LocalParts.models: which launcher failures end the run (ModelsFailed) and which are retried;
CurrentLauncher.run: a run that starts while the launcher is replaced waits for the new one."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import anyio
import pytest

from computer_service.bootstrap import Bootstrap
from computer_service.gateway.engine_view import SECRET_MARKER
from computer_service.launcher_client import (
    LauncherError,
    LauncherNotListening,
    LauncherRefused,
    LauncherUnavailable,
)
from computer_service.parts import CurrentLauncher, LocalParts, models_request
from computer_service.parts_protocol import ModelsFailed
from crew_common.launcher_wire import ExitFrame, Frame, ModelsRequest, StartedFrame

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
    # The login, not its key: the model gateway holds that (issue 23).
    assert json.loads(sent.env["OPENCODE_AUTH_CONTENT"]) == {
        "acme": {"type": "api", "key": SECRET_MARKER}
    }
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


class RunClient:
    """Stands in for the LauncherClient's `run`: refuses the connection, or runs to exit 0."""

    def __init__(self, refuse: bool) -> None:
        self.refuse = refuse
        self.runs = 0

    async def run(self, request: Any) -> AsyncGenerator[Frame, None]:
        self.runs += 1
        if self.refuse:
            raise LauncherNotListening("cannot reach the launcher: connection refused")
        yield StartedFrame(t="started", pid=1)
        yield ExitFrame(t="exit", code=0, stderr_tail="")

    async def aclose(self) -> None:
        return None


async def frames_of(launcher: CurrentLauncher) -> list[str]:
    return [frame.t async for frame in launcher.run(None)]  # type: ignore[arg-type]


async def test_a_run_waits_for_the_launcher_being_replaced(tmp_path: Path) -> None:
    dead = RunClient(refuse=True)
    parts = parts_with(tmp_path, dead)  # type: ignore[arg-type]
    launcher = CurrentLauncher(parts)
    replacement = RunClient(refuse=False)
    got: list[str] = []

    async def run() -> None:
        got.extend(await frames_of(launcher))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        with anyio.fail_after(10):
            while dead.runs == 0:
                await anyio.sleep(0.01)
        parts.client = replacement  # type: ignore[assignment]  # the service started a new one
    assert got == ["started", "exit"]
    assert (dead.runs, replacement.runs) == (1, 1)


async def test_a_run_gives_up_when_no_launcher_comes_back(tmp_path: Path) -> None:
    launcher = CurrentLauncher(parts_with(tmp_path, None), replacement_wait_s=0.05)
    with pytest.raises(LauncherUnavailable, match="being restarted"):
        await frames_of(launcher)


async def test_a_launcher_lost_after_the_run_was_sent_is_not_run_twice(tmp_path: Path) -> None:
    class DiesMidRun(RunClient):
        async def run(self, request: Any) -> AsyncGenerator[Frame, None]:
            # The request went out (the run may have started), then the stream broke.
            self.runs += 1
            raise LauncherUnavailable("lost the launcher during a run")
            yield StartedFrame(t="started", pid=1)  # pragma: no cover

    client = DiesMidRun(refuse=False)
    launcher = CurrentLauncher(parts_with(tmp_path, client))  # type: ignore[arg-type]
    with pytest.raises(LauncherUnavailable, match="during a run"):
        await frames_of(launcher)
    assert client.runs == 1
