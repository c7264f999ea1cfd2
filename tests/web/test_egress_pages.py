"""The web app's side of issue 23: an agent's egress policy on its page and in the agent
form (a rule the server cannot read comes back with the reason), denied connections
in the turn view as one line each, and the model gateway's usage in its summary."""

from __future__ import annotations

import html
from typing import Any

import anyio
import orjson
import pytest

from crew_common.egress import MODES
from crew_harness.waiting import wait_until_async
from crew_server.web.turn_events import shown_event
from crew_server.web.views import EGRESS_TEXTS
from tests.web.site import Site, open_browser_stream, subscribe, updates_in

pytestmark = pytest.mark.anyio

AT = "2026-10-05T09:00:00+00:00"


def form(csrf: str, **fields: str) -> dict[str, str]:
    return {"csrf": csrf, "name": "Dora", "model": "local/scripted", **fields}


async def test_every_mode_has_its_words_in_the_form() -> None:
    assert set(EGRESS_TEXTS) == set(MODES)


async def test_the_agent_page_shows_the_policy_and_the_form_changes_it(site: Site) -> None:
    csrf = await site.sign_in()
    dora = await site.agent("dora")
    page = (await site.browser.get(f"/agents/{dora['id']}")).text
    assert "Network: <strong>public</strong>" in page
    assert '<option value="public" selected>' in page

    rules = "github.com:443\r\n\r\n  *.pypi.org  \r\n203.0.113.0/24"
    saved = await site.browser.post(
        f"/agents/{dora['id']}", data=form(csrf, egress_mode="allow", egress_allow=rules)
    )
    assert saved.status_code == 303 and saved.headers["location"] == f"/agents/{dora['id']}"
    policy = {"mode": "allow", "allow": ["github.com:443", "*.pypi.org", "203.0.113.0/24"]}
    assert site.store.get_agent(dora["id"])["egress"] == policy
    page = html.unescape((await site.browser.get(f"/agents/{dora['id']}")).text)
    assert "Network: <strong>allow github.com:443, *.pypi.org, 203.0.113.0/24</strong>" in page
    assert '<option value="allow" selected>' in page
    assert ">github.com:443\n*.pypi.org\n203.0.113.0/24</textarea>" in page


async def test_a_rule_it_cannot_read_comes_back_with_the_reason(site: Site) -> None:
    csrf = await site.sign_in()
    dora = await site.agent("dora")
    refused = await site.browser.post(
        f"/agents/{dora['id']}",
        data=form(csrf, egress_mode="allow", egress_allow="github.com:99999", back="/x"),
    )
    assert refused.status_code == 303
    page = html.unescape((await site.browser.get(f"/agents/{dora['id']}")).text)
    assert "allow rule 'github.com:99999': the port is a number from 1 to 65535" in page
    assert site.store.get_agent(dora["id"])["egress"]["mode"] == "public"

    # rules with another mode are refused too, rather than dropped unseen
    await site.browser.post(
        f"/agents/{dora['id']}", data=form(csrf, egress_mode="none", egress_allow="github.com")
    )
    page = html.unescape((await site.browser.get(f"/agents/{dora['id']}")).text)
    assert "egress mode 'none' takes no allow rules" in page
    assert site.store.get_agent(dora["id"])["egress"]["mode"] == "public"


async def test_a_new_agent_takes_its_policy_from_the_form(site: Site) -> None:
    csrf = await site.sign_in()
    made = await site.browser.post(
        "/agents", data=form(csrf, handle="finn", egress_mode="none", egress_allow="")
    )
    assert made.status_code == 303
    [finn] = site.store.list_agents()
    assert finn["egress"] == {"mode": "none", "allow": []}
    page = (await site.browser.get("/agents")).text
    assert '<option value="public" selected>' in page  # the new-agent form's default


def a_turn(site: Site, events: list[dict[str, Any]], **finish: Any) -> str:
    """A turn of a new agent with `events`, finished with `finish` unless it is empty."""
    computer_id, _ = site.store.create_computer("box")
    site.store.connect(computer_id, "h", "linux", "1", 1)
    agent = site.store.create_agent("ada", "Ada", "", "local/scripted", "opencode", computer_id)
    turn = site.store.register_turn(computer_id, agent["id"], [], "go", "opencode", "m/x", None)
    stored = [
        {"type": e["type"], "at": AT, "data_json": orjson.dumps(e["data"]).decode()} for e in events
    ]
    site.store.add_events(computer_id, turn["turn_id"], turn["fence"], 0, stored)
    if finish:
        site.store.finish_turn(computer_id, turn["turn_id"], turn["fence"], **finish)
    return str(turn["turn_id"])


