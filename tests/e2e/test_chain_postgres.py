"""The whole chain once over PostgreSQL with two server processes: the Computer is
connected to one, the user posts through the other, and the agent's reply (sent by
`crew` inside the sandbox to the Computer's process) is stored where both read it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from crew_testkit.postgres import PostgresCluster
from tests.e2e.chain import ENGINE_MODES, Chain, running_chain
from tests.e2e.test_chain import having, heredoc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture(scope="module", params=ENGINE_MODES)
def chain(request: pytest.FixtureRequest, postgres_cluster: PostgresCluster) -> Iterator[Chain]:
    """One chain on a fresh PostgreSQL database, two server processes, per engine mode."""
    with running_chain(postgres_cluster.new_database(), request.param) as started:
        yield started


def test_a_message_posted_through_one_process_is_answered_through_the_other(
    chain: Chain,
) -> None:
    assert chain.http.base_url != chain.server.url  # the user is on the other process
    chain.script(
        [{"role": "user", "match": having("PG-1"), "reply": {"bash": heredoc("{{room}}", "pong")}}]
    )
    ada = chain.agent("ada")
    room = chain.dm(ada["id"])
    chain.post(room["id"], "PG-1: ping")

    [turn] = chain.finished_turns(ada["id"], 1)

    assert turn["status"] == "succeeded", (turn["failure"], chain.diagnostics())
    [reply] = chain.agent_messages(room["id"], ada["id"])
    assert reply["body"] == "pong"
    positions = chain.expect_ok(chain.http.get(f"/api/agents/{ada['id']}/positions"))
    assert positions == [{"room_id": room["id"], "delivered_seq": 2, "read_seq": 2}]
