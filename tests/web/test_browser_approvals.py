"""An approval card answered by a person in Chromium, through the whole chain (issue 24):
crew-server, the warm Computer, the real OpenCode in bwrap and the scripted model.

The agent's policy asks before `touch *`. The person posts in the agent's dm; the card
appears live in the room ("@ada wants to run `touch …`" with Allow once · Always ·
Deny); a click on Allow once lets the command run, the card says so, and the reply
appears without a reload. A click on Deny: the file is never made and the agent says
it could not.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.chain import Chain
from tests.e2e.test_approvals import asking_agent, touch_rules
from tests.web.pages import DESKTOP, LIVE_TIMEOUT_MS, shoot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


@pytest.fixture
def page(browser: Any, chain: Chain) -> Any:
    context = browser.new_context(viewport=DESKTOP)
    opened = context.new_page()
    sign_in(opened, chain.server.url, chain.server.user_token)
    yield opened
    context.close()


def script_for(chain: Chain, tag: str, name: str) -> None:
    chain.script(touch_rules(tag, name, f"Made {name}.", f"I could not make {name}."))


def open_dm(page: Any, chain: Chain, handle: str) -> tuple[dict[str, Any], dict[str, Any]]:
    agent = asking_agent(chain, handle)
    room = chain.dm(agent["id"])
    page.goto(f"{chain.server.url}/rooms/{room['id']}")
    return agent, room


def send(page: Any, text: str) -> None:
    page.get_by_label("Message", exact=True).fill(text)
    page.get_by_role("button", name="Send").first.click()


def test_allow_once_in_the_room_runs_the_command(page: Any, chain: Chain, shots: Path) -> None:
    script_for(chain, "CARD-ALLOW", "allowed.txt")
    ada, _ = open_dm(page, chain, "ada-card")
    send(page, "CARD-ALLOW please make the file")
    card = page.locator(".approval.state-pending")
    card.wait_for(timeout=LIVE_TIMEOUT_MS)
    article = page.locator("#timeline article", has=card)
    assert re.search(r"@ada-card wants to run .*touch allowed\.txt", article.inner_text()), (
        article.inner_text()
    )
    shoot(page, shots, "approval-card")
    work = chain.crew_home / "agents" / ada["id"] / "work"
    assert not (work / "allowed.txt").exists()  # nothing runs while the card waits
    card.get_by_role("button", name="Allow once").click()
    page.locator(".approval.state-allowed").wait_for(timeout=LIVE_TIMEOUT_MS)
    reply = page.locator("#timeline article.by-agent").first
    reply.wait_for(timeout=LIVE_TIMEOUT_MS)
    assert "Made allowed.txt." in reply.inner_text()
    assert (work / "allowed.txt").exists()
    [turn] = chain.finished_turns(ada["id"], 1)
    assert turn["status"] == "succeeded", (turn["failure"], chain.diagnostics())
    shoot(page, shots, "approval-allowed")


def test_deny_in_the_room_and_the_agent_says_it_could_not(page: Any, chain: Chain) -> None:
    script_for(chain, "CARD-DENY", "denied.txt")
    bea, _ = open_dm(page, chain, "bea-card")
    send(page, "CARD-DENY please make the file")
    card = page.locator(".approval.state-pending")
    card.wait_for(timeout=LIVE_TIMEOUT_MS)
    card.get_by_role("button", name="Deny").click()
    page.locator(".approval.state-denied").wait_for(timeout=LIVE_TIMEOUT_MS)
    reply = page.locator("#timeline article.by-agent").first
    reply.wait_for(timeout=LIVE_TIMEOUT_MS)
    assert "I could not make denied.txt." in reply.inner_text()
    assert not (chain.crew_home / "agents" / bea["id"] / "work" / "denied.txt").exists()
