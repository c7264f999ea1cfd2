"""An agent's gateway credential works on its own port only (issue 23), warm and cold.

Two agents on one Computer (the real launcher, bwrap and OpenCode, `EngineRig`).
Agent b's tool learns agent a's placeholder (as a leak through a shared room
would give it) and tries it on b's own gateway port: refused (401). a's port
is not forwarded into b's sandbox at all. b's own placeholder works on b's
port (the positive control: the scripted model requires the real key).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from crew_harness.scripted_model import Script, ScriptedModel
from crew_testkit.engine_rig import EngineRig
from tests.e2e.opencode_by_hand import OPENCODE
from tests.support.ci import required_in_ci

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

CALL = """
import json, sys, urllib.request
body = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "x"}]})
for port, key in ((%(b_port)d, "%(a_key)s"), (%(b_port)d, "%(b_key)s"), (%(a_port)d, "%(a_key)s")):
    request = urllib.request.Request(
        "http://127.0.0.1:%%d/local/chat/completions" %% port, body.encode(),
        {"Content-Type": "application/json", "Authorization": "Bearer " + key})
    try:
        print(port, urllib.request.urlopen(request, timeout=10).status)
    except urllib.error.HTTPError as exc:
        print(port, exc.code, exc.read().decode()[:200])
    except OSError as exc:
        print(port, "unreachable", type(exc).__name__)
"""


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    if not OPENCODE.exists():
        required_in_ci("OpenCode (scripts/setup installs it into tools/opencode)")
    with ScriptedModel(Script(), required_key="scripted-key") as started:
        yield started


@pytest.mark.parametrize("kind", ["warm", "cold"])
async def test_a_placeholder_is_refused_on_another_agents_port(
    model: ScriptedModel, kind: str
) -> None:
    async with EngineRig(model, OPENCODE) as rig:
        a, b = f"{kind}a", f"{kind}b"
        for agent in (a, b):
            rig.agent(agent)
        first = await rig.turn(kind, a, "hello")  # a's listener opens with its turn
        assert first.result.status == "succeeded", first.result.failure
        gateway = rig.engine(kind).gateway
        assert gateway is not None
        a_access, b_access = await gateway.access_for(a), await gateway.access_for(b)
        call = CALL % {
            "a_port": a_access.port,
            "b_port": b_access.port,
            "a_key": a_access.placeholder,
            "b_key": b_access.placeholder,
        }
        model.set_script(
            Script.parse(
                {
                    "rules": [
                        {
                            "role": "user",
                            "match": "CROSS",
                            "reply": {"bash": f"python3 - <<'EOF'\n{call}\nEOF"},
                        }
                    ]
                }
            )
        )
        refused_before = gateway.snapshot(b).refused
        record = await rig.turn(kind, b, "CROSS")
        assert record.result.status == "succeeded", record.result.failure
        [tool] = [e for e in record.events if e.type == "tool_use"]
        lines = str(tool.data.get("output")).splitlines()
        assert lines[0].startswith(f"{b_access.port} 401 ") and "another agent" in lines[0], lines
        assert lines[1] == f"{b_access.port} 200", lines  # its own credential, its own port
        assert lines[2].startswith(f"{a_access.port} unreachable"), lines
        assert gateway.snapshot(b).refused == refused_before + 1
        # Every call the model got carried the real key, never a placeholder.
        assert {r.authorization for r in model.requests("all")} == {"Bearer scripted-key"}
