"""A warm turn that runs into its sandbox's caps fails `resource_limit`, as a cold turn does.

Real OpenCode (`opencode serve` and `opencode run`), the real launcher and
sandbox with small `turn_limits`, the scripted model whose bash call is a
fork bomb or a big allocation. The warm turn's failure is the cold turn's
(same class, same reason); the agent's next turn succeeds on a new server,
and another agent's server, up since before, serves on untouched (issue 13).
As root the caps are the servers' cgroups (v1 on this host, v2 when
delegated); without a cgroup only the process count is watched.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from computer_service.bootstrap import TurnLimits
from computer_service.engine.base import FailureClass
from crew_harness.scripted_model import Script, ScriptedModel
from crew_testkit.engine_rig import EngineRig
from sandbox_launcher.limits import CGROUP_PREFIX, find_cgroup_parents
from tests.e2e.opencode_by_hand import OPENCODE
from tests.support.ci import required_in_ci

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

# Small enough to hit at once, big enough for OpenCode and its bash tool.
LIMITS = TurnLimits(max_processes=192, memory_mb=1024)
FORK_BOMB = (
    "python3 -c \"exec('import os, time\\nwhile 1:\\n try: os.fork()\\n"
    " except OSError: time.sleep(0.01)')\""
)
MEMORY_HOG = "python3 -c \"b = b'x' * (3 << 30); print(len(b))\""  # 3 GiB, touched
SCRIPT = {
    "rules": [
        {"match": "TOOL", "reply": {"bash": "echo hello > out.txt && cat out.txt"}},
        {"match": "FORKBOMB", "reply": {"bash": FORK_BOMB}},
        {"match": "MEMHOG", "reply": {"bash": MEMORY_HOG}},
    ]
}


def _in_a_run_cgroup(pid: int) -> bool:
    """Is the process in one of the launcher's cgroups, for both the pids and memory caps?"""
    with open(f"/proc/{pid}/cgroup", encoding="ascii") as f:
        rows = [line.split(":", 2) for line in f.read().splitlines()]
    ours = {
        part
        for _, controllers, path in rows
        if CGROUP_PREFIX in path
        for part in controllers.split(",")
    }
    return {"pids", "memory"} <= ours or any(c == "" and CGROUP_PREFIX in p for _, c, p in rows)


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    if not OPENCODE.exists():
        required_in_ci(f"the real OpenCode at {OPENCODE} (scripts/setup installs it)")
    if not os.path.exists("/usr/bin/bwrap"):
        required_in_ci("bwrap (Debian package bubblewrap)")
    with ScriptedModel(Script.parse(SCRIPT)) as started:
        yield started


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    ("turn_text", "said"),
    [("FORKBOMB", "turn_limits.max_processes"), ("MEMHOG", "turn_limits.memory_mb")],
)
async def test_a_warm_turn_at_its_cap_fails_as_a_cold_one_and_the_next_turn_runs(
    model: ScriptedModel, turn_text: str, said: str
) -> None:
    capped = find_cgroup_parents() is not None
    if not capped and (os.getuid() == 0 or turn_text == "MEMHOG"):
        required_in_ci("a cgroup for the sandboxes (the memory cap, and root's process cap)")
    async with EngineRig(model, OPENCODE, turn_limits=LIMITS) as rig:
        for agent_id in ("hog", "calm", "coldhog"):
            rig.agent(agent_id)
        pool = rig.pool
        # The other agent's server is up before the hostile turn, and must stay so.
        calm = await rig.turn("warm", "calm", "TOOL")
        assert calm.result.status == "succeeded", calm.result
        calm_pid = pool.servers["calm"].server_pid

        warm_turns = pool.counters.warm_turns
        hostile = await rig.turn("warm", "hog", turn_text)
        assert pool.counters.warm_turns == warm_turns + 1  # it ran warm, not cold
        cold = await rig.turn("cold", "coldhog", turn_text)

        assert cold.result.failure is not None, cold.result
        assert cold.result.failure.cls is FailureClass.RESOURCE_LIMIT, cold.result
        assert hostile.result.status == "failed", hostile.result
        assert hostile.result.failure == cold.result.failure, hostile.result
        assert said in hostile.result.failure.reason
        assert "hog" not in pool.servers  # dropped: the launcher killed it at the cap

        # Positive control: the agent's next turn runs, warm, on a new server.
        again = await rig.turn("warm", "hog", "TOOL")
        assert again.result.status == "succeeded", again.result
        assert pool.counters.warm_turns == warm_turns + 2
        # …capped as its predecessor was (its cgroup was not lost to the old one's leftovers).
        assert _in_a_run_cgroup(pool.servers["hog"].server_pid) or not capped

        calm_again = await rig.turn("warm", "calm", "TOOL")
        assert calm_again.result.status == "succeeded", calm_again.result
        assert pool.servers["calm"].server_pid == calm_pid
