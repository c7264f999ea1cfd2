"""The web app's side of issue 24: an approval card in the room with its three answers
(form posts with the session's CSRF token), its state after, and the approval events in
the turn view. The Computer side is driven through the store, as the computer API does."""

from __future__ import annotations

import html
from typing import Any

import anyio
import orjson
import pytest

from crew_harness.waiting import wait_until_async
from tests.web.site import Site, open_browser_stream, subscribe, updates_in

pytestmark = pytest.mark.anyio

PUSH = "git push origin main"


async def asking(site: Site) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """@ada on a connected Computer, asked in a group, its turn asking to push: (room,
    turn, approval)."""
    store = site.store
    computer_id, _ = store.create_computer("box")
    store.connect(computer_id, "h", "linux", "1", 1)
    ada = store.create_agent(
        "ada", "Ada", "", "m/x", "opencode", computer_id, permission={"preset": "careful"}
    )
    room, _ = store.create_room("group", "ops", [ada["id"]])
    store.user_post(room["id"], "@ada push it", None)
    rooms, _ = store.claim_unread(computer_id, ada["id"])
    claim = [{"room_id": room["id"], "from_seq": 1, "to_seq": rooms[0]["messages"][-1]["seq"]}]
    turn = store.register_turn(computer_id, ada["id"], claim, "x", "opencode", "m/x", None)
    approval, created = store.create_approval(
        computer_id, turn["turn_id"], "per_1", "bash", [PUSH], ["git push *"], PUSH
    )
    assert created
    return room, turn, approval


async def answer(
    site: Site, csrf: str, room: dict[str, Any], approval_id: str, decision: str
) -> str:
    sent = await site.browser.post(
        f"/approvals/{approval_id}",
        data={"csrf": csrf, "decision": decision, "back": f"/rooms/{room['id']}"},
    )
    assert sent.status_code == 303
    return html.unescape((await site.browser.get(f"/rooms/{room['id']}")).text)


@pytest.mark.parametrize(
    ("decision", "shown"),
    [
        ("once", "Allowed once by you"),
        ("always", "Always allowed for @ada by you"),
        ("deny", "Denied"),
    ],
)
async def test_the_card_offers_three_answers_and_shows_the_one_given(
    site: Site, decision: str, shown: str
) -> None:
    csrf = await site.sign_in()
    room, _, approval = await asking(site)
    page = html.unescape((await site.browser.get(f"/rooms/{room['id']}")).text)
    # The notice is Markdown: its command shows as inline code.
    assert f'<span class="mention">@ada</span> wants to run <code>{PUSH}</code>' in page
    for label in ("Allow once", "Always for @ada", "Deny"):
        assert f">{label}</button>" in page
    after = await answer(site, csrf, room, approval["id"], decision)
    assert shown in after
    assert ">Allow once</button>" not in after
    assert site.store.get_approval(approval["id"])["decision"] == decision
    if decision == "always":
        rules = site.store.computer_agents(
            site.store.get_approval(approval["id"])["agent_id"]
            and site.store.list_computers()[0]["id"]
        )[0]["permission"]["rules"]
        assert {"tool": "bash", "pattern": "git push *", "action": "allow"} in rules


async def test_an_answer_without_the_csrf_token_is_refused(site: Site) -> None:
    await site.sign_in()
    _, _, approval = await asking(site)
    sent = await site.browser.post(f"/approvals/{approval['id']}", data={"decision": "once"})
    assert sent.status_code in (400, 403)
    assert site.store.get_approval(approval["id"])["state"] == "pending"


async def test_an_expired_card_says_why(site: Site) -> None:
    csrf = await site.sign_in()
    room, _, approval = await asking(site)
    site.store.clock.advance(601)
    page = html.unescape((await site.browser.get(f"/rooms/{room['id']}")).text)
    assert "Expired: no answer within 600 s" in page
    late = await site.browser.post(
        f"/approvals/{approval['id']}",
        data={"csrf": csrf, "decision": "once", "back": f"/rooms/{room['id']}"},
    )
    assert site.store.get_approval(approval["id"])["state"] == "expired"
    assert late.status_code in (303, 409)