def denied(address: str, port: int, name: str | None, count: int) -> dict[str, Any]:
    data = {"address": address, "port": port, "protocol": "tcp", "name": name, "count": count}
    return {"type": "egress_denied", "data": data}


async def test_denied_connections_are_one_line_each_in_the_turn_view(site: Site) -> None:
    await site.sign_in()
    turn_id = a_turn(
        site,
        [
            denied("10.99.0.1", 80, None, 3),
            denied("169.254.169.254", 80, "metadata.internal", 1),
            denied("fc00::1", 443, None, 2),
        ],
    )
    page = html.unescape((await site.browser.get(f"/turns/{turn_id}")).text)
    lines = [" ".join(line.split()) for line in page.splitlines() if 'class="denied"' in line]
    shown = [line.split("<strong>refused</strong> ")[1].split(" <span")[0] for line in lines]
    assert shown == [
        "10.99.0.1:80 (tcp) ×3",
        "metadata.internal 169.254.169.254:80 (tcp)",
        "[fc00::1]:443 (tcp) ×2",
    ]


async def test_a_denial_without_its_fields_shows_as_malformed() -> None:
    event = {"index": 0, "type": "egress_denied", "at": AT, "data": {"address": "10.0.0.1"}}
    assert shown_event(event)["type"] == "malformed"
    count_as_text = {**denied("10.0.0.1", 80, None, 1)["data"], "count": "3"}
    assert shown_event({**event, "data": count_as_text})["problem"] == "its 'count' is str"


async def test_the_turn_summary_shows_the_gateway_usage(site: Site) -> None:
    await site.sign_in()
    gateway = {
        "requests": 4,
        "input_tokens": 1200,
        "output_tokens": 80,
        "cache_read": 5,
        "cache_write": 0,
        "rate_limited": 2,
        "retry_after_s": 30.0,
    }
    turn_id = a_turn(
        site,
        [],
        status="succeeded",
        failure=None,
        usage=None,
        gateway_usage=gateway,
    )
    page = (await site.browser.get(f"/turns/{turn_id}")).text
    assert "4 requests · 1200 in · 80 out · 5 cached" in page
    assert "2 rate-limited</strong> (retry after 30.0 s)" in page
    plain = a_turn_without_gateway(site)
    assert "Model gateway" not in (await site.browser.get(f"/turns/{plain}")).text


def a_turn_without_gateway(site: Site) -> str:
    [agent] = site.store.list_agents()
    computer_id = str(agent["computer_id"])
    turn = site.store.register_turn(computer_id, agent["id"], [], "go", "opencode", "m/x", None)
    site.store.finish_turn(computer_id, turn["turn_id"], turn["fence"], "succeeded", None, None)
    return str(turn["turn_id"])


async def test_a_running_turn_appends_its_denials_and_ends_with_the_gateway_usage(
    site: Site,
) -> None:
    csrf = await site.sign_in()
    computer_id, _ = site.store.create_computer("box")
    site.store.connect(computer_id, "h", "linux", "1", 1)
    agent = site.store.create_agent("ada", "Ada", "", "local/scripted", "opencode", computer_id)
    turn = site.store.register_turn(computer_id, agent["id"], [], "go", "opencode", "m/x", None)
    turn_id, fence = turn["turn_id"], turn["fence"]
    async with anyio.create_task_group() as tasks:
        stream, stream_id = await open_browser_stream(site, tasks)
        answer = await subscribe(site, csrf, stream_id, "t:events", f"/live/turns/{turn_id}?from=0")
        assert answer.status_code == 204, answer.text
        event = denied("10.99.0.1", 80, None, 5)
        stored = {
            "type": event["type"],
            "at": AT,
            "data_json": orjson.dumps(event["data"]).decode(),
        }
        site.store.add_events(computer_id, turn_id, fence, 0, [stored])

        def appended() -> list[str]:
            return [u["html"] for u in updates_in(stream) if u["mode"] == "append"]

        [line] = await wait_until_async("the denial", appended)
        assert "10.99.0.1:80 (tcp) ×5" in " ".join(line.split())
        gateway = {
            "requests": 2,
            "input_tokens": 9,
            "output_tokens": 3,
            "cache_read": 0,
            "cache_write": 0,
            "rate_limited": 0,
            "retry_after_s": None,
        }
        site.store.finish_turn(
            computer_id, turn_id, fence, "succeeded", None, None, gateway_usage=gateway
        )

        def summary() -> list[str]:
            return [
                u["html"]
                for u in updates_in(stream)
                if u.get("target") == "turn-summary" and "Model gateway" in u.get("html", "")
            ]

        assert "2 requests · 9 in · 3 out" in (await wait_until_async("the summary", summary))[0]
        tasks.cancel_scope.cancel()
