"""Hostile input at crew-server's HTTP edges answers clearly, never 500 (issue 20, item 14):
a huge `Last-Event-ID`, malformed turn events, a `Host` that is not the server's, and
the Computers page's bootstrap line built from the configured URL, not the request."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from crew_server.api.hosts import allowed_hosts, host_of
from crew_server.api.stream import event_id
from crew_server.app import create_app
from crew_server.clock import Clock
from crew_server.store import Store
from crew_testkit.crew_server_proc import computer_connection, start_crew_server
from tests.server.world import World

PUBLIC = "https://crew.example.org:8443"
AT = "2026-10-05T09:00:00+00:00"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Server:
    """crew-server's app as crew-server makes it (a public URL, the Host allow-list)."""

    client: httpx.AsyncClient
    store: Store
    user_token: str

    async def sign_in(self) -> str:
        """Sign in through the form; the CSRF token of the session."""
        form = await self.client.get("/login", headers={"Authorization": ""})
        sign_in = _hidden(form.text, "sign_in")
        answer = await self.client.post(
            "/login", data={"sign_in": sign_in, "token": self.user_token, "next": "/rooms"}
        )
        assert answer.status_code == 303, answer.text
        return _hidden((await self.client.get("/rooms")).text, "csrf")


def _hidden(page: str, name: str) -> str:
    found = re.search(rf'name="{name}" value="([^"]*)"', page)
    assert found, f"no hidden {name} field in the page"
    return found.group(1)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    clock = Clock(datetime(2026, 10, 5, 9, 0, tzinfo=UTC))
    store = Store(":memory:", clock)
    token = store.ensure_user_token()
    assert token is not None
    app = create_app(
        store,
        clock,
        public_url=PUBLIC,
        allowed_hosts=allowed_hosts("127.0.0.1", PUBLIC),
    )
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://127.0.0.1:8765",
            headers={"Authorization": f"Bearer {token}"},
        ) as client:
            yield Server(client, store, token)
    store.close()


# --------------------------------------------------------------- Last-Event-ID


@pytest.mark.anyio
async def test_a_huge_or_garbage_last_event_id_is_a_clear_422_not_a_500(world: World) -> None:
    box = await world.computer()
    for last_id in ("9" * 5000, "9" * 20, str(2**63), "1" * 4301, "١٢"):
        headers = [(k.encode(), v.encode()) for k, v in box.headers.items()]
        stream = await world.client.get(
            "/computer/events", headers=[*headers, (b"Last-Event-ID", last_id.encode())]
        )
        assert stream.status_code == 422, (last_id[:30], stream.text[:300])
        message = stream.json()["error"]["message"]
        assert "Last-Event-ID" in message and "reconnect without it" in message
        assert len(message) < 300  # the 5,000 digits are not echoed back
    # The largest id the server could send still counts (in-process streams never end: pure).
    assert event_id(f" {2**63 - 1} ") == 2**63 - 1 and event_id("") is None


# --------------------------------------------------------------- malformed turn events


def _event(kind: str, data: Any) -> dict[str, Any]:
    return {"type": kind, "at": AT, "data": data}


MALFORMED = [
    _event("text", {}),
    _event("reasoning", {"text": 5}),
    _event("tool_use", {"tool": "bash"}),
    _event("step_finish", {"reason": "stop", "tokens": {"input": "many"}, "cost": 0.1}),
    _event("step_finish", {"reason": "stop", "tokens": {}, "cost": "lots"}),
    _event("error", {"name": ["x"], "message": "m"}),
]
GOOD = _event("text", {"text": "hello from the agent"})


