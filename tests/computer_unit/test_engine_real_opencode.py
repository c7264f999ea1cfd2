"""OpenCodeEngine with the REAL `opencode` binary in the real sandbox, against the scripted model.

Checks what only the real binary can: the derived `OPENCODE_CONFIG_CONTENT`
(instructions, permissions, model) plus the user's own `provider` section
(carried over from a JSONC config) and `OPENCODE_AUTH_CONTENT` make a working
turn; events carry tokens and cost; the next turn continues the session.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.computer_unit.engine_fixtures import sandboxed_rig
from tests.support.ci import required_in_ci

OPENCODE = (
    Path(__file__).resolve().parents[2]
    / "tools"
    / "opencode"
    / "node_modules"
    / ".bin"
    / "opencode"
)

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.timeout(180)]


async def test_real_opencode_turns_and_session(tmp_path: Path) -> None:
    if not OPENCODE.exists():
        required_in_ci("OpenCode (scripts/setup installs it into tools/opencode)")
    from crew_harness.scripted_model import ScriptedModel, opencode_provider

    with ScriptedModel() as model:
        # The user's own OpenCode config, JSONC with a comment: only `provider` is carried over.
        config = Path(os.environ["HOME"]) / ".config" / "opencode" / "opencode.jsonc"
        config.parent.mkdir(parents=True)
        provider = opencode_provider(model.base_url)
        provider["local"]["options"].pop("apiKey")  # the key comes from auth.json
        config.write_text(
            "// my config\n"
            + json.dumps({"provider": provider, "theme": "dark"}, indent=1)[:-1]
            + ",\n}"
        )
        async with sandboxed_rig(tmp_path, str(OPENCODE)) as rig:
            rig.user.auth_file.write_text(
                json.dumps({"local": {"type": "api", "key": "scripted-key"}})
            )
            first = await rig.turn("Say ok.")
            assert first.status == "succeeded", (first.failure, [e.data for e in rig.events])
            assert first.session_id and first.session_id.startswith("ses_")
            types = [e.type for e in rig.events]
            assert types[0] == "step_start" and types[-1] == "step_finish" and "text" in types
            assert first.usage.input_tokens > 0 and first.usage.cost > 0
            # The engine kept the session of the succeeded turn.
            plan = rig.plan()
            assert plan.session_id == first.session_id
            second = await rig.turn("Again.", plan=plan)
            assert second.status == "succeeded", second.failure
            assert second.session_id == first.session_id
        chats = model.requests()
        assert chats, "the model was never called"


async def test_a_key_in_the_computers_environment_reaches_the_model(tmp_path: Path) -> None:
    """`apiKey: "{env:MY_KEY}"`: resolved by the Computer, sent by the sandboxed OpenCode."""
    if not OPENCODE.exists():
        required_in_ci("OpenCode (scripts/setup installs it into tools/opencode)")
    from crew_harness.scripted_model import ScriptedModel, opencode_provider

    key = "sk-env-key-0123456789"
    with ScriptedModel(required_key=key) as model:
        config = Path(os.environ["HOME"]) / ".config" / "opencode" / "opencode.json"
        config.parent.mkdir(parents=True)
        config.write_text(
            json.dumps({"provider": opencode_provider(model.base_url, "{env:MY_KEY}")})
        )
        async with sandboxed_rig(tmp_path, str(OPENCODE)) as rig:
            # A login for another provider only: never this turn's key, never passed on.
            rig.user.auth_file.write_text(json.dumps({"other": {"type": "api", "key": "sk-x"}}))
            assert rig.engine is not None
            rig.engine.preparation.environ = {**os.environ, "MY_KEY": key}
            result = await rig.turn("Say ok.")
            assert result.status == "succeeded", (result.failure, [e.data for e in rig.events])
        chats = model.requests()
        assert chats and all(c.authorization == f"Bearer {key}" for c in chats)
