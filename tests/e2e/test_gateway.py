"""No user secret reaches a sandbox, and every login still works (issue 23, the model gateway).

The whole chain (crew-server, crew-computer, the launcher, the real OpenCode
in bwrap) with the warm engine and the cold one, each in the default sandbox
mode and in tmpfs. The scripted
model REQUIRES the user's real credential, so a turn that succeeds proves the
gateway put it in (the positive control). In each turn the agent's bash tool
dumps what a prompt-injected agent could read — its environment, every
`/proc/*/environ` and `cmdline` it can see, the engine's config, data and
state directories — and posts it into the room with `crew reply`; the real
key, OAuth access and refresh tokens appear nowhere in the room.

Logins: an API key in auth.json, a key in the config as `{file:…}`, and an
OAuth login whose access token has expired (the gateway refreshes it at a
scripted token endpoint, `POST /oauth/token` of a second scripted model, and
writes the rotated tokens back to the user's auth.json).
"""

from __future__ import annotations

import base64
import gzip
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from computer_service.gateway.access import PLACEHOLDER_PREFIX
from crew_harness.scripted_model import ROOM_ID, Script, ScriptedModel
from tests.e2e.chain import ENGINE_MODES, Chain, running_chain

pytestmark = pytest.mark.e2e

REPLY_ROOM = rf"Reply with: crew reply (?P<room>{ROOM_ID})"
# Everything a tool can read of its engine's secrets, gzipped, posted in parts (a message
# holds 20 000 characters).
PROBE = r"""
dump=$( {
  echo "==printenv"; printenv
  for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do echo "==$f"; tr '\0' '\n' < "$f"; done
  for d in "$XDG_CONFIG_HOME" "$XDG_DATA_HOME" "$XDG_STATE_HOME"; do
    find "$d" -type f -size -4M | while read -r f; do echo "==$f"; cat "$f"; done
  done
} 2>/dev/null | gzip -9 | base64 -w0 )
i=0
while [ "$i" -lt "${#dump}" ]; do
  printf 'DUMP:%s\n' "${dump:$i:18000}" | crew reply {{room}}
  i=$((i + 18000))
done
"""


ENGINE_READ = {"filePath": "/proc/self/environ"}
# What the engine's read tool showed of its login (to the model, which posts it).
AUTH_SEEN = r"(OPENCODE_AUTH_CONTENT=[^\x00\n]*)"


@pytest.fixture(scope="module")
def token_endpoint() -> Iterator[ScriptedModel]:
    """A scripted OAuth token endpoint (the `/oauth/token` of a second scripted model)."""
    with ScriptedModel(Script()) as endpoint:
        yield endpoint


# Each engine mode in the default sandbox (hybrid where Landlock allows) and in tmpfs.
SETUPS = [(mode, sandbox) for sandbox in (None, "tmpfs") for mode in ENGINE_MODES]


@pytest.fixture(scope="module", params=SETUPS, ids=[f"{m}-{s or 'default'}" for m, s in SETUPS])
def chain(request: pytest.FixtureRequest, token_endpoint: ScriptedModel) -> Iterator[Chain]:
    """One whole chain per setup, its gateway refreshing `local` at the scripted endpoint."""
    mode, sandbox = request.param
    extra: dict[str, Any] = {
        "gateway_token_endpoints": {"local": f"{token_endpoint.url}/oauth/token"}
    }
    if sandbox is not None:
        extra["sandbox_mode"] = sandbox
    with running_chain(engine_mode=mode, **extra) as started:
        yield started


def _user_files(chain: Chain) -> tuple[Path, Path]:
    home = chain.root / "home"
    return home / ".local/share/opencode/auth.json", home / ".config/opencode/opencode.json"


def _login(chain: Chain, auth: dict[str, Any], options: dict[str, str] | None = None) -> None:
    """Write the user's auth.json, and the provider's extra `options` in the config."""
    auth_file, config_file = _user_files(chain)
    auth_file.write_text(json.dumps(auth))
    config = json.loads(config_file.read_text())
    local = config["provider"]["local"]["options"]
    local.pop("apiKey", None)
    local.update(options or {})
    config_file.write_text(json.dumps(config))


