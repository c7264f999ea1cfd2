"""What the engine is given of the user's login: the same shape, no secret in it.

Pure. `engine_auth` is the turn provider's auth.json entry with every secret
replaced (an API key by the agent's placeholder; an OAuth login's access
token by the placeholder, its refresh token by a marker, its expiry far
ahead so OpenCode never refreshes it). `engine_provider` is the turn
provider's config section pointed at the agent's gateway port: `baseURL` the
gateway's, `apiKey` the placeholder, the `headers` left to the gateway (it
adds the real ones), any other credential-named value the placeholder.
`listing_auth` / `listing_providers` are the same for `opencode models`,
which needs to know which providers are logged in, never their keys.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from computer_service.gateway.access import GatewayAccess

SECRET_MARKER = "crew-gateway-holds-this"
FAR_FUTURE_MS = 4_102_444_800_000  # 2100-01-01: the engine's copy never looks expired
# What of an OAuth entry is not a credential (OpenCode's `accountId`, GitLab's instance).
OAUTH_PUBLIC_FIELDS = ("type", "accountId", "enterpriseUrl")
_SECRET_NAME = re.compile(r"key|token|secret|password|authorization", re.IGNORECASE)


def engine_auth(entry: Any, provider: str, placeholder: str) -> str:
    """`OPENCODE_AUTH_CONTENT` of a turn: the provider's entry, its secrets replaced."""
    if not isinstance(entry, dict):
        return "{}"
    return orjson.dumps({provider: _without_secrets(entry, placeholder)}).decode()


def _without_secrets(entry: dict[str, Any], placeholder: str) -> dict[str, Any]:
    if entry.get("type") == "oauth":
        kept = {k: entry[k] for k in OAUTH_PUBLIC_FIELDS if k in entry}
        return {**kept, "access": placeholder, "refresh": SECRET_MARKER, "expires": FAR_FUTURE_MS}
    if entry.get("type") == "api":
        return {"type": "api", "key": placeholder}
    # Any other kind (`wellknown`): every string but its type is a credential to the engine.
    return {
        k: (v if k == "type" or not isinstance(v, str) else placeholder) for k, v in entry.items()
    }


def engine_provider(section: Any, provider: str, access: GatewayAccess) -> dict[str, Any]:
    """The `provider` section of a turn's config: only the turn's provider, through the gateway."""
    view: dict[str, Any] = dict(section) if isinstance(section, dict) else {}
    options = view.get("options")
    options = dict(options) if isinstance(options, dict) else {}
    options.pop("headers", None)
    options = _masked(options, access.placeholder)
    options["baseURL"] = access.base_url(provider)
    options["apiKey"] = access.placeholder
    view = _masked({k: v for k, v in view.items() if k != "options"}, access.placeholder)
    view["options"] = options
    return {provider: view}


def _masked(value: Any, mask: str, name: str = "") -> Any:
    """`value` with every string under a credential-like name replaced by `mask`."""
    if isinstance(value, str):
        return mask if _SECRET_NAME.search(name) else value
    if isinstance(value, dict):
        return {k: _masked(v, mask, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, mask, name) for v in value]
    return value


def listing_auth(auth_content: str) -> str:
    """auth.json for `opencode models`: every login kept, none of their secrets."""
    try:
        obj = orjson.loads(auth_content)
    except orjson.JSONDecodeError:
        return "{}"
    if not isinstance(obj, dict):
        return "{}"
    return orjson.dumps(
        {p: _without_secrets(e, SECRET_MARKER) for p, e in obj.items() if isinstance(e, dict)}
    ).decode()


def listing_providers(providers: dict[str, Any] | None) -> dict[str, Any] | None:
    """The user's `provider` section for `opencode models`, every credential replaced."""
    if providers is None:
        return None
    masked: dict[str, Any] = _masked(providers, SECRET_MARKER)
    return masked
