"""The agent's egress policy reaches the launcher, and its denials become turn events (issue 23).

Cold: the run request carries `TurnRequest.egress`, and a `denied` frame of the
run's stream is an `egress_denied` event of the turn. With the in-process
stand-in launcher (no sandbox), the frame injected before the exit frame.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

from computer_service.launcher_client import frame_of
from crew_common.egress import EgressPolicy
from crew_common.launcher_wire import DeniedFrame, ExitFrame, Frame, RunRequest
from tests.computer_unit.engine_fixtures import make_rig, standin_launcher

DENIED = DeniedFrame(
    t="denied", address="169.254.169.254", port=80, protocol="tcp", name="rebind.test", count=2
)


class Denying:
    """The launcher client, with one `denied` frame just before each run's exit frame."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.requests: list[RunRequest] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def run(self, request: RunRequest) -> AsyncGenerator[Frame, None]:
        self.requests.append(request)
        async for frame in self.inner.run(request):
            if isinstance(frame, ExitFrame):
                yield DENIED
            yield frame


@pytest.mark.anyio
async def test_a_cold_turn_sends_its_policy_and_reports_the_denials(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    policy = EgressPolicy.parse({"mode": "allow", "allow": ["github.com:443"]})
    async with standin_launcher() as (client, _):
        launcher = Denying(client)
        rig.use(launcher)  # type: ignore[arg-type]
        result = await rig.turn("hello", egress=policy)
    assert result.status == "succeeded", result.failure
    assert [r.egress.policy() for r in launcher.requests] == [policy]
    denied = [e for e in rig.events if e.type == "egress_denied"]
    assert [e.data for e in denied] == [
        {
            "address": "169.254.169.254",
            "port": 80,
            "protocol": "tcp",
            "name": "rebind.test",
            "count": 2,
        }
    ]


def test_the_client_reads_a_denied_frame() -> None:
    line = DENIED.model_dump_json().encode()
    assert frame_of(line) == DENIED
