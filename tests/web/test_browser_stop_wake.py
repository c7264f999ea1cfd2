"""A person's Stop and Wake in Chromium (issue 25), through the whole chain: crew-server,
the warm Computer, the real OpenCode in bwrap and the scripted model.

On the agent's page, Stop appears live while its turn runs a long tool; it asks first
(a `<details>`, no script), and its click ends the turn `cancelled`. Wake then appears
in its place; its click runs a turn that answers the message, seen in the room. The
page with either control passes axe-core.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.chain import Chain
from tests.e2e.test_stop_wake import answer_rules, long_tool_rules, running_turn
from tests.web.pages import DESKTOP, LIVE_TIMEOUT_MS, serious_violations, shoot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def test_stop_then_wake_from_the_agent_page(
    browser: Any, chain: Chain, shots: Path, axe_source: str
) -> None:
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    sign_in(page, chain.server.url, chain.server.user_token)
    chain.script(long_tool_rules("WEB-STOP"))
    ada = chain.agent("ada-web-stop")
    room = chain.dm(ada["id"])
    page.goto(f"{chain.server.url}/agents/{ada['id']}")
    chain.post(room["id"], "WEB-STOP run the long job")
    running_turn(chain, ada["id"])
    ask = page.get_by_text("Stop @ada-web-stop's turn…")
    ask.wait_for(timeout=LIVE_TIMEOUT_MS)  # live: the page was open before the turn
    ask.click()
    assert page.get_by_text("Stop this turn?").is_visible()
    assert serious_violations(page, axe_source) == []
    shoot(page, shots, "agent-stop-confirm")
    page.get_by_role("button", name="Stop", exact=True).click()
    page.locator("#agent-turns .badge.turn-cancelled").wait_for(timeout=LIVE_TIMEOUT_MS)
    wake = page.get_by_role("button", name="Wake @ada-web-stop")
    wake.wait_for(timeout=LIVE_TIMEOUT_MS)
    assert serious_violations(page, axe_source) == []
    shoot(page, shots, "agent-stopped")
    chain.script(answer_rules("WEB-STOP", "Answered after the wake."))
    wake.click()
    page.locator("#agent-turns .badge.turn-succeeded").wait_for(timeout=LIVE_TIMEOUT_MS)
    page.goto(f"{chain.server.url}/rooms/{room['id']}")
    timeline = page.locator("#timeline")
    timeline.get_by_text("stopped (you asked)").wait_for(timeout=LIVE_TIMEOUT_MS)
    reply = timeline.locator("article.by-agent").first
    reply.wait_for(timeout=LIVE_TIMEOUT_MS)
    assert "Answered after the wake." in reply.inner_text()
    shoot(page, shots, "room-after-stop-and-wake")
    context.close()
