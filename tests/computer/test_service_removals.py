"""A real crew-server deleting what a running Computer serves (issue 25): a deleted agent's
running turn stops and its runner goes, the service goes on; a deleted Computer stops with
one line saying its token was revoked."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from computer_service.bootstrap import Bootstrap
from computer_service.parts_protocol import StartupFailed
from computer_service.service import ComputerService
from crew_harness.waiting import wait_until_async
from crew_testkit.crew_server_proc import start_crew_server
from crew_testkit.scripted import ScriptedEngine, wait_for_stop
from tests.computer.fakes import FakeParts


@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_deleting_its_agent_stops_the_turn_and_deleting_it_stops_the_computer(
    tmp_path: Path,
) -> None:
    (tmp_path / "srv").mkdir()
    server = start_crew_server(tmp_path / "srv")
    crew_home = tmp_path / "crew"
    engine = ScriptedEngine(script=[wait_for_stop])
    try:
        comp = server.create_computer()
        ada = server.create_agent("ada", computer_id=comp["computer_id"])
        bob = server.create_agent("bob", computer_id=comp["computer_id"])
        room = server.create_room("dm", [ada["id"]])
        boot = Bootstrap(server_url=server.url, token=comp["token"], crew_home=crew_home)
        service = ComputerService(boot, FakeParts(crew_home, engine), handle_signals=False)
        failures: list[str] = []

        async def serve() -> None:
            # `crew-computer` prints this one line and exits 1 (computer_service.__main__).
            with pytest.raises(StartupFailed) as failed:
                await service.serve()
            failures.append(str(failed.value))

        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            server.post(room["id"], "a long job, please")
            with anyio.fail_after(20):
                await engine.started.wait()
            deleted = server.client().delete(f"/api/agents/{ada['id']}")
            assert deleted.status_code == 204, deleted.text
            # Its runner goes, its turn with it (the engine was told to stop); bob stays.
            await wait_until_async(
                "ada's runner to go", lambda: ada["id"] not in service.roster.runners, 20
            )
            await wait_until_async("the turn to stop", lambda: engine.running == 0, 20)
            assert bob["id"] in service.roster.runners and not failures

            deleted = server.client().delete(f"/api/computers/{comp['computer_id']}")
            assert deleted.status_code == 204, deleted.text
            await wait_until_async("the Computer to stop", lambda: failures, 30)
        assert "was deleted on the crew server" in failures[0], failures
        assert "token" in failures[0] and "revoked" in failures[0]
    finally:
        server.stop()
