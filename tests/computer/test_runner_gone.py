"""The server says an agent is no longer this runner's, at each call the runner makes.

`StaleTurn` (another Computer owns the agent) fences the runner out;
`Superseded` (another connection with this Computer's token) stops it and
tells its owner. Either way nothing more is written after that call and
`run()` returns. One case per call: the claim, the registration, the ack, the
ack of a failed turn whose answers may have gone out, setting a message aside,
and recording the turn.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from computer_service.engine.base import (
    EngineEvent,
    EventSink,
    Failure,
    FailureClass,
    StopSignal,
    TurnRequest,
    TurnResult,
)
from computer_service.gate import TurnGate
from computer_service.metrics import Metrics
from computer_service.runner import Runner
from computer_service.upstream import (
    AgentRecord,
    RegisteredTurn,
    StaleTurn,
    Superseded,
    UnreadRoom,
    Upstream,
    UpstreamError,
)
from crew_testkit.scripted import AT, ScriptedEngine
from tests.computer.fakes import FakeCrewServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

AGENT = "agent-ada"


class GoneAt(Upstream):
    """The fake server's answers, but the call named `gone_at` raises `error` instead."""

    def __init__(self, *args: Any, gone_at: str, error: UpstreamError, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gone_at = gone_at
        self.error = error
        self.made: list[str] = []  # the runner's calls, in order (event reports left out)

    def _call_named(self, name: str) -> None:
        self.made.append(name)
        if name == self.gone_at:
            raise self.error

    async def claim_unread(
        self, agent_id: str, max_messages: int | None = None
    ) -> list[UnreadRoom]:
        self._call_named("claim")
        return await super().claim_unread(agent_id, max_messages)

    async def register_turn(self, *args: Any, **kwargs: Any) -> RegisteredTurn:
        self._call_named("register")
        return await super().register_turn(*args, **kwargs)

    async def ack(
        self,
        agent_id: str,
        turn_id: str,
        fence: int,
        set_aside: dict[str, str] | None = None,
        *,
        only_if_answered: bool = False,
    ) -> None:
        name = "set_aside" if set_aside else "ack_answered" if only_if_answered else "ack"
        self._call_named(name)
        await super().ack(agent_id, turn_id, fence, set_aside, only_if_answered=only_if_answered)

    async def finish_turn(self, *args: Any, **kwargs: Any) -> None:
        self._call_named("finish")
        await super().finish_turn(*args, **kwargs)


class Workspace:
    agents_md = "# Ada"

    def repair(self) -> str | None:
        return None

    def render_input(self, rooms: list[UnreadRoom], new_session: bool) -> str:
        return "input"

    def save_session(self, session_id: str, model: str) -> None:
        pass


async def crashes(
    engine: ScriptedEngine, request: TurnRequest, on_event: EventSink, stop: StopSignal
) -> TurnResult:
    """A content failure every time: the third on the same message sets it aside."""
    await on_event(EngineEvent("step_start", AT, {}))
    return TurnResult("failed", Failure(FailureClass.PROCESS_CRASHED, "killed by signal 9"))


ERRORS = {
    "stale": StaleTurn("POST …: 409 stale_turn", status=409, code="stale_turn"),
    "superseded": Superseded("POST …: 409 superseded", status=409, code="superseded"),
}

TURN = ["claim", "register", "ack_answered"]
# (the call that is refused, whether the turns fail, the calls the runner makes up to it)
CASES = [
    ("claim", False, ["claim"]),
    ("register", False, ["claim", "register"]),
    ("ack", False, ["claim", "register", "ack"]),
    ("finish", False, ["claim", "register", "ack", "finish"]),
    ("ack_answered", True, ["claim", "register", "ack_answered"]),
    # Set aside after the third failure on the one message (`delivery.SET_ASIDE_AFTER`).
    ("set_aside", True, [*["claim", "register", "ack_answered", "finish"] * 2, *TURN, "set_aside"]),
]


@pytest.mark.parametrize("kind", list(ERRORS))
@pytest.mark.parametrize(("gone_at", "failing", "before"), CASES)
async def test_a_runner_the_server_disowns_writes_nothing_more_and_ends(
    kind: str, gone_at: str, failing: bool, before: list[str]
) -> None:
    server = FakeCrewServer()
    upstream = GoneAt(
        "http://crew.test",
        "computer-token",
        transport=server.transport(),
        gone_at=gone_at,
        error=ERRORS[kind],
    )
    await upstream.connect("test", "linux", "0", 1)
    superseded: list[bool] = []
    runner = Runner(
        AgentRecord(id=AGENT, handle="ada", name="Ada", model="local/fake"),
        upstream=upstream,
        engine=ScriptedEngine(default=crashes) if failing else ScriptedEngine(),
        workspace=Workspace(),
        gate=TurnGate(1),
        metrics=Metrics(),
        on_superseded=lambda: superseded.append(True),
        retry_base_s=0.01,
        retry_window_s=0.05,
    )
    server.post(AGENT, "hello")
    runner.wake()
    try:
        with anyio.fail_after(20):
            await runner.run()
    finally:
        await upstream.aclose()
    assert upstream.made == before
    assert (runner.fenced_out, runner.superseded) == (kind == "stale", kind == "superseded")
    assert superseded == ([True] if kind == "superseded" else [])
