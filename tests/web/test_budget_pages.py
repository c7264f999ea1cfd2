"""The web app's side of issue 24's budgets: the agent form edits the caps (a cap the
server cannot take comes back with the reason, nothing stored), the agent page shows what
was spent and a hold with when it ends, and its Resume once button lets one turn through
and wakes the agent."""

from __future__ import annotations

import html

import pytest

from tests.web.site import Site

pytestmark = pytest.mark.anyio


def form(csrf: str, **fields: str) -> dict[str, str]:
    return {"csrf": csrf, "name": "Dora", "model": "local/scripted", **fields}


def caps(daily: str = "", monthly: str = "", tokens: str = "") -> dict[str, str]:
    return {
        "budget_daily_usd": daily,
        "budget_monthly_usd": monthly,
        "budget_monthly_tokens": tokens,
    }


async def test_the_form_sets_changes_and_clears_the_budget(site: Site) -> None:
    csrf = await site.sign_in()
    dora = await site.agent("dora")
    saved = await site.browser.post(
        f"/agents/{dora['id']}", data=form(csrf, **caps(daily="5", tokens="1000000"))
    )
    assert saved.status_code == 303 and saved.headers["location"] == f"/agents/{dora['id']}"
    budget = {"daily_usd": 5.0, "monthly_usd": None, "monthly_tokens": 1_000_000}
    assert site.store.get_agent(dora["id"])["budget"] == budget
    page = html.unescape((await site.browser.get(f"/agents/{dora['id']}")).text)
    assert 'name="budget_daily_usd" inputmode="decimal" value="5.0"' in page
    assert 'name="budget_monthly_tokens" inputmode="numeric" value="1000000"' in page
    assert "Budget spent: $0.00 of $5.00 today · 0 of 1,000,000 tokens this month" in page

    # a form without the budget boxes leaves it; blank boxes clear it
    await site.browser.post(f"/agents/{dora['id']}", data=form(csrf))
    assert site.store.get_agent(dora["id"])["budget"] == budget
    await site.browser.post(f"/agents/{dora['id']}", data=form(csrf, **caps()))
    assert site.store.get_agent(dora["id"])["budget"]["daily_usd"] is None


@pytest.mark.parametrize(
    ("daily", "reason"),
    [("-1", "daily_usd cannot be below zero"), ("five", "daily_usd must be a number or null")],
)
async def test_a_cap_it_cannot_take_comes_back_with_the_reason(
    site: Site, daily: str, reason: str
) -> None:
    csrf = await site.sign_in()
    dora = await site.agent("dora")
    refused = await site.browser.post(
        f"/agents/{dora['id']}", data=form(csrf, **caps(daily=daily), back="/x")
    )
    assert refused.status_code == 303
    page = html.unescape((await site.browser.get(f"/agents/{dora['id']}")).text)
    assert reason in page
    assert site.store.get_agent(dora["id"])["budget"]["daily_usd"] is None


async def test_a_new_agent_takes_its_budget_from_the_form(site: Site) -> None:
    csrf = await site.sign_in()
    made = await site.browser.post("/agents", data=form(csrf, handle="finn", **caps(monthly="20")))
    assert made.status_code == 303
    [finn] = site.store.list_agents()
    assert finn["budget"]["monthly_usd"] == 20.0


async def test_a_held_agent_shows_until_when_and_resume_once_lets_it_go_on(site: Site) -> None:
    csrf = await site.sign_in()
    computer_id, _ = site.store.create_computer("box")
    site.store.connect(computer_id, "h", "linux", "1", 1)
    ada = site.store.create_agent(
        "ada", "Ada", "", "local/scripted", "opencode", computer_id, budget={"daily_usd": 1}
    )
    room, _ = site.store.create_room("dm", None, [ada["id"]])
    site.store.user_post(room["id"], "one", None)
    rooms, _ = site.store.claim_unread(computer_id, ada["id"])
    turn = site.store.register_turn(
        computer_id,
        ada["id"],
        [{"room_id": room["id"], "from_seq": 1, "to_seq": rooms[0]["messages"][-1]["seq"]}],
        "go",
        "opencode",
        "m/x",
        None,
    )
    site.store.ack(computer_id, ada["id"], turn["turn_id"], turn["fence"])
    usage = {"input_tokens": 1, "output_tokens": 1, "cost": 1.5}
    site.store.finish_turn(computer_id, turn["turn_id"], turn["fence"], "succeeded", None, usage)
    site.store.user_post(room["id"], "two", None)
    assert site.store.claim_turn(computer_id, ada["id"])[2] is not None  # held

    page = html.unescape((await site.browser.get(f"/agents/{ada['id']}")).text)
    assert '<span class="badge status-budget">budget</span>' in page
    assert "Held by its budget until" in page
    assert 'datetime="2026-10-06T00:00:00.000000+00:00"' in page
    assert "$1.50 of $1.00 today" in page
    assert f'action="/agents/{ada["id"]}/budget/resume"' in page

    before = site.store.last_event_id()
    resumed = await site.browser.post(
        f"/agents/{ada['id']}/budget/resume", data={"csrf": csrf, "back": "/x"}
    )
    assert resumed.status_code == 303 and resumed.headers["location"] == f"/agents/{ada['id']}"
    woken = [e for _, e, _ in site.store.events_after(computer_id, before, limit=100)]
    assert woken == ["wake"]
    page = html.unescape((await site.browser.get(f"/agents/{ada['id']}")).text)
    assert "Resumed once: its next turn may run." in page
    rooms, _, paused = site.store.claim_turn(computer_id, ada["id"])
    assert paused is None and rooms[0]["messages"][-1]["body"] == "two"


async def test_resume_without_the_csrf_token_is_refused(site: Site) -> None:
    await site.sign_in()
    dora = await site.agent("dora")
    refused = await site.browser.post(f"/agents/{dora['id']}/budget/resume", data={})
    assert refused.status_code == 403
    assert site.store.list_agents()[0]["budget_state"] is None