@pytest.mark.anyio
async def test_malformed_turn_events_show_as_malformed_and_the_turn_page_renders(
    server: Server,
) -> None:
    client, store = server.client, server.store
    computer = (await client.post("/api/computers", json={"name": "box"})).json()
    headers = computer_connection_async_headers(
        await client.post(
            "/computer/connect",
            json={"hostname": "h", "platform": "linux", "version": "1", "capacity": 2},
            headers={"Authorization": f"Bearer {computer['token']}"},
        ),
        computer["token"],
    )
    agent = (
        await client.post(
            "/api/agents",
            json={
                "handle": "ada",
                "name": "Ada",
                "model": "local/scripted",
                "computer_id": computer["computer_id"],
            },
        )
    ).json()
    turn = (
        await client.post(
            f"/computer/agents/{agent['id']}/turns",
            json={"rooms": [], "input": "go", "engine": "opencode", "model": "local/scripted"},
            headers=headers,
        )
    ).json()
    events = [GOOD, *MALFORMED]
    sent = await client.post(
        f"/computer/turns/{turn['turn_id']}/events",
        json={"fence": turn["fence"], "first_index": 0, "events": events},
        headers=headers,
    )
    assert sent.status_code == 204, sent.text
    # A row no API call can write (a damaged database, a hand edit): data that is not JSON.
    with store._database.write() as tx:
        tx.execute(
            "INSERT INTO turn_events (turn_id, idx, type, at, data) VALUES (?, ?, ?, ?, ?)",
            (turn["turn_id"], len(events), "text", AT, "{not json"),
        )
    api = await client.get(f"/api/turns/{turn['turn_id']}")
    assert api.status_code == 200, api.text
    shown = api.json()["events"]
    assert len(shown) == len(events) + 1
    assert "not JSON" in shown[-1]["malformed"] and shown[-1]["data"] == {"stored": "{not json"}
    assert all("malformed" not in e for e in shown[:-1])  # the API gives the data as sent

    await server.sign_in()
    page = await client.get(f"/turns/{turn['turn_id']}", headers={"Authorization": ""})
    assert page.status_code == 200, page.text[-2000:]
    assert "hello from the agent" in page.text  # the good event as usual
    assert page.text.count("Malformed ") == len(MALFORMED) + 1
    assert "it has no &#39;text&#39;" in page.text
    assert "its data is not JSON" in page.text


def computer_connection_async_headers(answer: httpx.Response, token: str) -> dict[str, str]:
    assert answer.status_code == 200, answer.text
    return {"Authorization": f"Bearer {token}", "Crew-Epoch": str(answer.json()["epoch"])}


# --------------------------------------------------------------- Host allow-list


def test_host_names_are_parsed_and_the_defaults_are_the_servers_own() -> None:
    assert host_of("127.0.0.1:8765") == "127.0.0.1"
    assert host_of("[::1]:8765") == "::1"
    assert host_of("Crew.Example.ORG.") == "crew.example.org"
    assert host_of("evil.example:80:80") is None and host_of("[::1") is None
    assert allowed_hosts("0.0.0.0", "http://0.0.0.0:8765") == {"localhost", "127.0.0.1", "::1"}
    assert allowed_hosts("192.0.2.7", PUBLIC, ["proxy.lan"]) == {
        "192.0.2.7",
        "localhost",
        "127.0.0.1",
        "::1",
        "crew.example.org",
        "proxy.lan",
    }


@pytest.mark.anyio
async def test_the_bootstrap_line_uses_the_public_url_and_a_foreign_host_gets_400(
    server: Server,
) -> None:
    client = server.client
    csrf = await server.sign_in()
    made = await client.post(
        "/computers", data={"csrf": csrf, "name": "laptop"}, headers={"Authorization": ""}
    )
    assert made.status_code == 201, made.text
    line = re.search(r'id="bootstrap-line"[^>]*>([^<]*)<', made.text)
    assert line and f'"server_url":"{PUBLIC}"' in line.group(1), made.text
    assert "127.0.0.1:8765" not in line.group(1)
    # The public URL's host is one of the server's names; a rebinding name is not.
    assert (await client.get("/health", headers={"Host": "crew.example.org:8443"})).is_success
    for host in ("attacker.example", "attacker.example:8765", "127.0.0.1.attacker.example"):
        refused = await client.get("/computers", headers={"Host": host})
        assert refused.status_code == 400, host
        error = refused.json()["error"]
        assert error["code"] == "invalid_host" and "--allowed-host" in error["message"]


def test_crew_server_refuses_a_foreign_host_and_accepts_its_own(tmp_path: Path) -> None:
    extra = ["--public-url", PUBLIC, "--allowed-host", "crew.lan"]
    with start_crew_server(tmp_path, args=extra) as server:
        url = server.url
        for host, status in (
            ("attacker.example", 400),
            ("localhost", 200),
            ("crew.lan:9", 200),
            ("crew.example.org", 200),
        ):
            answer = httpx.get(f"{url}/health", headers={"Host": host}, timeout=10)
            assert answer.status_code == status, (host, answer.text)
        # The Computer's own calls go on (its server_url names 127.0.0.1).
        computer = server.create_computer("box")
        computer_connection(server.client(), computer["token"])


def test_help_names_the_new_options() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "crew_server", "--help"], capture_output=True, text=True, timeout=30
    )
    for option in ("--public-url", "--allowed-host", "--max-connections", "--header-timeout"):
        assert option in done.stdout
