"""The warm engine's ask flow (`engine.approvals.AskFlow`) against a scripted approval desk:
what the person answered becomes OpenCode's reply, and every way of not getting an answer
is a refusal (fail closed)."""

from __future__ import annotations

import time

import anyio
import httpx
import orjson
import pytest

from computer_service.engine.approvals import COLD_REASON, Asked, AskFlow, PersonClock
from computer_service.engine.base import EngineEvent
from computer_service.engine.permission_events import (
    DENIED_TEXT,
    DENY_REASON,
    denial_of,
    wildcard,
)
from computer_service.upstream import (
    AgentRecord,
    TurnApprovals,
    Upstream,
    UpstreamRejected,
    UpstreamUnavailable,
)
from crew_common.permissions import PermissionPolicy
from crew_testkit.approval_desk import FakeDesk

pytestmark = pytest.mark.anyio

ASKED = Asked("per_1", "bash", ["git push origin main"], ["git push *"], "git push origin main")


def _flow(desk: FakeDesk | None) -> tuple[AskFlow, list[EngineEvent]]:
    events: list[EngineEvent] = []

    async def sink(event: EngineEvent) -> None:
        events.append(event)

    return AskFlow(desk, sink, PersonClock(), grace_s=0.5, retry_pause_s=0.01), events


@pytest.mark.parametrize("decision", ["once", "always"])
async def test_an_allowed_ask_is_replied_as_answered(decision: str) -> None:
    desk = FakeDesk(auto=decision)
    flow, events = _flow(desk)
    answer = await flow.decide(ASKED)
    assert answer.body() == {"reply": decision}
    assert desk.asked == [ASKED]
    assert [e.type for e in events] == ["approval_asked", "approval_answered"]
    assert events[0].data == {
        "approval_id": "apr_per_1",
        "tool": "bash",
        "patterns": ["git push origin main"],
        "summary": "git push origin main",
    }
    assert events[1].data["state"] == "allowed" and events[1].data["decision"] == decision


async def test_a_denied_ask_is_a_reject_with_the_reason_the_agent_reads() -> None:
    desk = FakeDesk()
    flow, events = _flow(desk)
    async with anyio.create_task_group() as tg:

        async def person() -> None:
            (card,) = await desk.wait_for_pending()
            desk.answer(card.id, "deny", by="@grace")

        tg.start_soon(person)
        answer = await flow.decide(ASKED)
    assert answer.reply == "reject"
    assert answer.message is not None and answer.message.startswith("Not allowed: denied by @grace")
    assert events[-1].data["reason"] == "denied by @grace"


async def test_no_answer_until_it_expires_is_a_refusal() -> None:
    desk = FakeDesk(expires_in_s=1)
    flow, events = _flow(desk)
    answer = await flow.decide(ASKED)
    assert answer.reply == "reject" and "no answer within 1 s" in (answer.message or "")
    assert events[-1].data["state"] == "expired"


async def test_a_server_silent_past_the_expiry_is_a_refusal_too() -> None:
    desk = FakeDesk(expires_in_s=1)
    desk.wait_errors = [UpstreamUnavailable("down")] * 1000
    flow, events = _flow(desk)
    began = time.monotonic()
    answer = await flow.decide(ASKED)
    assert answer.reply == "reject"
    assert events[-1].data["state"] == "expired"
    assert time.monotonic() - began < 5


async def test_an_unreachable_server_fails_closed_after_a_few_tries() -> None:
    desk = FakeDesk(auto="once")
    desk.create_errors = [UpstreamUnavailable("down", status=503)] * 3
    flow, events = _flow(desk)
    answer = await flow.decide(ASKED)
    assert answer.reply == "reject" and desk.asked == []
    assert [e.type for e in events] == ["permission_denied"]
    assert "could not be reached" in events[0].data["reason"]


async def test_one_failed_create_is_tried_again() -> None:
    desk = FakeDesk(auto="once")
    desk.create_errors = [UpstreamUnavailable("blip", status=502)]
    flow, _ = _flow(desk)
    assert (await flow.decide(ASKED)).reply == "once"


async def test_a_turn_the_server_calls_over_is_refused() -> None:
    desk = FakeDesk(auto="once")
    desk.create_errors = [UpstreamRejected("409 turn_over", status=409, code="turn_over")]
    flow, events = _flow(desk)
    answer = await flow.decide(ASKED)
    assert answer.reply == "reject" and "the turn is over" in (answer.message or "")
    assert events[0].type == "permission_denied"


async def test_no_desk_refuses() -> None:
    flow, events = _flow(None)
    assert (await flow.decide(ASKED)).reply == "reject"
    assert events[0].type == "permission_denied"


