"""LocalParts.models: which launcher failures end the run (ModelsFailed) and which are retried."""

from __future__ import annotations

from pathlib import Path

import pytest

from computer_service.bootstrap import Bootstrap
from computer_service.launcher_client import LauncherError, LauncherRefused, LauncherUnavailable
from computer_service.parts import LocalParts
from computer_service.parts_protocol import ModelsFailed

pytestmark = pytest.mark.anyio


class ModelsClient:
    """Stands in for the LauncherClient: `models()` raises `error` or answers `names`."""

    def __init__(self, error: Exception | None = None, names: list[str] | None = None) -> None:
        self.error = error
        self.names = names or []

    async def models(self) -> list[str]:
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


async def test_models_answered(tmp_path: Path) -> None:
    parts = parts_with(tmp_path, ModelsClient(names=["a/b", "c/d"]))
    assert await parts.models() == ["a/b", "c/d"]


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
