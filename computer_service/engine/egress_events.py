"""The turn events of what an agent's sandbox firewall refused (issue 23).

The launcher summarises the refusals (one per address, port and protocol,
with a count): in a cold run's stream as `denied` frames, for a warm server
through `POST /servers/{id}/denials`. Both become `egress_denied` events of
the turn, in the shape the server records and shows.
"""

from __future__ import annotations

from datetime import UTC, datetime

from computer_service.engine.base import EngineEvent
from crew_common.launcher_wire import DeniedFrame

EGRESS_DENIED = "egress_denied"


def denied_event(frame: DeniedFrame, now: datetime | None = None) -> EngineEvent:
    """One `egress_denied` event of a `denied` frame."""
    return EngineEvent(
        type=EGRESS_DENIED,
        at=(now or datetime.now(UTC)).isoformat(timespec="milliseconds"),
        data={
            "address": frame.address,
            "port": frame.port,
            "protocol": frame.protocol,
            "name": frame.name,
            "count": frame.count,
        },
    )
