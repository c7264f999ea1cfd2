"""Fixtures for the `crew` tests: a real reference server and the installed `crew`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from crew_testkit.crew_server_proc import start_crew_server
from tests.shim.snapshots import SnapshotFile
from tests.shim.world import CREW_BIN, EXAMPLE_ID, World, make_agent
from tests.support.ci import required_in_ci


@pytest.fixture(scope="session")
def snapshots() -> Iterator[SnapshotFile]:
    file = SnapshotFile()
    yield file
    file.save()


@pytest.fixture
def world(tmp_path: Path, snapshots: SnapshotFile) -> Iterator[World]:
    if not CREW_BIN.exists():
        required_in_ci(f"the installed crew command ({CREW_BIN}; run scripts/setup)")
    server = start_crew_server(tmp_path)
    try:
        computer = server.create_computer()
        alice = make_agent(server, computer, "alice", tmp_path)
        bob = make_agent(server, computer, "bob", tmp_path)
        group = server.create_room("group", [alice.id, bob.id], title="launch")
        dm = server.create_room("dm", [alice.id])
        bob_dm = server.create_room("dm", [bob.id])
        world = World(server, tmp_path, alice, bob, group, dm, bob_dm, snapshots)
        for value, name in (
            (alice.id, "alice-id"),
            (bob.id, "bob-id"),
            (group["id"], "group"),
            (dm["id"], "dm"),
            (bob_dm["id"], "bob-dm"),
            (EXAMPLE_ID, "example-id"),
        ):
            world.normalise.name(value, name)
        yield world
    finally:
        server.stop()
