"""The room is where status lives (issue 25), in Chromium through the whole chain:
crew-server, the warm Computer, the real OpenCode in bwrap and the scripted model.

(a) A post in a dm: "Ada is working…" appears under the timeline within 0.5 s of the
post's answer (the scripted model takes two seconds, so the turn is visibly running),
and goes when the reply lands. (b) An agent whose model provider refuses the login: its
turns fail, the Computer retries (fast here: `retry_base_s`), and after three failed
turns the room shows exactly one line about it, counting them; once the provider takes
the login again, the next retry answers and the line goes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.chain import Chain, running_chain
from tests.web.pages import (
    DESKTOP,
    LIVE_TIMEOUT_MS,
    having,
    heredoc,
    serious_violations,
    shoot,
    sign_in,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# The bound for the working line, counted from the post's answer.
WORKING_WITHIN_MS = 500
# The Computer's first retry wait after a failed turn (doubling): three failures in ~2 s.
RETRY_BASE_S = 0.3


@pytest.fixture(scope="module")
def chain() -> Iterator[Chain]:
    """The module's one chain, warm, with retries that come fast."""
    with running_chain(retry_base_s=RETRY_BASE_S) as started:
        yield started


@pytest.fixture
def page(browser: Any, chain: Chain) -> Any:
    context = browser.new_context(viewport=DESKTOP)
    opened = context.new_page()
    sign_in(opened, chain.server.url, chain.server.user_token)
    yield opened
    context.close()


def reply(text: str) -> str:
    """The agent's answer in the room its turn serves."""
    return heredoc("{{room}}", text)


def send(page: Any, text: str) -> None:
    """Type and send in the composer; returns when the server answered the post."""
    with page.expect_response(
        lambda r: r.request.method == "POST" and r.url.endswith("/messages")
    ) as answer:
        page.get_by_label("Message", exact=True).fill(text)
        page.get_by_role("button", name="Send").first.click()
    assert answer.value.status < 400, answer.value.status


def test_the_working_line_shows_while_the_turn_runs(page: Any, chain: Chain, shots: Path) -> None:
    chain.script(
        [
            {"role": "user", "match": having("WARM-S"), "reply": {"bash": reply("Ready.")}},
            {
                "role": "user",
                "match": having("WORK-S"),
                "reply": {"bash": reply("Worked on it."), "delay_s": 2.0},
            },
        ]
    )
    ada = chain.agent("ada-status", "Ada")
    room = chain.dm(ada["id"])
    page.goto(f"{chain.server.url}/rooms/{room['id']}")
    # A first turn starts the agent's warm OpenCode server: the timed one runs on it.
    send(page, "WARM-S hello")
    page.locator("#timeline article.by-agent", has_text="Ready.").wait_for(timeout=LIVE_TIMEOUT_MS)
    working = page.locator("#room-status .status-line.working", has_text="Ada is working…")
    working.wait_for(state="detached", timeout=LIVE_TIMEOUT_MS)

    send(page, "WORK-S please work")
    working.wait_for(timeout=WORKING_WITHIN_MS)
    assert re.search(r"Ada is working…\s+(starting|thinking|writing)", working.inner_text()), (
        working.inner_text()
    )
    shoot(page, shots, "room-working")
    page.locator("#timeline article.by-agent", has_text="Worked on it.").wait_for(
        timeout=LIVE_TIMEOUT_MS
    )
    working.wait_for(state="detached", timeout=LIVE_TIMEOUT_MS)
    assert [t["status"] for t in chain.finished_turns(ada["id"], 2)] == ["succeeded"] * 2


def test_a_failing_agent_leaves_one_line_that_counts_its_retries(
    page: Any, chain: Chain, shots: Path, axe_source: str
) -> None:
    refused = {"error": {"status": 401, "message": "bad key"}}
    chain.script([{"role": "user", "match": having("FAIL-S"), "reply": refused}])
    dee = chain.agent("dee-status", "Dee")
    room = chain.dm(dee["id"])
    page.goto(f"{chain.server.url}/rooms/{room['id']}")
    send(page, "FAIL-S please answer")
    failed = chain.finished_turns(dee["id"], 3)
    assert [t["status"] for t in failed[:3]] == ["failed"] * 3, chain.diagnostics()
    assert {t["failure"]["class"] for t in failed} == {"not_logged_in"}
    lines = page.locator("#room-status .status-line.failed")
    lines.filter(has_text=re.compile(r"failed ([3-9]|\d\d+) times")).wait_for(
        timeout=LIVE_TIMEOUT_MS
    )
    assert lines.count() == 1
    text = lines.inner_text()
    assert text.startswith("Dee couldn't reply: not logged in: the model provider refused"), text
    assert "opencode auth login" not in text  # the long reason lives on the agent page
    how = lines.get_by_role("link", name="how to fix")
    assert how.get_attribute("href") == f"/agents/{dee['id']}#agent-status"
    assert lines.get_by_role("button", name="Retry @dee-status").count() == 1
    assert lines.get_by_role("button", name="Dismiss @dee-status's failure").count() == 1
    # Nothing repeated in the timeline either: the user's message, no notice per retry.
    assert page.locator("#timeline article").count() == 1
    assert serious_violations(page, axe_source) == []
    shoot(page, shots, "room-failing")

    chain.script(
        [{"role": "user", "match": having("FAIL-S"), "reply": {"bash": reply("Back now.")}}]
    )
    page.locator("#timeline article.by-agent", has_text="Back now.").wait_for(
        timeout=LIVE_TIMEOUT_MS
    )
    lines.first.wait_for(state="detached", timeout=LIVE_TIMEOUT_MS)
