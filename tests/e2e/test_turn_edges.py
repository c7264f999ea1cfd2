"""Turns at their edges (issue 20), the whole chain with the real OpenCode, warm and cold.

- HELD, then silence: the agent was shown the news and told it may do nothing; its
  turn succeeds (before: `reply_refused`, three failed turns, the message set aside).
- Setting a message aside never marks another one read: MK2 arrives while MK1's turn
  runs and reaches the agent only through the HELD answer; MK1's turns then fail
  (the model errs after the HELD) and MK1 is set aside — MK2 must still be answered
  (before: the set-aside acknowledged up to the delivered position, MK2 included).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from crew_harness.waiting import wait_until
from tests.e2e.chain import ENGINE_MODES, Chain, running_chain
from tests.e2e.test_chain import having, heredoc, tool_outputs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

HELD_NEWS = r"Not sent: new messages arrived in this room\..*{marker}"


@pytest.fixture(scope="module", params=ENGINE_MODES)
def chain(request: pytest.FixtureRequest) -> Iterator[Chain]:
    """This module's chain: retries after 1 s (doubling), so three failed turns take seconds."""
    with running_chain(engine_mode=request.param, retry_base_s=1) as started:
        yield started


def _first_request_of(chain: Chain, marker: str) -> None:
    wait_until(
        f"the model request with {marker}",
        lambda: any(marker in r.last_text() for r in chain.model.requests()),
        timeout=60,
    )


def test_held_then_nothing_is_a_succeeded_turn(chain: Chain) -> None:
    chain.script(
        [
            {  # slow, so the second message lands before the reply
                "role": "user",
                "match": having("QUIET-1"),
                "reply": {"bash": heredoc("{{room}}", "Answer to QUIET-1."), "delay_s": 3},
            },
            # Shown the news, the agent decides it has nothing to add: no crew reply.
            {"role": "tool", "match": HELD_NEWS.format(marker="QUIET-2"), "reply": {"text": "ok"}},
        ]
    )
    agent = chain.agent("quiet")
    room = chain.group("quiet room", [agent["id"]])
    chain.post(room["id"], "QUIET-1: a question")
    _first_request_of(chain, "QUIET-1")
    chain.post(room["id"], "QUIET-2: never mind")
    turns = chain.settled_turns(agent["id"])
    first = chain.turn(turns[0]["id"])
    assert first["status"] == "succeeded", (first["failure"], chain.diagnostics())
    assert tool_outputs(first)[0].startswith("Not sent: new messages arrived in this room.")
    # One turn, nothing set aside, nothing posted.
    assert len(turns) == 1, turns
    assert [m for m in chain.messages(room["id"]) if m["kind"] == "notice"] == []
    assert chain.agent_messages(room["id"], agent["id"]) == []


def test_a_message_set_aside_leaves_the_one_a_held_answer_showed_unread(chain: Chain) -> None:
    chain.script(
        [
            {
                "role": "user",
                "match": having("MK2-"),
                "reply": {"bash": heredoc("{{room}}", "Answer to MK2.")},
            },
            {  # the first try is slow, so MK2 lands during MK1's turn
                "role": "user",
                "match": having("MK1-"),
                "times": 1,
                "reply": {"bash": heredoc("{{room}}", "Answer to MK1."), "delay_s": 3},
            },
            {
                "role": "user",
                "match": having("MK1-"),
                "reply": {"bash": heredoc("{{room}}", "Answer to MK1.")},
            },
            # After the HELD answer (it shows MK2) the model call fails: a content failure.
            {
                "role": "tool",
                "match": HELD_NEWS.format(marker="MK2-"),
                "reply": {"error": {"status": 400, "message": "scripted bad request"}},
            },
        ]
    )
    agent = chain.agent("marker")
    room = chain.group("markers", [agent["id"]])
    chain.post(room["id"], "MK1-first: a question")
    _first_request_of(chain, "MK1-")
    mk2 = chain.post(room["id"], "MK2-second: another question")
    turns = chain.finished_turns(agent["id"], 4, timeout=150)
    records = [chain.turn(t["id"]) for t in turns]
    statuses = [(t["status"], (t["failure"] or {}).get("class")) for t in records]
    assert statuses[:3] == [("failed", "engine_error")] * 3, (statuses, chain.diagnostics())
    assert all("MK1-first" in t["input"] for t in records[:3])
    # MK1 set aside (the room is told); MK2 answered by a later turn.
    wait_until(
        "the answer to MK2",
        lambda: any(
            m["body"] == "Answer to MK2." for m in chain.agent_messages(room["id"], agent["id"])
        ),
        timeout=60,
    )
    notices = [m["body"] for m in chain.messages(room["id"]) if m["kind"] == "notice"]
    assert len(notices) == 1 and notices[0].startswith(
        "@marker could not handle 1 message here and set it aside unanswered: engine_error: "
    ), notices
    assert "kept" not in notices[0]
    answered = [t for t in records[3:] if "MK2-second" in t["input"]]
    assert answered and answered[0]["status"] == "succeeded", records[3:]
    assert mk2["seq"] > 0
