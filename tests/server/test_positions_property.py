"""Random sequences of posts, replies (held or not), thread messages, mutes, claims and
acks against the store: seq stays gapless, positions stay ordered, thread summaries
count their replies, and draining an agent's unread returns every message it follows
exactly once, in order — nothing is lost, nothing is doubled, whatever the claim bound."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from crew_server.clock import Clock
from crew_server.errors import Held
from crew_server.store import AgentIdentity, Store
from crew_testkit.postgres import PostgresCluster

HANDLES = ("alice", "bob")


class Positions(RuleBasedStateMachine):
    """One Computer, two agents, a dm of alice and a group of both; threads as they come."""

    # Where each run's store lives (SQLite here; a PostgreSQL schema in `OnPostgres`).
    cluster: PostgresCluster | None = None

    @initialize()
    def setup(self) -> None:
        self.store = Store(
            self.cluster.new_schema() if self.cluster else ":memory:",
            Clock(datetime(2026, 10, 5, 9, tzinfo=UTC)),
            claim_max_messages=3,
            claim_max_chars=120,
        )
        self.computer, _ = self.store.create_computer("box")
        self.store.connect(self.computer, "h", "linux", "1", 2)
        self.agents = {
            h: self.store.create_agent(h, h.title(), "", "m/x", "opencode", self.computer)
            for h in HANDLES
        }
        self.dm = self.store.create_room("dm", None, [self.agents["alice"]["id"]])[0]["id"]
        self.group = self.store.create_room("group", "g", [a["id"] for a in self.agents.values()])[
            0
        ]["id"]
        # The model here knows no loop guard: lift it (tests/server/test_loop_guard.py).
        self.store.set_loop_limits(self.group, 100, 600)
        self.roots: list[str] = []
        self.threads: list[str] = []
        self.counter = 0

    def _body(self, size: int) -> str:
        self.counter += 1
        return f"m{self.counter} " + "x" * size

    def _identity(self, handle: str) -> AgentIdentity:
        agent = self.agents[handle]
        return AgentIdentity(agent["id"], handle, self.computer)

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.close()

    # ------------------------------------------------------------ rules

    @rule(to_group=st.booleans(), size=st.integers(0, 150), mention=st.booleans())
    def user_posts(self, to_group: bool, size: int, mention: bool) -> None:
        body = ("@bob " if mention else "") + self._body(size)
        message = self.store.user_post(self.group if to_group else self.dm, body, None)
        if to_group:
            self.roots.append(message["id"])

    @rule(data=st.data(), size=st.integers(0, 60), mention=st.booleans())
    def user_posts_in_a_thread(self, data: st.DataObject, size: int, mention: bool) -> None:
        if not self.roots:
            return
        root = data.draw(st.sampled_from(self.roots))
        body = ("@alice " if mention else "") + self._body(size)
        message = self.store.user_post(self.group, body, root)
        if message["room_id"] not in self.threads:
            self.threads.append(message["room_id"])

    @rule(data=st.data(), handle=st.sampled_from(HANDLES), size=st.integers(0, 60))
    def agent_replies(self, data: st.DataObject, handle: str, size: int) -> None:
        rooms = [self.group, *self.threads] + ([self.dm] if handle == "alice" else [])
        room = data.draw(st.sampled_from(rooms))
        try:
            self.store.reply(self._identity(handle), room, self._body(size), None)
        except Held as held:
            assert held.rooms and held.rooms[0]["room"]["id"] == room
            assert 1 <= len(held.rooms[0]["messages"]) <= 3

    @rule(handle=st.sampled_from(HANDLES), ack=st.booleans())
    def a_turn(self, handle: str, ack: bool) -> None:
        agent_id = self.agents[handle]["id"]
        rooms, more = self.store.claim_unread(self.computer, agent_id)
        count = sum(len(r["messages"]) for r in rooms)
        assert count <= 3 and (count > 0 or not more)
        if ack and rooms:
            turn = self.store.register_turn(self.computer, agent_id, [], "x", "opencode", "m", None)
            self.store.ack(self.computer, agent_id, turn["turn_id"], turn["fence"])
            self.store.finish_turn(
                self.computer, turn["turn_id"], turn["fence"], "succeeded", None, None
            )

    @rule(mute=st.booleans())
    def bob_mutes_or_unmutes(self, mute: bool) -> None:
        if mute:
            self.store.mute(self._identity("bob"), self.group, None)
        else:
            self.store.unmute(self.agents["bob"]["id"], self.group)

    # ------------------------------------------------------------ invariants

    @invariant()
    def seqs_are_gapless_and_summaries_count_replies(self) -> None:
        if not hasattr(self, "store"):
            return
        for room in [self.dm, self.group, *self.threads]:
            messages = self.store.list_messages(room, 0, 1000)
            assert [m["seq"] for m in messages] == list(range(1, len(messages) + 1))
        for thread in self.threads:
            view = self.store.get_room(thread)
            root = self.store.get_message(view["root_message_id"])
            assert root["thread"]["replies"] == len(self.store.list_messages(thread, 0, 1000))

    @invariant()
    def positions_are_ordered(self) -> None:
        if not hasattr(self, "store"):
            return
        for agent in self.agents.values():
            for p in self.store.positions(agent["id"]):
                last = len(self.store.list_messages(p["room_id"], 0, 1000))
                assert 0 <= p["read_seq"] <= p["delivered_seq"] <= last

    @invariant()
    def draining_returns_every_followed_message_once_in_order(self) -> None:
        if not hasattr(self, "store"):
            return
        # On a copy of the database, so the machine goes on from the same state.
        if self.cluster is not None:
            snapshot = self.cluster.copy_schema(self.store._database.url)
            copy = Store(snapshot, self.store.clock, claim_max_messages=3, claim_max_chars=120)
        else:
            copy = Store(":memory:", self.store.clock, claim_max_messages=3, claim_max_chars=120)
            self.store._database.connection.backup(
                copy._database.connection
            )  # a test-only snapshot of the store
        try:
            for agent in self.agents.values():
                expected: dict[str, list[int]] = {}
                for p in copy.positions(agent["id"]):
                    seqs = [m["seq"] for m in copy.list_messages(p["room_id"], p["read_seq"], 1000)]
                    if seqs:
                        expected[p["room_id"]] = seqs
                got: dict[str, list[int]] = {}
                for _ in range(200):
                    rooms, more = copy.claim_unread(self.computer, agent["id"])
                    for r in rooms:
                        got.setdefault(r["room"]["id"], []).extend(m["seq"] for m in r["messages"])
                    if rooms:
                        turn = copy.register_turn(
                            self.computer, agent["id"], [], "x", "opencode", "m", None
                        )
                        copy.ack(self.computer, agent["id"], turn["turn_id"], turn["fence"])
                    if not more:
                        break
                assert got == expected
        finally:
            copy.close()


Positions.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
test_positions_property = Positions.TestCase


def test_positions_property_on_postgresql(postgres_cluster: PostgresCluster) -> None:
    """The same machine on PostgreSQL; fewer runs (each step's snapshot is a schema copy)."""

    class OnPostgres(Positions):
        cluster = postgres_cluster

    run_state_machine_as_test(
        OnPostgres,
        settings=settings(
            max_examples=4,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
