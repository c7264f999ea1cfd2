"""OAuth logins held by the gateway (issue 23): refreshed outside the sandbox, written back.

A scripted token endpoint on loopback; the user's auth.json in a temporary
HOME. The engine's copy of the login (`engine_view`) carries no token at all.
"""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from starlette.types import Receive, Scope, Send

from computer_service.gateway.access import GatewayAccess
from computer_service.gateway.engine_view import (
    FAR_FUTURE_MS,
    SECRET_MARKER,
    engine_auth,
    engine_provider,
    listing_auth,
)
from computer_service.gateway.logins import LoginFailed
from computer_service.gateway.oauth import OAuthLogin, TokenEndpoint, token_endpoints
from tests.computer_unit.test_gateway import serving

pytestmark = pytest.mark.anyio


class TokenEndpointApp:
    """Gives new tokens for the current refresh token (and rotates it); slow on purpose
    until `release` is set, so concurrent refreshes overlap."""

    def __init__(self, refresh: str) -> None:
        self.refresh = refresh
        self.grants: list[dict[str, Any]] = []
        self.release = anyio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = (await receive())["body"]
        grant = orjson.loads(body)
        self.grants.append(grant)
        await self.release.wait()
        n = len(self.grants)
        if grant.get("refresh_token") != self.refresh:
            status, answer = 400, {"error": "invalid_grant"}
        else:
            self.refresh = f"rotated-refresh-{n}"
            status = 200
            answer = {"access_token": f"fresh-access-{n}", "refresh_token": self.refresh}
            answer["expires_in"] = 3600
        data = orjson.dumps(answer)
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})


def write_auth(path: Path, logins: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(logins))


async def test_an_expired_token_is_refreshed_once_and_written_back(tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    expired = {"type": "oauth", "access": "old", "refresh": "real-refresh-1", "expires": 1}
    write_auth(auth, {"anthropic": expired, "other": {"type": "api", "key": "k"}})
    endpoint_app = TokenEndpointApp("real-refresh-1")
    async with serving(endpoint_app) as url, httpx.AsyncClient() as client:
        [endpoint] = [token_endpoints({"anthropic": f"{url}/token"})["anthropic"]]
        login = OAuthLogin(auth, "anthropic", endpoint, client)
        got: list[str | None] = []

        async def ask() -> None:
            got.append(await login.secret())

        async with anyio.create_task_group() as tasks:
            for _ in range(5):
                tasks.start_soon(ask)
            await anyio.sleep(0.2)  # let them all queue behind the first refresh
            endpoint_app.release.set()
        assert got == ["fresh-access-1"] * 5
        assert len(endpoint_app.grants) == 1 and login.refreshes == 1
        # The known endpoint's client id goes with the grant.
        assert endpoint_app.grants[0]["client_id"] == endpoint.client_id
        assert endpoint_app.grants[0]["refresh_token"] == "real-refresh-1"
        # Fresh now: no second refresh.
        assert await login.secret() == "fresh-access-1" and len(endpoint_app.grants) == 1
    written = json.loads(auth.read_text())
    assert written["other"] == {"type": "api", "key": "k"}
    assert written["anthropic"]["access"] == "fresh-access-1"
    assert written["anthropic"]["refresh"] == "rotated-refresh-1"
    assert written["anthropic"]["expires"] > time.time() * 1000
    assert stat.S_IMODE(auth.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["auth.json"]  # no temporary left


async def test_a_refused_refresh_says_to_log_in_again(tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    write_auth(auth, {"p": {"type": "oauth", "access": "a", "refresh": "wrong", "expires": 1}})
    endpoint_app = TokenEndpointApp("right")
    endpoint_app.release.set()
    async with serving(endpoint_app) as url, httpx.AsyncClient() as client:
        login = OAuthLogin(auth, "p", TokenEndpoint(f"{url}/token"), client)
        with pytest.raises(LoginFailed, match="opencode auth login"):
            await login.secret()
        no_endpoint = OAuthLogin(auth, "p", None, client)
        with pytest.raises(LoginFailed, match="cannot be refreshed"):
            await no_endpoint.secret()


def test_the_engine_gets_no_token_of_any_login() -> None:
    access = GatewayAccess(4242, "crew-gw-" + "0" * 32)
    oauth = {"type": "oauth", "access": "A-SECRET", "refresh": "R-SECRET", "expires": 5,
             "accountId": "acct-1"}  # fmt: skip
    view = json.loads(engine_auth(oauth, "openai", access.placeholder))
    assert view == {
        "openai": {
            "type": "oauth",
            "accountId": "acct-1",
            "access": access.placeholder,
            "refresh": SECRET_MARKER,
            "expires": FAR_FUTURE_MS,
        }
    }
    api = json.loads(engine_auth({"type": "api", "key": "K-SECRET"}, "x", access.placeholder))
    assert api == {"x": {"type": "api", "key": access.placeholder}}
    section = {
        "npm": "@ai-sdk/openai-compatible",
        "options": {
            "baseURL": "https://real.example/v1",
            "apiKey": "K-SECRET",
            "headers": {"Authorization": "Bearer H-SECRET"},
            "accessToken": "T-SECRET",
        },
        "models": {"m": {"name": "M", "limit": {"context": 1}}},
    }
    config = engine_provider(section, "x", access)
    text = json.dumps(config)
    assert "SECRET" not in text and "real.example" not in text
    assert config["x"]["options"]["baseURL"] == "http://127.0.0.1:4242/x"
    assert config["x"]["models"] == section["models"]
    listing = listing_auth(json.dumps({"a": oauth, "b": {"type": "api", "key": "K-SECRET"}}))
    assert "SECRET" not in listing and set(json.loads(listing)) == {"a", "b"}
