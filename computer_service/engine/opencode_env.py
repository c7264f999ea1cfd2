"""What an OpenCode process is given: its whole environment and its derived config.

computer.md §3. Pure builders: `engine_env` (nothing inherited),
`opencode_config` (`OPENCODE_CONFIG_CONTENT` for a turn) and
`model_listing_env` (the user's logins and providers for `opencode models`,
every secret in them replaced: the listing needs to know who is logged in,
never with what). Neither holds a credential: a turn's calls go through the
model gateway (`computer_service/gateway/`), which holds them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from computer_service.engine.user_opencode import (
    NotLoggedIn,
    UserOpenCode,
    read_auth,
    read_user_providers,
)
from computer_service.gateway.engine_view import listing_auth, listing_providers
from crew_common.layout import AgentPaths

log = logging.getLogger(__name__)


def _config(providers: dict[str, Any] | None, **settings: Any) -> str:
    config: dict[str, Any] = {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        # Nothing OpenCode would start by itself from what a tool wrote (issue 20): no
        # snapshot git (`git add` would run a filter the agent configured), no LSP
        # servers, no formatters (both found or installed where the agent writes).
        "snapshot": False,
        "lsp": False,
        "formatter": False,
        **settings,
    }
    if providers:
        config["provider"] = providers
    return orjson.dumps(config).decode()


def opencode_config(
    agents_md: Path,
    model: str,
    providers: dict[str, Any] | None,
    permission: dict[str, Any] | None = None,
    capabilities: Mapping[str, Any] | None = None,
) -> str:
    """`OPENCODE_CONFIG_CONTENT`: instructions, the agent's permissions, this turn's model,
    providers, and the agent's own MCP servers and skills (`capabilities`: the `mcp` and
    `skills` settings of `engine.capabilities.opencode_settings`).

    `permission` is the agent's policy (`PermissionPolicy.to_opencode`); None: everything
    allowed (the sandbox is the boundary). A refused call never ends the turn: OpenCode
    ends its loop at a plain `reject` unless `continue_loop_on_deny` (its 1.18.33 source),
    and the agent is to go on with the refusal.
    """
    return _config(
        providers,
        instructions=[str(agents_md)],
        permission=permission if permission is not None else {"*": "allow"},
        experimental={"continue_loop_on_deny": True},
        model=model,
        small_model=model,
        **(capabilities or {}),
    )


def model_listing_env(user: UserOpenCode, environ: Mapping[str, str]) -> dict[str, str]:
    """The OpenCode variables of `opencode models`, so it lists what a turn can use.

    The user's logins and `provider` section with every credential replaced
    by a marker (`listing_auth`, `listing_providers`: `opencode models` only
    needs to know which providers are logged in), no instructions, no model,
    no project config, no catalog download. Not logged in: no
    `OPENCODE_AUTH_CONTENT` (OpenCode then lists the providers the config and
    the environment enable).
    """
    providers = listing_providers(read_user_providers(user.config_files, environ))
    env = {
        "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_CONFIG_CONTENT": _config(providers),
    }
    try:
        env["OPENCODE_AUTH_CONTENT"] = listing_auth(read_auth(user.auth_file))
    except NotLoggedIn as exc:
        # No auth.json is a normal setup (keys in the config, OpenCode's free models):
        # only one that cannot be used is worth a line.
        if user.auth_file.exists():
            log.warning("your OpenCode login is not used: %s", exc)
    return env


def engine_env(
    paths: AgentPaths,
    *,
    bin_dir: Path,
    server_url: str,
    auth_content: str,
    config_content: str,
    base_path: str,
    lang: str,
) -> dict[str, str]:
    """The engine's whole environment (computer.md §3): nothing else, nothing inherited."""
    return {
        "PATH": f"{bin_dir}:{base_path}" if base_path else str(bin_dir),
        "LANG": lang,
        "TMPDIR": str(paths.tmp_dir),
        "TMPPREFIX": str(paths.tmp_dir / "zsh"),
        "HOME": str(paths.agent_dir),
        "XDG_DATA_HOME": str(paths.data_dir),
        "XDG_CONFIG_HOME": str(paths.config_dir),
        "XDG_CACHE_HOME": str(paths.cache_dir),
        "XDG_STATE_HOME": str(paths.state_dir),
        "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_AUTH_CONTENT": auth_content,
        "OPENCODE_CONFIG_CONTENT": config_content,
        "PWD": str(paths.work_dir),
        "CREW_SERVER_URL": server_url,
        "CREW_TOKEN_FILE": str(paths.token_file),
        "CREW_TURN_FILE": str(paths.turn_file),
    }