async def test_the_turn_view_shows_the_approval_events(site: Site) -> None:
    await site.sign_in()
    _, turn, approval = await asking(site)
    computer_id = site.store.list_computers()[0]["id"]
    events = [
        (
            "approval_asked",
            {"approval_id": approval["id"], "tool": "bash", "patterns": [PUSH], "summary": PUSH},
        ),
        (
            "approval_answered",
            {
                "approval_id": approval["id"],
                "state": "denied",
                "decision": "deny",
                "reason": "denied by the user",
                "waited_s": 12.4,
            },
        ),
        ("permission_denied", {"tool": "bash", "summary": "rm -rf /", "reason": "a deny rule"}),
    ]
    site.store.add_events(
        computer_id,
        turn["turn_id"],
        turn["fence"],
        0,
        [
            {"type": t, "at": "2026-10-05T09:00:00+00:00", "data_json": orjson.dumps(d).decode()}
            for t, d in events
        ],
    )
    page = html.unescape((await site.browser.get(f"/turns/{turn['turn_id']}")).text)
    assert f"asked the person</strong> to bash <code>{PUSH}</code>" in page
    assert '<strong>denied</strong> (deny) <span class="muted">denied by the user</span>' in page
    assert "after 12 s" in page
    assert "refused</strong> bash <code>rm -rf /</code>" in page
    assert "Malformed" not in page


async def test_a_card_appears_live_and_its_answer_replaces_it(site: Site) -> None:
    csrf = await site.sign_in()
    store = site.store
    computer_id, _ = store.create_computer("box")
    store.connect(computer_id, "h", "linux", "1", 1)
    ada = store.create_agent("ada", "Ada", "", "m/x", "opencode", computer_id)
    room, _ = store.create_room("group", "ops", [ada["id"]])
    store.user_post(room["id"], "@ada push it", None)
    store.claim_unread(computer_id, ada["id"])
    claim = [{"room_id": room["id"], "from_seq": 1, "to_seq": 1}]
    turn = store.register_turn(computer_id, ada["id"], claim, "x", "opencode", "m/x", None)
    async with anyio.create_task_group() as tasks:
        stream, stream_id = await open_browser_stream(site, tasks)
        subscribed = await subscribe(
            site, csrf, stream_id, "r:timeline", f"/live/rooms/{room['id']}?after=1"
        )
        assert subscribed.status_code == 204, subscribed.text
        approval, _ = store.create_approval(
            computer_id, turn["turn_id"], "per_1", "bash", [PUSH], [], PUSH
        )

        def card(mode: str) -> list[str]:
            return [u["html"] for u in updates_in(stream) if u["mode"] == mode]

        [shown] = await wait_until_async("the card", lambda: card("append"))
        assert ">Allow once</button>" in shown
        store.answer_approval(approval["id"], "deny")
        replaced = await wait_until_async("the answered card", lambda: card("outer"))
        assert "Denied" in replaced[-1] and ">Allow once</button>" not in replaced[-1]
        tasks.cancel_scope.cancel()


async def test_the_agent_form_edits_the_policy_and_shows_an_always_rule(site: Site) -> None:
    csrf = await site.sign_in()
    room, _, approval = await asking(site)
    await answer(site, csrf, room, approval["id"], "always")
    [ada] = site.store.list_agents()
    page = html.unescape((await site.browser.get(f"/agents/{ada['id']}")).text)
    assert '<option value="careful" selected>careful: ask before pushing' in page
    assert "bash git push * allow\n</textarea>" in page
    fields = {"csrf": csrf, "name": "Ada", "model": "m/x", "computer_id": ada["computer_id"]}
    saved = await site.browser.post(
        f"/agents/{ada['id']}",
        data={
            **fields,
            "permission_preset": "read-only",
            "permission_rules": "bash rm -rf * deny\r\n",
            "permission_ask_timeout_s": "120",
        },
    )
    assert saved.status_code == 303
    assert site.store.get_agent(ada["id"])["permission"] == {
        "preset": "read-only",
        "rules": [{"tool": "bash", "pattern": "rm -rf *", "action": "deny"}],
        "ask_timeout_s": 120,
    }
    bad = await site.browser.post(
        f"/agents/{ada['id']}",
        data={**fields, "permission_preset": "careful", "permission_rules": "bsh ls allow"},
    )
    assert bad.status_code == 303
    page = html.unescape((await site.browser.get(f"/agents/{ada['id']}")).text)
    assert "unknown tool 'bsh'" in page
    assert site.store.get_agent(ada["id"])["permission"]["preset"] == "read-only"
