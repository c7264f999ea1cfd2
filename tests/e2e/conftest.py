"""The `chain` fixture: one whole chain (tests/e2e/chain.py) per test module (start-up costs seconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.chain import Chain, running_chain


@pytest.fixture(scope="module")
def chain() -> Iterator[Chain]:
    """One whole chain per test module."""
    with running_chain() as started:
        yield started
