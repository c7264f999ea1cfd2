"""A prewarm's warm-up through a model call the gateway answers itself (issue 26), on the
real OpenCode 1.18.33 in the real sandbox: a hint starts the agent's warm server and
warms it up with a prompt to the twin provider (`gateway.warm_up`); the gateway answers
it with its canned stream, the scripted upstream provider sees NO request from it, no
warm-up session is left, and the turn after it works on the same server."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from crew_harness.waiting import wait_until
from tests.computer.test_prewarm_hints import metric, open_room_page
from tests.e2e.chain import Chain, running_chain

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def warm_chain() -> Iterator[Chain]:
    with running_chain(engine_mode="warm") as started:
        yield started


def metrics(chain: Chain) -> str:
    with chain.computer.introspection() as local:
        return str(local.get("/metrics").text)


def session_titles(crew_home: Path) -> list[str]:
    """Every session OpenCode keeps in the agents' data directories (its SQLite store)."""
    titles: list[str] = []
    for db in crew_home.rglob("opencode.db"):
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            titles += [row[0] for row in conn.execute("select title from session")]
    return titles


def test_the_warm_up_is_a_model_call_the_gateway_answers_and_the_provider_never_sees(
    warm_chain: Chain,
) -> None:
    chain = warm_chain
    chain.script([{"role": "user", "match": "WARMED", "reply": {"text": "after warm-up"}}])
    ada = chain.agent("warmy")
    room = chain.dm(ada["id"])
    open_room_page(chain.server, room["id"])
    wait_until(
        "the prewarm's server",
        lambda: metric(metrics(chain), "crew_prewarm_starts_total") == 1,
        120,
    )
    text = metrics(chain)
    assert metric(text, "crew_gateway_warm_up_answers_total") >= 1, chain.diagnostics()
    assert metric(text, "crew_gateway_warm_up_refused_total") == 0
    assert metric(text, "crew_gateway_requests_total") == 0  # nothing forwarded
    assert chain.model.requests("all") == []  # the provider saw nothing of it
    assert "a model call answered by the gateway" in chain.computer.stderr()
    assert "crew warm-up" not in session_titles(chain.crew_home)  # deleted

    chain.post(room["id"], "WARMED: hello")
    [turn] = chain.finished_turns(ada["id"], 1)
    assert turn["status"] == "succeeded", (turn["failure"], chain.diagnostics())
    [call] = chain.model.requests("all")  # the turn's one model call, and nothing else
    assert "WARMED" in call.last_text()
    text = metrics(chain)
    assert metric(text, "crew_warm_starts_total") == 1  # the prewarm's server, used
    assert metric(text, "crew_gateway_requests_total") >= 1  # the turn's call was forwarded
    assert metric(text, "crew_cold_turns_total") == 0
    # The store read above is the one that holds the turn's session (not an empty look).
    assert session_titles(chain.crew_home) == ["crew turn"]
