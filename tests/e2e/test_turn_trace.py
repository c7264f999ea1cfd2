"""A turn's trace through the whole chain (issue 26), warm and cold: the real OpenCode
runs `crew reply` (through the Computer's `bin/crew`), and the turn record says when each
step of the reply's path happened, in that order."""

from __future__ import annotations

from datetime import datetime

import pytest

from crew_harness.scripted_model import ROOM_ID
from tests.e2e.chain import Chain

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

WARM_PATH = [
    "post",
    "wake",
    "claimed",
    "registered",
    "server_ready",
    "prompt_sent",
    "engine_accepted",
    "first_token",
    "reply_received",
    "reply_stored",
]
# A cold turn has no server to get and no prompt to send: its process starts.
COLD_PATH = [s for s in WARM_PATH if s not in ("server_ready", "prompt_sent")]


def test_a_replying_turn_records_each_step_of_the_path_in_order(chain: Chain) -> None:
    chain.script(
        [
            {
                "role": "user",
                "match": rf"TRACE-1(?s:.*)Reply with: crew reply (?P<room>{ROOM_ID})",
                "reply": {"bash": "crew reply {{room}} <<'EOF'\ntraced\nEOF"},
            }
        ]
    )
    ada = chain.agent("tracy")
    room = chain.dm(ada["id"])
    sent = chain.post(room["id"], "TRACE-1: where does the time go?")
    [turn] = chain.finished_turns(ada["id"], 1)
    assert turn["status"] == "succeeded", (turn["failure"], chain.diagnostics())
    [reply] = chain.agent_messages(room["id"], ada["id"])
    assert reply["body"] == "traced"

    trace = turn["trace"]
    path = WARM_PATH if chain.engine_mode == "warm" else COLD_PATH
    assert set(trace) == {*path, "acked"}, trace
    if chain.engine_mode == "cold":
        # `opencode run` prints a tool call once it has finished: the first line of the
        # model's that the Computer sees is that call's, after the reply it sent.
        path = [s for s in path if s != "first_token"]
    stamps = [trace[s] for s in path] + [trace["acked"]]
    assert stamps == sorted(stamps), trace
    posted = sent["created_at"]
    assert abs(trace["post"] - _ms(posted)) <= 1
    # The reply reached the server, was posted (its message's time), then the write ended.
    assert trace["reply_received"] <= _ms(reply["created_at"]) <= trace["reply_stored"]


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)
