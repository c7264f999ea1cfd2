"""A turn that hits its resource limits fails with `resource_limit`; the other agent's turn,
running at the same time, succeeds (issue 12, "Resources").

The real Computer, server and launcher (bwrap), the fake engine running the
hostile command as a bash tool call would. Limits come from the bootstrap's
`turn_limits`. As root (CI) the run's cgroup caps the bomb; as an ordinary
user RLIMIT_NPROC does (tests/launcher/test_limits.py has both).
"""

from __future__ import annotations

from typing import Any

import pytest

from crew_harness.waiting import wait_until
from crew_testkit.computer_proc import bootstrap_for, launch, machine
from tests.support.computer import need_sandbox, usable
from tests.support.turns import finished

pytestmark = pytest.mark.timeout(150)

# One line (the fake engine takes its command from one line of the turn input).
FORK_BOMB = (
    "python3 -c \"exec('import os, time\\nwhile 1:\\n try: os.fork()\\n"
    " except OSError: time.sleep(0.01)')\""
)
SHM_FILL = "head -c 268435456 /dev/zero > /dev/shm/fill; sleep 600"  # 256 MiB


@pytest.mark.parametrize(
    ("mode", "command", "said"),
    [
        ("hybrid", FORK_BOMB, "turn_limits.max_processes"),
        ("tmpfs", SHM_FILL, "/dev/shm"),
    ],
)
def test_a_turn_at_its_limit_fails_clearly_and_the_other_agent_is_not_harmed(
    crew_server: Any, mode: str, command: str, said: str
) -> None:
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        evil = crew_server.create_agent(f"bomb{mode}", computer_id=comp["computer_id"])
        good = crew_server.create_agent(f"calm{mode}", computer_id=comp["computer_id"])
        evil_dm = crew_server.create_room("dm", [evil["id"]])
        good_dm = crew_server.create_room("dm", [good["id"]])
        limits = {"max_processes": 128, "shm_mb": 8}
        c = launch(
            m,
            bootstrap_for(crew_server.url, comp["token"], m, sandbox_mode=mode, turn_limits=limits),
        )
        try:
            usable(c)
            # The innocent turn is running when the hostile one starts, and outlasts it.
            crew_server.post(good_dm["id"], "take your time:\nFAKE:SLOW 4")
            wait_until(
                "the calm agent's turn to run",
                lambda: any(t["status"] == "running" for t in crew_server.turns(good["id"])),
                30,
            )
            crew_server.post(evil_dm["id"], "be bad:\nFAKE:RUN " + command)
            [hostile] = finished(crew_server, evil["id"], 1, timeout=60)
            [calm] = finished(crew_server, good["id"], 1, timeout=60)
        finally:
            c.stop()
    assert hostile["status"] == "failed", str(crew_server.turn(hostile["id"]))[:3000]
    assert hostile["failure"]["class"] == "resource_limit", hostile
    assert said in hostile["failure"]["reason"], hostile
    assert calm["status"] == "succeeded", calm
