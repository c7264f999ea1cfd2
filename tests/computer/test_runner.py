"""Runner turns with a scripted engine against a REAL crew-server (computer.md §2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from computer_service.engine.base import SessionPlan
from computer_service.upstream import RegisteredTurn, UnreadRoom, Upstream, UpstreamRejected
from crew_harness.waiting import wait_until_async
from crew_testkit.rig import rig
from crew_testkit.scripted import (
    ScriptedEngine,
    blocking,
    fail,
    sleeping,
    succeed,
    wait_for_stop,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def crew_home(tmp_path: Path) -> Path:
    return tmp_path / "crew"


async def test_success_reports_events_in_order_then_acks(crew_server: Any, crew_home: Path) -> None:
    engine = ScriptedEngine()
    async with rig(crew_server, crew_home, engine) as r:
        await r.user.post(r.room["id"], "please write the release note")
        r.runner.wake()
        [turn] = await r.user.finished(r.runner.agent.id, 1)
        assert turn["status"] == "succeeded"
        assert [e["type"] for e in turn["events"]] == ["step_start", "text", "step_finish"]
        assert [e["index"] for e in turn["events"]] == [0, 1, 2]
        assert "please write the release note" in turn["input"]
        assert engine.inputs[0] == turn["input"]  # the engine got exactly what was recorded
        assert turn["rooms"][0]["room_id"] == r.room["id"]
        assert turn["usage"]["input_tokens"] == 10
        # The session the engine kept for the next turn.
        assert r.runner.row()["session_id"] == f"ses-{r.runner.agent.id[:8]}"
        assert r.runner.last_result == "succeeded"
        assert r.metrics.turns["succeeded"] == 1
        # Acked: a new wake-up finds nothing unread and starts no turn.
        r.runner.wake()
        # Idle with no pending wake: that wake's claim is over (and found nothing).
        await wait_until_async(
            "runner idle", lambda: r.runner.state == "idle" and not r.runner.pending_wake
        )
        assert len(engine.inputs) == 1
        assert len(await r.user.turns(r.runner.agent.id)) == 1


async def test_failure_keeps_messages_for_the_next_turn(crew_server: Any, crew_home: Path) -> None:
    engine = ScriptedEngine(script=[fail])
    async with rig(crew_server, crew_home, engine) as r:
        await r.user.post(r.room["id"], "first question")
        r.runner.wake()
        [failed] = await r.user.finished(r.runner.agent.id, 1)
        assert failed["status"] == "failed"
        assert failed["failure"] == {"class": "engine_error", "reason": "the model said boom"}
        assert r.runner.last_reason == "the model said boom"
        r.runner.wake()
        turns = await r.user.finished(r.runner.agent.id, 2)
        assert turns[1]["status"] == "succeeded"
        # Not acked after the failure: the message comes back at the next turn.
        # (Which newer messages come with it is tests/computer/test_delivery.py's.)
        assert "first question" in engine.inputs[1]


async def test_wakes_during_a_turn_merge_into_exactly_one_more(
    crew_server: Any, crew_home: Path
) -> None:
    release = anyio.Event()
    engine = ScriptedEngine(script=[blocking(release)])
    async with rig(crew_server, crew_home, engine) as r:
        await r.user.post(r.room["id"], "first-batch-msg")
        r.runner.wake()
        await engine.started.wait()
        await r.user.post(r.room["id"], "second-batch-msg")
        for _ in range(5):
            r.runner.wake()
        assert r.runner.pending_wake
        release.set()
        turns = await r.user.finished(r.runner.agent.id, 2)
        # Idle with no pending wake: no third turn is coming.
        await wait_until_async(
            "idle", lambda: r.runner.state == "idle" and not r.runner.pending_wake
        )
        assert len(engine.inputs) == 2
        assert [t["status"] for t in turns] == ["succeeded", "succeeded"]
        assert "first-batch-msg" in engine.inputs[0]
        # The first turn was acked: only the new message is in the second input.
        assert "second-batch-msg" in engine.inputs[1] and "first-batch-msg" not in engine.inputs[1]
        assert len(await r.user.turns(r.runner.agent.id)) == 2


async def test_stop_cancels_without_ack(crew_server: Any, crew_home: Path) -> None:
    engine = ScriptedEngine(script=[wait_for_stop])
    async with rig(crew_server, crew_home, engine) as r:
        await r.user.post(r.room["id"], "long job")
        r.runner.wake()
        await engine.started.wait()
        assert r.runner.state == "running"
        assert r.runner.stop_turn()
        [turn] = await r.user.finished(r.runner.agent.id, 1)
        assert turn["status"] == "cancelled"
        assert r.runner.last_result == "cancelled"
        # Not acked: the same message comes back on the next wake-up.
        r.runner.wake()
        turns = await r.user.finished(r.runner.agent.id, 2)
        assert turns[1]["status"] == "succeeded"
        assert "long job" in engine.inputs[1]


async def test_stop_and_completion_at_once_counts_as_stopped(
    crew_server: Any, crew_home: Path
) -> None:
    async def finish_after_stop(
        engine: ScriptedEngine, request: Any, on_event: Any, stop: Any
    ) -> Any:
        engine.started.set()
        await stop.wait()
        # The engine completed anyway: still stopped, no ack.
        return await succeed(engine, request, on_event, stop)

    engine = ScriptedEngine(script=[finish_after_stop])
    async with rig(crew_server, crew_home, engine) as r:
        await r.user.post(r.room["id"], "race")
        r.runner.wake()
        await engine.started.wait()
        r.runner.stop_turn()
        [turn] = await r.user.finished(r.runner.agent.id, 1)
        assert turn["status"] == "cancelled"
        r.runner.wake()
        await r.user.finished(r.runner.agent.id, 2)
        assert "race" in engine.inputs[1]


async def test_a_replaced_connection_stops_without_ack_and_ends_the_runner(
    crew_server: Any, crew_home: Path
) -> None:
    release = anyio.Event()
    engine = ScriptedEngine(script=[blocking(release)])
    async with rig(crew_server, crew_home, engine) as r:
        await r.user.post(r.room["id"], "fenced")
        r.runner.wake()
        await engine.started.wait()
        # A newer connection with the same Computer credential replaces this one.
        token = r.upstream._client.headers["Authorization"].removeprefix("Bearer ")
        newer = Upstream(r.upstream.server_url, token)
        await newer.connect("test", "linux", "0", 2)
        release.set()
        await wait_until_async("runner ended", lambda: r.runner.finished.is_set())
        assert r.runner.superseded
        [turn] = await r.user.turns(r.runner.agent.id)
        assert turn["status"] in ("interrupted", "running")
        # Not acked: the newer connection still finds the message unread.
        rooms = await newer.claim_unread(r.runner.agent.id)
        assert rooms and any("fenced" in str(m.model_dump()) for m in rooms[0].messages)
        await newer.aclose()


async def test_a_hundred_agents_never_exceed_the_cap(crew_server: Any, crew_home: Path) -> None:
    engine = ScriptedEngine(default=sleeping(0.02))
    async with rig(crew_server, crew_home, engine, agents=100, capacity=3) as r:
        for room in r.rooms:
            await r.user.post(room["id"], "hello all")
        for runner in r.runners:
            runner.wake()
        await wait_until_async(
            "a queue at the gate",
            lambda: r.gate.queued > 0 and any(runner.state == "queued" for runner in r.runners),
        )
        await wait_until_async(
            "all 100 turns", lambda: r.metrics.turns["succeeded"] == 100, timeout=60
        )
        assert engine.peak <= 3
        assert r.gate.peak <= 3
        assert sorted(engine.agents) == sorted(x.agent.id for x in r.runners)


class SlowClaim(Upstream):
    """The real upstream, with a claim that waits until released (to stop in between)."""

    claiming: anyio.Event
    release: anyio.Event

    async def claim_unread(
        self, agent_id: str, max_messages: int | None = None
    ) -> list[UnreadRoom]:
        self.claiming.set()
        await self.release.wait()
        return await super().claim_unread(agent_id, max_messages)


async def test_stopped_while_claiming_the_turn_is_not_started(
    crew_server: Any, crew_home: Path
) -> None:
    engine = ScriptedEngine()
    async with rig(crew_server, crew_home, engine, upstream_class=SlowClaim) as r:
        upstream = r.upstream
        assert isinstance(upstream, SlowClaim)
        upstream.claiming, upstream.release = anyio.Event(), anyio.Event()
        await r.user.post(r.room["id"], "stop me early")
        r.runner.wake()
        await upstream.claiming.wait()
        assert r.runner.stop_turn()
        upstream.release.set()
        await wait_until_async("idle", lambda: r.runner.state == "idle")
        assert engine.inputs == []
        assert await r.user.turns(r.runner.agent.id) == []
        # Nothing was acked: the next wake-up handles the message.
        upstream.claiming, upstream.release = anyio.Event(), anyio.Event()
        upstream.release.set()
        r.runner.wake()
        [turn] = await r.user.finished(r.runner.agent.id, 1)
        assert turn["status"] == "succeeded" and "stop me early" in engine.inputs[0]


async def test_an_engine_breaking_its_contract_fails_the_turn_as_processing_failed(
    crew_server: Any, crew_home: Path
) -> None:
    async def explode(engine: ScriptedEngine, request: Any, on_event: Any, stop: Any) -> Any:
        raise RuntimeError("the engine raised")

    engine = ScriptedEngine(script=[explode])
    async with rig(crew_server, crew_home, engine) as r:
        await r.user.post(r.room["id"], "contract")
        r.runner.wake()
        [turn] = await r.user.finished(r.runner.agent.id, 1)
        assert turn["status"] == "failed"
        assert turn["failure"]["reason"] == "processing failed: the engine raised"
        # Not acked: handled again next time, and the runner lives on.
        r.runner.wake()
        turns = await r.user.finished(r.runner.agent.id, 2)
        assert turns[1]["status"] == "succeeded" and "contract" in engine.inputs[1]


async def test_the_turn_record_holds_the_input_of_a_restarted_session(
    crew_server: Any, crew_home: Path
) -> None:
    """The saved session vanished: the engine ran the turn again in a new session, with a
    new session's input. The record shows that input, not the one it was registered with."""

    class Continuing(ScriptedEngine):
        def plan_session(self, agent_id: str, model: str, agents_md: str) -> SessionPlan:
            return SessionPlan("ses-vanished")

    async def restart_in_a_new_session(
        engine: ScriptedEngine, request: Any, on_event: Any, stop: Any
    ) -> Any:
        # As OpenCodeEngine does after `Session not found`: render for a new session.
        engine.inputs.append(request.render_input(True))
        return await succeed(engine, request, on_event, stop)

    engine = Continuing(script=[restart_in_a_new_session])
    async with rig(crew_server, crew_home, engine) as r:
        await r.user.post(r.room["id"], "where were we?")
        r.runner.wake()
        [turn] = await r.user.finished(r.runner.agent.id, 1)
        continued, restarted = engine.inputs
        assert "new session" not in continued and "new session" in restarted
        assert turn["status"] == "succeeded" and turn["input"] == restarted
        assert "where were we?" in turn["input"]
        # A turn that kept its session keeps the registered input.
        await r.user.post(r.room["id"], "and now?")
        r.runner.wake()
        turns = await r.user.finished(r.runner.agent.id, 2)
        assert turns[1]["input"] == engine.inputs[2] and "new session" not in engine.inputs[2]


