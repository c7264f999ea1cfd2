"""Fixtures for the Computer's tests: one real crew-server per module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from crew_testkit.crew_server_proc import start_crew_server


@pytest.fixture(scope="module")
def crew_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real `crew-server --dev` subprocess (crew_testkit/crew_server_proc.py)."""
    server = start_crew_server(tmp_path_factory.mktemp("crew-server"))
    try:
        yield server
    finally:
        server.stop()
