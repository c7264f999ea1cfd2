"""The `chain` fixture: one whole chain (tests/e2e/chain.py) per test module and engine mode.

Each module's tests run first against a warm Computer, then against a cold one
(pytest groups the tests by the module-scoped parameter, so each mode starts
one chain). After every test, `check_engine` proves the turns ran in that mode.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.chain import ENGINE_MODES, Chain, running_chain


@pytest.fixture(scope="module", params=ENGINE_MODES)
def chain(request: pytest.FixtureRequest) -> Iterator[Chain]:
    """One whole chain per test module and engine mode (`warm`, `cold`)."""
    with running_chain(engine_mode=request.param) as started:
        yield started


@pytest.fixture(autouse=True)
def engine_checked(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used a chain, assert its turns ran in the chain's engine mode."""
    yield
    if "chain" not in request.fixturenames:
        return
    chain: Chain = request.getfixturevalue("chain")
    if chain.computer.proc.poll() is None:  # the last test of a module stops the Computer
        chain.check_engine()