async def test_the_row_shows_the_session_a_turn_continues(
    crew_server: Any, crew_home: Path
) -> None:
    class Continuing(ScriptedEngine):
        def plan_session(self, agent_id: str, model: str, agents_md: str) -> SessionPlan:
            return SessionPlan("ses-saved-earlier")

    release = anyio.Event()
    engine = Continuing(script=[blocking(release)])
    async with rig(crew_server, crew_home, engine) as r:
        assert r.runner.row()["session_id"] is None
        await r.user.post(r.room["id"], "go on")
        r.runner.wake()
        await engine.started.wait()
        row = r.runner.row()
        assert (row["state"], row["session_id"]) == ("running", "ses-saved-earlier")
        assert row["turn_id"] is not None
        release.set()
        [turn] = await r.user.finished(r.runner.agent.id, 1)
        assert turn["session_id"] == "ses-saved-earlier"
        await wait_until_async("idle", lambda: r.runner.state == "idle")
        # The engine's result names the session that was really used.
        assert r.runner.row()["session_id"] == f"ses-{r.runner.agent.id[:8]}"


async def test_a_queued_turn_that_is_stopped_leaves_the_line_at_once(
    crew_server: Any, crew_home: Path
) -> None:
    release = anyio.Event()
    engine = ScriptedEngine(script=[blocking(release)])
    async with rig(crew_server, crew_home, engine, agents=2, capacity=1) as r:
        first, second = r.runners
        for room in r.rooms:
            await r.user.post(room["id"], "hello")
        first.wake()
        await engine.started.wait()
        second.wake()
        await wait_until_async("queued", lambda: second.state == "queued")
        assert r.gate.queued == 1
        assert second.stop_turn()
        await wait_until_async("out of the line", lambda: second.state == "idle")
        assert r.gate.queued == 0 and r.gate.running == 1
        assert engine.agents == [first.agent.id]
        assert await r.user.turns(second.agent.id) == []
        release.set()
        await r.user.finished(first.agent.id, 1)
        # Its message was never claimed: the next wake-up handles it.
        second.wake()
        [turn] = await r.user.finished(second.agent.id, 1)
        assert turn["status"] == "succeeded"


