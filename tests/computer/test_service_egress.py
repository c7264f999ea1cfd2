"""The Computer's side of issue 23 against a REAL crew-server: each agent's egress policy
reaches its turns, shows in `/agents`, replaces the runner when changed; a policy the
Computer cannot read is the agent's problem; denials are counted in `/metrics`."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from computer_service.engine.base import (
    EngineEvent,
    EventSink,
    StopSignal,
    TurnRequest,
    TurnResult,
)
from computer_service.metrics import Metrics
from computer_service.upstream import AgentRecord, Upstream
from crew_common.egress import EgressPolicy
from crew_harness.waiting import wait_until_async
from crew_testkit.scripted import AT, ScriptedEngine, succeed
from tests.computer.fakes import FakeParts
from tests.computer.test_service_agents import parse_prometheus, serving
from tests.support.computer import problem_of

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

ALLOW = {"mode": "allow", "allow": ["github.com:443", "203.0.113.0/24"]}


def denial(address: str, count: int) -> EngineEvent:
    data = {"address": address, "port": 80, "protocol": "tcp", "name": None, "count": count}
    return EngineEvent("egress_denied", AT, data)


class Recording:
    """A scripted engine's default behaviour that keeps each turn's policy and reports
    two `egress_denied` events before succeeding."""

    def __init__(self) -> None:
        self.policies: list[EgressPolicy] = []

    async def __call__(
        self, engine: ScriptedEngine, request: TurnRequest, on_event: EventSink, stop: StopSignal
    ) -> TurnResult:
        self.policies.append(request.egress)
        await on_event(denial("10.99.0.1", 3))
        await on_event(denial("169.254.169.254", 1))
        return await succeed(engine, request, on_event, stop)


async def test_the_policy_reaches_turns_and_agents_and_a_change_replaces_the_runner(
    crew_server: Any, tmp_path: Path
) -> None:
    comp = crew_server.create_computer()
    ada = crew_server.create_agent("egress-ada", computer_id=comp["computer_id"])
    client = crew_server.client()
    client.patch(f"/api/agents/{ada['id']}", json={"egress": ALLOW}).raise_for_status()
    room = crew_server.create_room("dm", [ada["id"]])
    recording = Recording()
    engine = ScriptedEngine(default=recording)
    crew_home = tmp_path / "crew"
    parts = FakeParts(crew_home, engine)
    async with serving(crew_server, crew_home, parts, comp["token"]) as (service, local):
        rows = (await local.get("/agents")).json()
        assert [(r["handle"], r["egress"]) for r in rows] == [
            ("egress-ada", "allow github.com:443, 203.0.113.0/24")
        ]
        crew_server.post(room["id"], "fetch the repository")
        await wait_until_async("the turn", lambda: service.metrics.turns["succeeded"] == 1)
        assert recording.policies == [EgressPolicy.parse(ALLOW)]
        families = parse_prometheus((await local.get("/metrics")).text)
        assert families["crew_agent_egress_denials_total"].samples == {("agent_id", ada["id"]): 4}
        # the turn record upstream keeps the denials as they were reported
        [turn] = crew_server.turns(ada["id"])
        recorded = crew_server.turn(turn["id"])["events"]
        assert [e["data"]["count"] for e in recorded if e["type"] == "egress_denied"] == [3, 1]

        runner = service.roster.runners[ada["id"]]
        client.patch(
            f"/api/agents/{ada['id']}", json={"egress": {"mode": "none"}}
        ).raise_for_status()
        await wait_until_async(
            "a new runner", lambda: service.roster.runners.get(ada["id"]) not in (None, runner)
        )
        assert (await local.get(f"/agents/{ada['id']}")).json()["egress"] == "none"
        crew_server.post(room["id"], "and now?")
        await wait_until_async("the next turn", lambda: service.metrics.turns["succeeded"] == 2)
        assert recording.policies[-1] == EgressPolicy(mode="none")


async def test_a_policy_the_computer_cannot_read_is_the_agents_problem(
    crew_server: Any, tmp_path: Path
) -> None:
    comp = crew_server.create_computer()
    bea = crew_server.create_agent("egress-bea", computer_id=comp["computer_id"])
    room = crew_server.create_room("dm", [bea["id"]])
    engine = ScriptedEngine()
    crew_home = tmp_path / "crew"
    parts = FakeParts(crew_home, engine)
    async with serving(crew_server, crew_home, parts, comp["token"]) as (service, local):
        assert bea["id"] in service.roster.runners
        # What no API call can store (a newer server's mode, a hand edit), then a change
        # that sends the Computer an `agents` event.
        with sqlite3.connect(crew_server.db) as raw:
            raw.execute(
                "UPDATE agents SET egress = ? WHERE id = ?", ('{"mode": "sideways"}', bea["id"])
            )
        crew_server.client().patch(
            f"/api/agents/{bea['id']}", json={"name": "Bea"}
        ).raise_for_status()
        reason = await wait_until_async("the problem", lambda: problem_of(crew_server, bea["id"]))
        assert reason.startswith("its egress policy from the server cannot be used: ")
        assert "egress mode 'sideways' is not one of open, public, allow, none" in reason
        assert bea["id"] not in service.roster.runners
        row = (await local.get(f"/agents/{bea['id']}")).json()
        assert row["state"] == "problem" and row["egress"] == "unusable (see problem)"
        crew_server.post(room["id"], "are you there?")
        # A wake of a problem agent prepares it again: still refused, nothing runs.
        assert (await local.post(f"/agents/{bea['id']}/wake")).status_code == 409
        assert engine.inputs == []

        with sqlite3.connect(crew_server.db) as raw:
            raw.execute(
                "UPDATE agents SET egress = ? WHERE id = ?", ('{"mode": "public"}', bea["id"])
            )
        crew_server.client().patch(
            f"/api/agents/{bea['id']}", json={"name": "Bea 2"}
        ).raise_for_status()
        await wait_until_async("the runner", lambda: bea["id"] in service.roster.runners)
        await wait_until_async(
            "the problem cleared", lambda: not problem_of(crew_server, bea["id"])
        )


BASE = {"id": "a", "handle": "h", "name": "N", "model": "x/y"}


def test_a_record_without_a_policy_is_public_and_a_bad_one_never_open() -> None:
    assert AgentRecord.model_validate(BASE).egress == EgressPolicy()
    assert AgentRecord.model_validate({**BASE, "egress": None}).egress_problem is None
    bad = AgentRecord.model_validate({**BASE, "egress": {"mode": "open", "allow": ["x"]}})
    assert bad.egress.mode == "none" and bad.egress_problem is not None
    assert "takes no allow rules" in bad.egress_problem
    assert bad.egress_summary() == "unusable (see problem)"
    odd = AgentRecord.model_validate({**BASE, "egress": "open"})
    assert odd.egress_problem is not None and "egress is an object" in odd.egress_problem


def test_a_new_policy_replaces_the_runner_and_the_same_one_does_not() -> None:
    allow = AgentRecord.model_validate({**BASE, "egress": ALLOW})
    assert allow.settings() != AgentRecord.model_validate(BASE).settings()
    reordered = {"allow": ["GITHUB.com:443", "203.0.113.0/24"], "mode": "allow"}
    assert AgentRecord.model_validate({**BASE, "egress": reordered}).settings() == allow.settings()
    # A policy that became unreadable is a change too, even against `none`.
    none = AgentRecord.model_validate({**BASE, "egress": {"mode": "none"}})
    broken = AgentRecord.model_validate({**BASE, "egress": {"mode": "sideways"}})
    assert none.egress == broken.egress and none.settings() != broken.settings()


def test_denials_count_per_agent_and_a_missing_count_is_one() -> None:
    metrics = Metrics()
    assert "egress" not in metrics.render()
    metrics.egress_denied("a1", "ada", 3)
    metrics.egress_denied("a1", "ada", None)
    metrics.egress_denied("a2", 'b"e', True)
    families = parse_prometheus(metrics.render())
    assert families["crew_agent_egress_denials_total"].samples == {
        ("agent_id", "a1"): 4,
        ("agent_id", "a2"): 1,
    }
    assert 'handle="b\\"e"' in metrics.render()


async def test_finish_sends_the_gateway_usage_only_when_there_is_one() -> None:
    bodies: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(orjson.loads(request.content))
        return httpx.Response(204)

    upstream = Upstream("http://crew.test", "t", transport=httpx.MockTransport(answer))
    gateway = {"requests": 1, "input_tokens": 5, "rate_limited": 1, "retry_after_s": 2.0}
    try:
        await upstream.finish_turn("t1", 1, "succeeded", None, {}, gateway_usage=gateway)
        await upstream.finish_turn("t2", 1, "succeeded", None, {})
    finally:
        await upstream.aclose()
    assert bodies[0]["gateway_usage"] == gateway
    assert "gateway_usage" not in bodies[1]
