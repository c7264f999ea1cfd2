"""A tool call seen while it runs, in Chromium, through the whole chain (issue 25): crew-server,
the warm Computer, the real OpenCode in bwrap and the scripted model.

The model's bash call takes seconds (`sleep 8`). The person opens the turn from the
agent's page while it runs: the call is listed as running (tool, input, how long so
far) with no output yet; when it finishes it is completed in place — the same place in
the list, now ok with its output, and still one element for the call.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from crew_harness.waiting import wait_until
from tests.e2e.chain import Chain
from tests.web.pages import (
    DESKTOP,
    LIVE_TIMEOUT_MS,
    REPLY_ROOM,
    having,
    heredoc,
    shoot,
    sign_in,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# Long enough to open the turn from the agent page while it runs, on a busy machine too.
# Its output (SLEPT-42) is not in its input, so the output is told apart on the page.
SLOW = "sleep 8; echo SLEPT-$((6 * 7))"


def slow_rules(tag: str) -> list[dict[str, Any]]:
    """A turn with `tag` runs the slow command, then replies once the tool's output is in."""
    return [
        {"role": "user", "match": having(tag), "reply": {"bash": SLOW}},
        {
            "role": "tool",
            "match": "SLEPT-42",
            "capture": {"room": REPLY_ROOM},
            "reply": {"bash": heredoc("{{room}}", "Slept well.")},
        },
    ]


def turn_listed(page: Any, agent_id: str, chain: Chain) -> bool:
    """The agent page, loaded again: does it list a turn yet?"""
    page.goto(f"{chain.server.url}/agents/{agent_id}")
    return bool(page.locator("#agent-turns a").count())


def places(page: Any) -> list[str]:
    """The ids of the turn page's listed events, in their order."""
    ids: list[str] = page.locator("#turn-events > li").evaluate_all("els => els.map(e => e.id)")
    return ids


def test_a_running_tool_call_shows_and_is_completed_in_place(
    browser: Any, chain: Chain, shots: Path
) -> None:
    ada = chain.agent("ada-tools")
    room = chain.dm(ada["id"])
    chain.script(slow_rules("TOOLS-LIVE"))
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    try:
        sign_in(page, chain.server.url, chain.server.user_token)
        page.goto(f"{chain.server.url}/agents/{ada['id']}")
        chain.post(room["id"], "TOOLS-LIVE take your time")
        link = page.locator("#agent-turns a").first
        # The agent page lists the turn once it is registered (a load shows it at once;
        # its live list may lag behind a running turn).
        wait_until("the turn on the agent page", lambda: turn_listed(page, ada["id"], chain))
        link.click()
        page.wait_for_url(re.compile(r"/turns/[0-9a-f-]{36}$"))

        call = page.locator("#turn-events > li", has_text="sleep 8")
        running = page.locator("#turn-events > li.ev-tool_start", has_text="sleep 8")
        running.wait_for(timeout=LIVE_TIMEOUT_MS)
        assert "running" in running.locator("h3").inner_text()
        assert running.locator(".tool-output").count() == 0
        assert "SLEPT-42" not in running.inner_text()
        started_at = running.locator("time").get_attribute("datetime")
        assert started_at
        # The page script counts the seconds the call has run.
        page.wait_for_function(
            "() => /\\d+ s$/.test(document.querySelector('.ev-tool_start [data-elapsed-since]')"
            "?.textContent || '')",
            timeout=LIVE_TIMEOUT_MS,
        )
        place = places(page).index(running.get_attribute("id"))
        shoot(page, shots, "turn-tool-running")

        done = page.locator("#turn-events > li.ev-tool_use", has_text="sleep 8")
        done.wait_for(timeout=LIVE_TIMEOUT_MS)
        assert call.count() == 1  # completed in place, not listed twice
        assert places(page).index(done.get_attribute("id")) == place
        assert "ok" in done.locator(".badge").inner_text()
        assert "SLEPT-42" in done.locator(".tool-output").inner_text()
        assert page.locator(".ev-tool_start", has_text="sleep 8").count() == 0
        shoot(page, shots, "turn-tool-done")
    finally:
        context.close()

    [turn] = chain.finished_turns(ada["id"], 1)
    assert turn["status"] == "succeeded", (turn["failure"], chain.diagnostics())
    starts = [e for e in turn["events"] if e["type"] == "tool_start"]
    uses = [e for e in turn["events"] if e["type"] == "tool_use"]
    assert [s["data"]["call_id"] for s in starts] == [u["data"]["call_id"] for u in uses]
    assert starts[0]["data"]["input"]["command"] == SLOW
    assert any(
        m["body"].strip() == "Slept well." for m in chain.agent_messages(room["id"], ada["id"])
    )
    chain.check_engine()