class Flaky(Upstream):
    """The real upstream, refusing the first `register_turn` or `ack` as the test says."""

    fail_register = 0
    fail_ack = 0

    async def register_turn(self, *args: Any, **kwargs: Any) -> RegisteredTurn:
        if self.fail_register:
            self.fail_register -= 1
            raise UpstreamRejected("POST …/turns: 422 invalid: scripted", status=422)
        return await super().register_turn(*args, **kwargs)

    async def ack(
        self, agent_id: str, turn_id: str, fence: int, set_aside: dict[str, str] | None = None
    ) -> None:
        if self.fail_ack:
            self.fail_ack -= 1
            raise UpstreamRejected("POST …/ack: 409 conflict: scripted", status=409)
        await super().ack(agent_id, turn_id, fence, set_aside)


async def test_a_turn_that_cannot_be_registered_is_only_logged_and_read_again(
    crew_server: Any, crew_home: Path
) -> None:
    engine = ScriptedEngine()
    async with rig(crew_server, crew_home, engine, upstream_class=Flaky) as r:
        assert isinstance(r.upstream, Flaky)
        r.upstream.fail_register = 1
        await r.user.post(r.room["id"], "register me")
        r.runner.wake()
        await wait_until_async("tried", lambda: r.upstream.fail_register == 0)
        await wait_until_async("idle", lambda: r.runner.state == "idle")
        assert engine.inputs == [] and await r.user.turns(r.runner.agent.id) == []
        assert r.runner.last_result is None
        r.runner.wake()
        [turn] = await r.user.finished(r.runner.agent.id, 1)
        assert turn["status"] == "succeeded" and "register me" in engine.inputs[0]


async def test_an_ack_that_fails_fails_the_turn_as_processing_failed(
    crew_server: Any, crew_home: Path
) -> None:
    engine = ScriptedEngine()
    async with rig(crew_server, crew_home, engine, upstream_class=Flaky) as r:
        assert isinstance(r.upstream, Flaky)
        r.upstream.fail_ack = 1
        await r.user.post(r.room["id"], "ack me")
        r.runner.wake()
        [turn] = await r.user.finished(r.runner.agent.id, 1)
        assert turn["status"] == "failed"
        assert turn["failure"]["reason"] == "processing failed: POST …/ack: 409 conflict: scripted"
        assert r.runner.recent[0].failure_class == "engine_error"
        # Not acked: the message comes back at the next wake-up.
        r.runner.wake()
        turns = await r.user.finished(r.runner.agent.id, 2)
        assert turns[1]["status"] == "succeeded" and "ack me" in engine.inputs[1]