async def test_parallel_asks_each_get_their_own_card() -> None:
    desk = FakeDesk()
    flow, events = _flow(desk)
    other = Asked("per_2", "bash", ["npm publish"], ["npm publish *"], "npm publish")
    results: dict[str, str] = {}
    async with anyio.create_task_group() as tg:

        async def ask(asked: Asked) -> None:
            results[asked.request_id] = (await flow.decide(asked)).reply

        tg.start_soon(ask, ASKED)
        tg.start_soon(ask, other)
        cards = await desk.wait_for_pending(2)
        for card in cards:
            desk.answer(card.id, "once" if card.id == "apr_per_1" else "deny")
    assert results == {"per_1": "once", "per_2": "reject"}
    assert len({e.data["approval_id"] for e in events if e.type == "approval_asked"}) == 2


async def test_the_clock_stands_still_while_a_person_is_asked() -> None:
    now = [100.0]
    clock = PersonClock(now=lambda: now[0])
    now[0] = 110.0
    clock.pause()
    clock.pause()  # two asks at once count once
    now[0] = 500.0
    assert clock.used() == 10.0
    clock.resume()
    now[0] = 600.0
    assert clock.used() == 10.0
    clock.resume()
    now[0] = 605.0
    assert clock.used() == 15.0 and clock.paused_s == 490.0


def test_an_agent_record_reads_its_policy_and_a_missing_one_is_the_default() -> None:
    base = {"id": "a1", "handle": "ada", "name": "Ada", "model": "local/m"}
    assert AgentRecord.model_validate(base).permission == PermissionPolicy()
    careful = AgentRecord.model_validate({**base, "permission": {"preset": "careful"}})
    assert careful.permission.preset == "careful" and careful.permission.asks()
    # A policy the Computer cannot read runs read-only (fail closed), never autonomous.
    odd = AgentRecord.model_validate({**base, "permission": {"preset": "yolo"}})
    assert odd.permission.preset == "read-only"
    # A changed policy does not replace the runner (an "Always" during a turn changes it).
    assert careful.settings() == AgentRecord.model_validate(base).settings()


def _tool_use(command: str, output: str) -> EngineEvent:
    data = {"tool": "bash", "input": {"command": command}, "output": output, "failed": True}
    return EngineEvent(type="tool_use", at="2026-12-02T08:00:00Z", data=data)


def test_a_call_a_rule_refused_is_a_permission_denied_event_with_its_reason() -> None:
    policy = PermissionPolicy.parse(
        {"rules": [{"tool": "bash", "pattern": "rm *", "action": "deny"}], "preset": "careful"}
    )
    refused = f"{DENIED_TEXT}. Here are some of the relevant rules []"
    ruled = denial_of(_tool_use("rm -rf x", refused), policy)
    assert ruled is not None and ruled.data == {
        "tool": "bash",
        "summary": "rm -rf x",
        "reason": DENY_REASON,
    }
    # An ask the cold engine had to refuse says so (a part of a longer command too).
    asked = denial_of(_tool_use("cd x && git push origin main", refused), policy)
    assert asked is not None and asked.data["reason"] == COLD_REASON
    # Other failures are no refusal.
    assert denial_of(_tool_use("false", "exit 1"), policy) is None


def test_wildcards_match_as_opencode_matches_them() -> None:
    assert wildcard("git push *", "git push") and wildcard("git push *", "git push -f")
    assert not wildcard("git push *", "git pushx")
    assert wildcard("ls?", "ls1") and wildcard("*", "a\nb") and not wildcard("a.b", "axb")


async def test_the_turns_desk_calls_the_contracts_endpoints() -> None:
    seen: list[tuple[str, str, bytes]] = []
    card = {
        "id": "apr_1",
        "turn_id": "t1",
        "state": "pending",
        "expires_at": "2026-12-02T09:00:00+00:00",
    }

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, str(request.url), request.content))
        if request.method == "POST":
            return httpx.Response(201, json=card)
        return httpx.Response(200, json={**card, "state": "allowed", "decision": "once"})

    upstream = Upstream("http://crew.test", "tok", transport=httpx.MockTransport(handle))
    desk = TurnApprovals(upstream, "t1")
    assert (await desk.create(ASKED)).state == "pending"
    assert (await desk.wait("apr_1", 45)).decision == "once"
    await upstream.aclose()
    assert seen[0][:2] == ("POST", "http://crew.test/computer/turns/t1/approvals")
    assert orjson.loads(seen[0][2]) == {
        "request_id": "per_1",
        "tool": "bash",
        "patterns": ["git push origin main"],
        "always": ["git push *"],
        "summary": "git push origin main",
    }
    # The long-poll asks at most 30 s at a time (the contract's bound).
    assert seen[1][:2] == ("GET", "http://crew.test/computer/approvals/apr_1?wait=30")
