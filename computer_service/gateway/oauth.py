"""An OAuth login held by the gateway: refreshed here, outside every sandbox.

The engine gets an access token that is the placeholder and a refresh token
that is a marker (`engine_view`), with an expiry far ahead, so OpenCode never
tries to refresh. The real tokens stay in the user's auth.json: when the
access token has expired (or will within `REFRESH_MARGIN_S`), `OAuthLogin`
asks the provider's token endpoint for new ones, writes the rotated tokens
back to auth.json atomically (a temporary file renamed over it, 0600, as
OpenCode writes it), and lets one refresh run at a time: the others wait for
it and use its result.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson

from computer_service import safe_fs
from computer_service.gateway.logins import LoginFailed
from computer_service.safe_fs import UnsafePath

log = logging.getLogger(__name__)

REFRESH_MARGIN_S = 120.0
AUTH_LIMIT = 64 * 1024


@dataclass(frozen=True)
class TokenEndpoint:
    """Where and how a provider's refresh grant is asked for."""

    url: str
    client_id: str | None = None
    form: bool = False  # application/x-www-form-urlencoded rather than JSON


# The endpoints and client ids OpenCode's own login flows use.
TOKEN_ENDPOINTS = {
    "anthropic": TokenEndpoint(
        "https://console.anthropic.com/v1/oauth/token", "9d1c250a-e61b-44d9-88ed-5944d1962f5e"
    ),
    "openai": TokenEndpoint(
        "https://auth.openai.com/oauth/token", "app_EMoamEEZ73f0CkXaXp7hrann", form=True
    ),
}


# Providers whose API takes an OAuth access token differently from a key: Anthropic wants
# `Authorization: Bearer` (not `x-api-key`) and this beta flag, as OpenCode's former
# Anthropic login plugin sent them (OpenCode 1.18.33 bundles none for Anthropic).
BEARER_BETAS = {"anthropic": "oauth-2025-04-20"}


def token_endpoints(overrides: Mapping[str, str]) -> dict[str, TokenEndpoint]:
    """The table with the bootstrap's `gateway_token_endpoints` (provider → URL) over it."""
    table = dict(TOKEN_ENDPOINTS)
    for provider, url in overrides.items():
        known = table.get(provider)
        table[provider] = (
            TokenEndpoint(url, known.client_id, known.form) if known else TokenEndpoint(url)
        )
    return table


class OAuthLogin:
    """One provider's OAuth tokens in one auth.json (module doc)."""

    def __init__(
        self,
        auth_file: Path,
        provider: str,
        endpoint: TokenEndpoint | None,
        client: httpx.AsyncClient,
        margin_s: float = REFRESH_MARGIN_S,
    ) -> None:
        self.auth_file = auth_file
        self.provider = provider
        self.endpoint = endpoint
        self._client = client
        self._margin_s = margin_s
        self._lock = anyio.Lock()
        self.refreshes = 0

    async def secret(self) -> str | None:
        entry = await anyio.to_thread.run_sync(self._entry)
        if self._fresh(entry):
            return str(entry["access"])
        async with self._lock:
            # Another request (or OpenCode outside crew) may have refreshed meanwhile.
            entry = await anyio.to_thread.run_sync(self._entry)
            if self._fresh(entry):
                return str(entry["access"])
            return await self._refresh(entry)

    def _fresh(self, entry: dict[str, Any]) -> bool:
        expires = entry.get("expires")
        access = entry.get("access")
        if not isinstance(access, str) or not access:
            return False
        # OpenCode's `expires` is in milliseconds since the epoch.
        return isinstance(expires, int | float) and expires / 1000 > time.time() + self._margin_s

    def _entry(self) -> dict[str, Any]:
        try:
            data = safe_fs.read_trusted_file(self.auth_file, AUTH_LIMIT)
            obj = orjson.loads(data) if data is not None else None
        except (UnsafePath, orjson.JSONDecodeError) as exc:
            raise LoginFailed(f"your OpenCode login cannot be read: {exc}") from exc
        entry = obj.get(self.provider) if isinstance(obj, dict) else None
        if not isinstance(entry, dict) or entry.get("type") != "oauth":
            raise LoginFailed(f"your OpenCode login for {self.provider} is no longer an OAuth one")
        return entry

    async def _refresh(self, entry: dict[str, Any]) -> str:
        refresh = entry.get("refresh")
        if self.endpoint is None or not isinstance(refresh, str) or not refresh:
            raise LoginFailed(
                f"your OpenCode login for {self.provider} has expired and cannot be refreshed "
                "here: log in again with `opencode auth login`"
            )
        grant: dict[str, str] = {"grant_type": "refresh_token", "refresh_token": refresh}
        if self.endpoint.client_id:
            grant["client_id"] = self.endpoint.client_id
        try:
            if self.endpoint.form:
                answer = await self._client.post(self.endpoint.url, data=grant)
            else:
                answer = await self._client.post(self.endpoint.url, json=grant)
            tokens = answer.json() if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            raise LoginFailed(f"refreshing your {self.provider} login failed: {exc}") from exc
        if not isinstance(tokens, dict) or not isinstance(tokens.get("access_token"), str):
            raise LoginFailed(
                f"refreshing your {self.provider} login was refused ({answer.status_code}): "
                "log in again with `opencode auth login`"
            )
        rotated = {
            **entry,
            "access": tokens["access_token"],
            "refresh": tokens.get("refresh_token") or refresh,
            "expires": int((time.time() + float(tokens.get("expires_in") or 3600)) * 1000),
        }
        await anyio.to_thread.run_sync(self._write_back, rotated)
        self.refreshes += 1
        log.info("refreshed your %s login (outside every sandbox)", self.provider)
        return str(rotated["access"])

    def _write_back(self, entry: dict[str, Any]) -> None:
        """Put `entry` into auth.json, keeping the other logins; atomic, 0600."""
        data = safe_fs.read_trusted_file(self.auth_file, AUTH_LIMIT)
        obj = orjson.loads(data) if data is not None else {}
        obj = obj if isinstance(obj, dict) else {}
        obj[self.provider] = entry
        fd, tmp = tempfile.mkstemp(dir=self.auth_file.parent, prefix=".auth.", suffix=".json")
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o600)
                f.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.auth_file)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
