"""Suite-wide fixtures: every test runs with a temporary HOME and CREW_HOME."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# One private PostgreSQL cluster per session, for every package's tests that want it.
from tests.support.postgres import postgres_cluster

__all__ = ["postgres_cluster"]


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point HOME, CREW_HOME and the XDG dirs at a fresh temporary directory.

    Tests never touch the real home; subprocesses inherit these variables.
    """
    home = tmp_path_factory.mktemp("home")
    saved = {k: os.environ.get(k) for k in _HOME_VARS}
    os.environ["HOME"] = str(home)
    os.environ["CREW_HOME"] = str(home / ".crew")
    for key in _HOME_VARS[2:]:
        os.environ.pop(key, None)
    try:
        yield home
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


_HOME_VARS = (
    "HOME",
    "CREW_HOME",
    "XDG_DATA_HOME",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_STATE_HOME",
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