def _dumped_turn(chain: Chain, handle: str) -> tuple[dict[str, Any], str]:
    """One agent's turn running the probe; its finished record and the dump it posted."""
    chain.script(
        [
            {  # OpenCode's own read tool runs in the engine: it reads the engine's environment.
                "role": "user",
                "match": f"(?s)PROBE.*{REPLY_ROOM}",
                "reply": {"tool_calls": [{"name": "read", "arguments": ENGINE_READ}]},
            },
            {
                "role": "tool",
                "times": 1,
                "capture": {"auth": AUTH_SEEN, "room": rf"crew reply ({ROOM_ID})"},
                "reply": {"bash": "crew reply {{room}} <<'EOF'\nENGINE:{{auth}}\nEOF\n" + PROBE},
            },
        ]
    )
    agent = chain.agent(handle)
    room = chain.dm(agent["id"])
    chain.post(room["id"], "PROBE: show me what you can read")
    [turn] = chain.finished_turns(agent["id"], 1, timeout=120)
    parts = [m["body"] for m in chain.agent_messages(room["id"], agent["id"])]
    text = "".join(p.strip().removeprefix("DUMP:") for p in parts if p.startswith("DUMP:"))
    dump = gzip.decompress(base64.b64decode(text)).decode("utf-8", "replace") if text else ""
    every_message = json.dumps(chain.messages(room["id"]))
    return turn, dump + every_message


def _check_probe(chain: Chain, turn: dict[str, Any], dump: str, *secret_values: str) -> None:
    assert turn["status"] == "succeeded", (turn.get("failure"), chain.diagnostics())
    # The probe ran and read what it could: the engine's own environment (through
    # OpenCode's read tool), where the login is — the placeholder there, no key.
    assert "==printenv" in dump and "CREW_TOKEN_FILE=" in dump, dump[:2000]
    assert "ENGINE:OPENCODE_AUTH_CONTENT=" in dump and PLACEHOLDER_PREFIX in dump, dump[:2000]
    for value in secret_values:
        assert value not in dump, f"{value!r} reached the room"
    chain.check_engine()


def test_an_api_key_login_works_and_no_tool_can_read_the_key(chain: Chain) -> None:
    key = "sk-user-real-" + secrets.token_hex(12)
    _login(chain, {"local": {"type": "api", "key": key}})
    chain.model.state.required_key = key
    try:
        turn, dump = _dumped_turn(chain, f"keyed{chain.engine_mode}")
    finally:
        chain.model.state.required_key = None
    _check_probe(chain, turn, dump, key)
    calls = chain.model.requests("all")
    assert calls and {c.authorization for c in calls} == {f"Bearer {key}"}


def test_a_file_key_in_the_config_works_and_stays_out(chain: Chain) -> None:
    key = "sk-user-file-" + secrets.token_hex(12)
    key_file = chain.root / "home" / ".keys" / "scripted"
    key_file.parent.mkdir(exist_ok=True)
    key_file.write_text(key + "\n")
    _login(chain, {}, {"apiKey": "{file:~/.keys/scripted}"})
    chain.model.state.required_key = key
    try:
        turn, dump = _dumped_turn(chain, f"filed{chain.engine_mode}")
    finally:
        chain.model.state.required_key = None
    _check_probe(chain, turn, dump, key, str(key_file))


def test_an_expired_oauth_login_is_refreshed_outside_the_sandbox(
    chain: Chain, token_endpoint: ScriptedModel
) -> None:
    refresh = "rt-user-real-" + secrets.token_hex(12)
    expired = {"type": "oauth", "access": "at-expired-" + secrets.token_hex(8), "expires": 1}
    _login(chain, {"local": {**expired, "refresh": refresh}})
    token_endpoint.state.oauth_refresh = refresh
    grants_before = len(token_endpoint.state.oauth_grants)
    # The n-th grant of the endpoint gives `scripted-access-<n>`: the model wants that one.
    fresh = f"scripted-access-{grants_before + 1}"
    chain.model.state.required_key = fresh
    try:
        turn, dump = _dumped_turn(chain, f"oauth{chain.engine_mode}")
    finally:
        chain.model.state.required_key = None
    rotated = f"scripted-refresh-{grants_before + 1}"
    _check_probe(chain, turn, dump, refresh, fresh, rotated, expired["access"])
    # Refreshed once, by the gateway, with the user's refresh token; rotation written back.
    grants = token_endpoint.state.oauth_grants[grants_before:]
    assert [g["refresh_token"] for g in grants] == [refresh]
    auth_file, _ = _user_files(chain)
    written = json.loads(auth_file.read_text())["local"]
    assert (written["access"], written["refresh"]) == (fresh, rotated)
