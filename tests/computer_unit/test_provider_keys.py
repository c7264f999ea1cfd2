"""Provider keys as OpenCode reads them, resolved outside the sandbox; one login per turn (issues 11, 12).

- `{env:VAR}` and `{file:path}` in the user's `provider` section are resolved
  by the Computer into the config the sandboxed engine gets (the engine has
  none of the Computer's environment and cannot read the user's files);
  the variable itself never reaches the engine.
- The engine gets only the auth.json entry of the turn's model's provider.
- No login and no configured provider: `not_logged_in`, saying how to pass
  a key from the environment.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from computer_service.engine.base import FailureClass
from computer_service.engine.user_opencode import (
    auth_for_provider,
    config_secrets,
    resolve_references,
)
from computer_service.gateway.access import PLACEHOLDER_PREFIX
from tests.computer_unit.engine_fixtures import make_rig, standin_launcher

pytestmark = pytest.mark.anyio

ENV_KEY = "sk-from-the-environment-123"
FILE_KEY = "sk-from-a-key-file-456"


def test_references_resolve_as_opencode_does(tmp_path: Path) -> None:
    home, config_dir = tmp_path / "home", tmp_path / "home" / ".config" / "opencode"
    config_dir.mkdir(parents=True)
    (config_dir / "key.txt").write_text(f"  {FILE_KEY}\n")
    (home / ".keys").mkdir()
    (home / ".keys" / "other").write_text("other-key\n")
    providers = {
        "a": {"options": {"apiKey": "{env:MY_KEY}", "baseURL": "http://{env:HOST}:1/v1"}},
        "b": {
            "options": {"apiKey": "{file:key.txt}", "headers": {"X-Key": "{file:~/.keys/other}"}}
        },
        "c": {"options": {"apiKey": "{env:UNSET}", "list": ["{env:MY_KEY}", 3]}},
        "d": {"options": {"apiKey": "{file:missing.txt}"}},
    }
    environ = {"MY_KEY": ENV_KEY, "HOST": "127.0.0.1", "HOME": str(home)}
    assert resolve_references(providers, environ, config_dir) == {
        "a": {"options": {"apiKey": ENV_KEY, "baseURL": "http://127.0.0.1:1/v1"}},
        "b": {"options": {"apiKey": FILE_KEY, "headers": {"X-Key": "other-key"}}},
        "c": {"options": {"apiKey": "", "list": [ENV_KEY, 3]}},
        "d": {"options": {"apiKey": ""}},
    }


def test_only_credentials_of_the_config_are_redacted() -> None:
    providers = {"a": {"options": {"apiKey": ENV_KEY, "baseURL": "http://127.0.0.1:1/v1"}}}
    assert config_secrets(providers) == [ENV_KEY]


def test_auth_for_provider_keeps_one_entry() -> None:
    auth = json.dumps(
        {"local": {"type": "api", "key": "k1"}, "other": {"type": "api", "key": "k2"}}
    )
    assert json.loads(auth_for_provider(auth, "local")) == {"local": {"type": "api", "key": "k1"}}
    assert auth_for_provider(auth, "absent") == "{}"
    assert auth_for_provider("not json", "local") == "{}"


def _write_config(rig_home: Path, providers: dict[str, object]) -> None:
    config = rig_home / ".config" / "opencode" / "opencode.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps({"provider": providers}))


async def test_a_turn_gets_only_its_providers_login(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, write_auth=False)
    logins = {
        "local": {"type": "api", "key": "sk-local-login-111"},
        "other": {"type": "oauth", "access": "sk-other-login-222", "refresh": "r"},
    }
    rig.user.auth_file.parent.mkdir(parents=True)
    rig.user.auth_file.write_text(json.dumps(logins))
    async with standin_launcher() as (client, _):
        rig.use(client)
        result = await rig.turn("hi")
    assert result.status == "succeeded", result.failure
    (dump,) = rig.dumps()
    env = dump["env"]
    # The turn's provider only, and its key is the agent's gateway placeholder (issue 23).
    auth = json.loads(env["OPENCODE_AUTH_CONTENT"])
    assert list(auth) == ["local"] and auth["local"]["key"].startswith(PLACEHOLDER_PREFIX)
    assert "sk-other-login-222" not in json.dumps(env)
    assert "sk-local-login-111" not in json.dumps(env)


async def test_env_and_file_keys_reach_the_engine_config_not_the_variable(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, write_auth=False)  # no auth.json at all: the config has the key
    home = rig.user.auth_file.parents[3]
    _write_config(home, {"local": {"options": {"apiKey": "{env:MY_KEY}"}}})
    async with standin_launcher() as (client, _):
        rig.use(client, environ={"MY_KEY": ENV_KEY, "HOME": str(home)})
        result = await rig.turn("hi")
    assert result.status == "succeeded", result.failure
    (dump,) = rig.dumps()
    env = dump["env"]
    config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    # Resolved by the Computer and kept by its gateway: the engine has the placeholder.
    options = config["provider"]["local"]["options"]
    assert options["apiKey"].startswith(PLACEHOLDER_PREFIX)
    assert options["baseURL"].startswith("http://127.0.0.1:")
    assert ENV_KEY not in json.dumps(env)
    assert "MY_KEY" not in env and json.loads(env["OPENCODE_AUTH_CONTENT"]) == {}


async def test_no_login_and_no_configured_provider_says_how_to_pass_a_key(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, write_auth=False)
    home = rig.user.auth_file.parents[3]
    _write_config(home, {"elsewhere": {"options": {"apiKey": "{env:MY_KEY}"}}})
    async with standin_launcher() as (client, state):
        rig.use(client)
        result = await rig.turn("hi")
    assert result.failure is not None and result.failure.cls is FailureClass.NOT_LOGGED_IN
    reason = result.failure.reason
    assert "{env:" in reason and "opencode auth login" in reason and "environment" in reason
    assert state.requests == []


async def test_opencode_zen_runs_without_a_login_as_opencode_does(tmp_path: Path) -> None:
    """OpenCode 1.18 runs `opencode/*` free models with no auth.json (the key "public"):
    the Computer leaves that to OpenCode instead of refusing it as `not_logged_in`."""
    rig = make_rig(tmp_path, write_auth=False)
    async with standin_launcher() as (client, _):
        rig.use(client)
        result = await rig.turn("hi", model="opencode/big-pickle")
    assert result.status == "succeeded", result.failure
    (dump,) = rig.dumps()
    assert json.loads(dump["env"]["OPENCODE_AUTH_CONTENT"]) == {}
