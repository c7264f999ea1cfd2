"""An agent's permission policy in the real OpenCode 1.18.33 (both engines, the real sandbox,
the scripted model), with a scripted approval desk in place of the crew server.

What these show about OpenCode (docs/warm-engine.md "Permissions"): the config
`PermissionPolicy.to_opencode` writes is accepted; a `deny` rule refuses the
call with the `DeniedError` text and the loop goes on; an `ask` is a
`permission.asked` the warm engine puts to the person, and a `reject` with a
message is what the model reads next, the turn going on; `always` is kept by
the server for the next identical call. The cold engine refuses every ask.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import anyio
import pytest

from computer_service.engine.approvals import COLD_REASON
from computer_service.engine.permission_events import DENIED_TEXT, DENY_REASON
from crew_common.permissions import PermissionPolicy
from crew_harness.scripted_model import Script, ScriptedModel
from crew_testkit.approval_desk import FakeDesk, approval_events
from crew_testkit.engine_rig import EngineRig
from tests.e2e.opencode_by_hand import OPENCODE
from tests.support.ci import required_in_ci

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

# The model's answer depends on the tool's result: it says what it saw.
SCRIPT = {
    "rules": [
        {
            "role": "tool",
            "match": "Not allowed: (?P<why>[^.]*)",
            "reply": {"text": "COULD NOT: {{why}}"},
        },
        {"role": "tool", "match": "prevents you from using", "reply": {"text": "REFUSED BY RULE"}},
        {"role": "tool", "reply": {"text": "RAN IT"}},
        {"match": "MAKE (?P<name>\\w+)", "reply": {"bash": "touch {{name}}.txt"}},
        {"match": "REMOVE", "reply": {"bash": "rm -f nothing.txt"}},
        {
            "match": "BOTH",
            "reply": {
                "tool_calls": [
                    {"name": "bash", "arguments": {"command": "touch a.txt", "description": "a"}},
                    {"name": "bash", "arguments": {"command": "touch b.txt", "description": "b"}},
                ]
            },
        },
    ]
}
POLICY = PermissionPolicy.parse(
    {
        "preset": "autonomous",
        "rules": [
            {"tool": "bash", "pattern": "touch *", "action": "ask"},
            {"tool": "bash", "pattern": "rm *", "action": "deny"},
            # patterns on keys the guess once took for action-only
            {"tool": "todoread", "pattern": "*", "action": "allow"},
            {"tool": "codesearch", "pattern": "x*", "action": "allow"},
        ],
        "ask_timeout_s": 10,
    }
)


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    if not OPENCODE.exists():
        required_in_ci(f"the real OpenCode at {OPENCODE} (scripts/setup installs it)")
    if not os.path.exists("/usr/bin/bwrap"):
        required_in_ci("bwrap (Debian package bubblewrap)")
    with ScriptedModel(Script.parse(SCRIPT)) as started:
        yield started


def _texts(events: list) -> list[str]:
    return [e.data["text"] for e in events if e.type == "text"]


def _tool_outputs(events: list) -> list[str]:
    return [e.data["output"] for e in events if e.type == "tool_use"]


@pytest.mark.timeout(600)
async def test_warm_asks_the_person_and_does_what_they_answered(model: ScriptedModel) -> None:
    async with EngineRig(model, OPENCODE) as rig:
        work = rig.agent("ada").paths.work_dir

        # Allow once: the card, then the command ran and the turn succeeded.
        desk = FakeDesk()
        async with anyio.create_task_group() as tg:

            async def answer() -> None:
                (card,) = await desk.wait_for_pending()
                desk.answer(card.id, "once")

            tg.start_soon(answer)
            once = await rig.turn("warm", "ada", "MAKE once", permission=POLICY, approvals=desk)
        assert once.result.status == "succeeded", once.result
        assert (work / "once.txt").exists()
        (asked,) = desk.asked
        assert (asked.tool, asked.summary, asked.patterns) == (
            "bash",
            "touch once.txt",
            ["touch once.txt"],
        )
        assert asked.request_id.startswith("per_") and asked.always == ["touch *"]
        kinds = approval_events(once.events)
        assert [k for k, _ in kinds] == ["approval_asked", "approval_answered"]
        assert kinds[1][1]["state"] == "allowed" and kinds[1][1]["decision"] == "once"
        assert _texts(once.events)[-1] == "RAN IT"

        # Deny: the command did not run; the model read the reason; the turn went on.
        desk = FakeDesk(auto="deny")
        denied = await rig.turn("warm", "ada", "MAKE denied", permission=POLICY, approvals=desk)
        assert denied.result.status == "succeeded", denied.result
        assert not (work / "denied.txt").exists()
        assert _texts(denied.events)[-1] == "COULD NOT: denied by @user"
        assert "Not allowed: denied by @user" in model.requests()[-1].last_text()
        assert [k for k, _ in approval_events(denied.events)] == [
            "approval_asked",
            "approval_answered",
        ]

        # A deny rule: refused before it runs, an event of its own, the agent goes on.
        ruled = await rig.turn("warm", "ada", "REMOVE", permission=POLICY, approvals=FakeDesk())
        assert ruled.result.status == "succeeded", ruled.result
        assert DENIED_TEXT in _tool_outputs(ruled.events)[0]
        assert approval_events(ruled.events) == [
            (
                "permission_denied",
                {"tool": "bash", "summary": "rm -f nothing.txt", "reason": DENY_REASON},
            )
        ]
        assert _texts(ruled.events)[-1] == "REFUSED BY RULE"

        # Nobody can be asked (the server unreachable): refused, never run.
        desk = FakeDesk()
        closed = await rig.turn("warm", "ada", "MAKE closed", permission=POLICY, approvals=None)
        assert closed.result.status == "succeeded"
        assert not (work / "closed.txt").exists()
        assert [k for k, _ in approval_events(closed.events)] == ["permission_denied"]
        assert _texts(closed.events)[-1].startswith("COULD NOT: the Computer cannot ask")

        # Always: allowed, and the next identical call runs without asking (the server's
        # memory; with the crew server the policy also gains the rule: a new server).
        desk = FakeDesk(auto="always")
        always = await rig.turn("warm", "ada", "MAKE same", permission=POLICY, approvals=desk)
        assert always.result.status == "succeeded" and (work / "same.txt").exists()
        (work / "same.txt").unlink()
        again = await rig.turn("warm", "ada", "MAKE same", permission=POLICY, approvals=desk)
        assert again.result.status == "succeeded" and (work / "same.txt").exists()
        assert len(desk.asked) == 1, desk.asked
        grown = POLICY.with_always("bash", desk.asked[0].always)
        (work / "same.txt").unlink()
        kept = await rig.turn("warm", "ada", "MAKE same", permission=grown, approvals=desk)
        assert kept.result.status == "succeeded" and (work / "same.txt").exists()
        assert len(desk.asked) == 1


@pytest.mark.timeout(600)
async def test_parallel_asks_each_get_a_card_and_waiting_does_not_count(
    model: ScriptedModel,
) -> None:
    async with EngineRig(model, OPENCODE) as rig:
        work = rig.agent("bea").paths.work_dir
        desk = FakeDesk()
        async with anyio.create_task_group() as tg:

            async def answer() -> None:
                cards = await desk.wait_for_pending(2)
                # Longer than the turn's limit: the time a person takes does not count.
                await anyio.sleep(7)
                by_summary = {desk.asked[i].summary: c for i, c in enumerate(cards)}
                desk.answer(by_summary["touch b.txt"].id, "deny")
                desk.answer(by_summary["touch a.txt"].id, "once")

            tg.start_soon(answer)
            both = await rig.turn(
                "warm", "bea", "BOTH", permission=POLICY, approvals=desk, wall_clock_limit_s=6
            )
        assert both.result.status == "succeeded", both.result
        assert sorted(a.summary for a in desk.asked) == ["touch a.txt", "touch b.txt"]
        assert (work / "a.txt").exists() and not (work / "b.txt").exists()
        answered = [d for k, d in approval_events(both.events) if k == "approval_answered"]
        assert sorted(d["state"] for d in answered) == ["allowed", "denied"]
        assert all(d["waited_s"] >= 7 for d in answered)


@pytest.mark.timeout(600)
async def test_the_person_never_answers_the_call_is_refused_after_the_limit(
    model: ScriptedModel,
) -> None:
    async with EngineRig(model, OPENCODE) as rig:
        work = rig.agent("cy").paths.work_dir
        desk = FakeDesk(expires_in_s=10)
        late = await rig.turn("warm", "cy", "MAKE late", permission=POLICY, approvals=desk)
        assert late.result.status == "succeeded", late.result
        assert not (work / "late.txt").exists()
        (answered,) = [d for k, d in approval_events(late.events) if k == "approval_answered"]
        assert answered["state"] == "expired" and answered["waited_s"] >= 10
        assert _texts(late.events)[-1] == "COULD NOT: no answer within 10 s"


@pytest.mark.timeout(600)
async def test_cold_refuses_an_ask_and_the_agent_goes_on(model: ScriptedModel) -> None:
    async with EngineRig(model, OPENCODE) as rig:
        work = rig.agent("dee").paths.work_dir
        desk = FakeDesk(auto="once")
        cold = await rig.turn("cold", "dee", "MAKE cold", permission=POLICY, approvals=desk)
        assert cold.result.status == "succeeded", cold.result
        assert not (work / "cold.txt").exists() and desk.asked == []
        assert approval_events(cold.events) == [
            (
                "permission_denied",
                {"tool": "bash", "summary": "touch cold.txt", "reason": COLD_REASON},
            )
        ]
        assert _texts(cold.events)[-1] == "REFUSED BY RULE"
        # The default policy: everything runs, as before.
        plain = await rig.turn("cold", "dee", "MAKE plain")
        assert plain.result.status == "succeeded" and (work / "plain.txt").exists()
