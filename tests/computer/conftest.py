"""Fixtures for the Computer's tests: one real crew-server per module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.ci import required_in_ci


@pytest.fixture(scope="module")
def crew_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real `crew-server --dev` subprocess (tests/support/crew_server_proc.py)."""
    try:
        from tests.support.crew_server_proc import start_crew_server
    except ImportError:
        required_in_ci("tests/support/crew_server_proc.py (the crew-server process helper)")
        raise
    server = start_crew_server(tmp_path_factory.mktemp("crew-server"))
    try:
        yield server
    finally:
        server.stop()
