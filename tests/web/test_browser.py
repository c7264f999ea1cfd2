"""The web app in a real browser (Debian's chromium through Playwright), through the
whole chain: crew-server, the real Computer, the real OpenCode in bwrap and the
scripted model.

A person signs in, creates an agent, opens its dm, posts, and sees the reply appear
without a reload; opens the turn and sees the tool call with its output and the
cost; works in a group with two agents and a thread; sees a failing turn's reason on
the agent. Hostile text shows as text and runs nothing; a form post without the CSRF
token is refused. Every page passes axe-core with no serious violation, at 360 px and
on a desktop. Screenshots go to the folder printed at the end of the run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.chain import MODEL, Chain
from tests.web.pages import (
    DESKTOP,
    LIVE_TIMEOUT_MS,
    PHONE,
    answer_rules,
    having,
    heredoc,
    serious_violations,
    shoot,
    sign_in,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


@pytest.fixture
def page(browser: Any, chain: Chain) -> Any:
    """A signed-in desktop page; dialogs (an alert from injected script) are recorded."""
    context = browser.new_context(viewport=DESKTOP)
    opened = context.new_page()
    opened.dialogs = []
    opened.on("dialog", lambda dialog: (opened.dialogs.append(dialog.message), dialog.dismiss()))
    sign_in(opened, chain.server.url, chain.server.user_token)
    yield opened
    context.close()


def create_agent_in_form(page: Any, chain: Chain, handle: str, name: str) -> None:
    page.goto(f"{chain.server.url}/agents")
    page.get_by_label("Handle", exact=True).fill(handle)
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("Persona", exact=True).fill("Answers briefly.")
    page.get_by_label("Model", exact=True).fill(MODEL)
    page.get_by_role("button", name="Create the agent").click()
    page.wait_for_url(re.compile(r".*/agents/[0-9a-f-]{36}$"))


def test_chat_with_a_new_agent_and_read_its_turn(page: Any, chain: Chain, shots: Path) -> None:
    chain.script(
        [
            {
                "role": "user",
                "match": having("WEB-1"),
                "reply": {
                    "bash": "echo 'a note' > note.txt && "
                    + heredoc("{{room}}", "Hi! I wrote note.txt for you.")
                },
            }
        ]
    )
    create_agent_in_form(page, chain, "ada", "Ada")
    shoot(page, shots, "agent-new")
    page.goto(f"{chain.server.url}/rooms")
    page.get_by_label("Agent", exact=True).select_option(label="Ada (@ada)")
    page.get_by_role("button", name="Open the chat").click()
    page.wait_for_url(re.compile(r".*/rooms/[0-9a-f-]{36}$"))

    page.evaluate("() => { window.__same_page = true; }")
    page.get_by_label("Message", exact=True).fill("WEB-1 hello @ada, leave me a note")
    page.get_by_role("button", name="Send").first.click()
    reply = page.locator("#timeline article.by-agent").first
    reply.wait_for(timeout=LIVE_TIMEOUT_MS)
    assert "Hi! I wrote note.txt for you." in reply.inner_text()
    # The reply came over the live stream: the page was never reloaded.
    assert page.evaluate("() => window.__same_page") is True
    assert page.locator("#timeline article.by-user .mention").inner_text() == "@ada"
    shoot(page, shots, "room-dm")

    page.goto(f"{chain.server.url}/agents")
    page.get_by_role("link", name="Ada").click()
    page.locator("#agent-turns a").first.click()
    page.wait_for_url(re.compile(r".*/turns/[0-9a-f-]{36}$"))
    tool = page.locator(".ev-tool_use").first
    tool.wait_for(timeout=LIVE_TIMEOUT_MS)
    assert "bash" in tool.locator("h3").inner_text()
    assert "crew reply" in tool.locator(".tool-input").inner_text()
    assert "Message sent" in tool.locator(".tool-output").inner_text()
    summary = page.locator("#turn-summary")
    summary.locator(".turn-succeeded").wait_for(timeout=LIVE_TIMEOUT_MS)
    cost = summary.locator(".cost").inner_text()
    assert re.fullmatch(r"\$0\.\d{2,6}", cost), cost  # short, and not zero
    shoot(page, shots, "turn")


def test_a_group_with_two_agents_and_a_thread(page: Any, chain: Chain, shots: Path) -> None:
    chain.script(
        answer_rules("THREAD-W", "bo", "Bo answers in the thread.")
        + answer_rules("GROUP-W", "bo", "Bo here.")
        + answer_rules("GROUP-W", "cy", "Cy here.")
    )
    chain.agent("bo")
    chain.agent("cy")
    page.goto(f"{chain.server.url}/rooms")
    page.get_by_label("Title", exact=True).fill("Launch")
    page.get_by_label("Bo (@bo)", exact=True).check()
    page.get_by_label("Cy (@cy)", exact=True).check()
    page.get_by_role("button", name="Create the group").click()
    page.wait_for_url(re.compile(r".*/rooms/[0-9a-f-]{36}$"))

    composer = page.get_by_label("Message", exact=True)
    composer.fill("GROUP-W hello @b")
    page.locator(".completions button", has_text="@bo").click()  # @handle completion
    assert composer.input_value() == "GROUP-W hello @bo "
    composer.type("and @cy")
    page.get_by_role("button", name="Send").first.click()
    page.locator("#timeline article.by-agent", has_text="Bo here.").first.wait_for(
        timeout=LIVE_TIMEOUT_MS
    )
    page.locator("#timeline article.by-agent", has_text="Cy here.").first.wait_for(
        timeout=LIVE_TIMEOUT_MS
    )

    mine = page.locator("#timeline article.by-user").first
    mine.get_by_role("link", name="Reply in thread").click()
    page.locator("#thread-messages").wait_for()
    page.get_by_label("Reply in thread", exact=True).fill("THREAD-W @bo one more question")
    page.locator(".thread").get_by_role("button", name="Send").click()
    # The thread exists now (the post opened it): its replies arrive live.
    page.locator("#thread-messages article.by-user").wait_for()
    page.locator(
        "#thread-messages article.by-agent", has_text="Bo answers in the thread."
    ).wait_for(timeout=LIVE_TIMEOUT_MS)
    assert page.locator("#timeline", has_text="Bo answers in the thread.").count() == 0
    # The root's reply count in the timeline follows, without a reload.
    mine.get_by_role("link", name="2 replies").wait_for(timeout=LIVE_TIMEOUT_MS)
    shoot(page, shots, "room-group-thread")


def test_a_failing_turn_shows_its_reason_on_the_agent(page: Any, chain: Chain, shots: Path) -> None:
    chain.script([{"match": "FAIL-W", "reply": {"error": {"status": 401, "message": "bad key"}}}])
    dee = chain.agent("dee", "Dee")
    room = chain.dm(dee["id"])
    page.goto(f"{chain.server.url}/agents")
    chain.post(room["id"], "FAIL-W please answer")
    agent = page.locator("#roster li.agent", has_text="@dee")
    agent.locator(".status-error").wait_for(timeout=LIVE_TIMEOUT_MS)  # live, no reload
    assert "not_logged_in" in agent.locator(".reason").inner_text()
    shoot(page, shots, "agents-error")
    page.goto(f"{chain.server.url}/agents/{dee['id']}")
    assert "not_logged_in" in page.locator("#agent-status .reason").inner_text()


def test_hostile_text_shows_as_text_and_runs_nothing(page: Any, chain: Chain) -> None:
    chain.script(
        [
            {
                "role": "user",
                "match": having("HOSTILE-W"),
                "reply": {
                    "bash": f"cat <<'EOF'\n{HOSTILE}\nEOF\n"
                    + heredoc("{{room}}", "echo " + HOSTILE)
                },
            }
        ]
    )
    eve = chain.agent("eve", '<img src=x onerror="window.__pwned = 3">Eve')
    room = chain.dm(eve["id"])
    page.goto(f"{chain.server.url}/rooms/{room['id']}")
    page.get_by_label("Message", exact=True).fill("HOSTILE-W " + HOSTILE)
    page.get_by_role("button", name="Send").first.click()
    page.locator("#timeline article.by-agent").wait_for(timeout=LIVE_TIMEOUT_MS)
    bodies = page.locator("#timeline .body").all_inner_texts()
    assert bodies[0] == "HOSTILE-W " + HOSTILE
    assert HOSTILE in bodies[1]
    assert page.locator("#timeline img, #timeline script").count() == 0
    page.goto(f"{chain.server.url}/agents")
    assert page.locator("#roster img").count() == 0
    # The tool call that echoed it: input and output are text on the turn page too.
    [turn] = chain.finished_turns(eve["id"], 1)
    page.goto(f"{chain.server.url}/turns/{turn['id']}")
    tool_input = page.locator(".ev-tool_use .tool-input").first.inner_text()
    assert "<script>window.__pwned = 1</script><img src=x onerror=" in tool_input  # as JSON
    assert HOSTILE in page.locator(".ev-tool_use .tool-output").first.inner_text()
    assert page.locator("main img, main script").count() == 0
    assert page.evaluate("() => window.__pwned") is None
    assert page.dialogs == []


def test_a_form_post_without_the_csrf_token_is_refused(page: Any, chain: Chain) -> None:
    fay = chain.agent("fay")
    room = chain.dm(fay["id"])
    page.goto(f"{chain.server.url}/rooms/{room['id']}")
    # The form as the page has it, less its CSRF token, sent the browser's way.
    page.evaluate(
        "() => { const form = document.querySelector('form.composer');"
        " form.removeAttribute('data-composer');"
        " form.querySelector('input[name=csrf]').remove();"
        " form.querySelector('textarea').value = 'forged';"
        " form.submit(); }"
    )
    page.wait_for_load_state()
    assert "did not carry this session's CSRF token" in page.locator("main").inner_text()
    assert all(m["body"] != "forged" for m in chain.messages(room["id"]))


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["360px", "desktop"])
def test_every_page_reads_at_both_widths_and_passes_axe(
    browser: Any, chain: Chain, shots: Path, axe_source: str, viewport: dict[str, int]
) -> None:
    agents = chain.expect_ok(chain.http.get("/api/agents"))
    if not agents:
        chain.agent("gil")
        agents = chain.expect_ok(chain.http.get("/api/agents"))
    agent = agents[0]
    room = chain.dm(agent["id"])
    turns = chain.turns(agent["id"])
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    paths = ["/rooms", f"/rooms/{room['id']}", "/agents", f"/agents/{agent['id']}"]
    paths += ["/tasks", "/computers"] + ([f"/turns/{turns[-1]['id']}"] if turns else [])
    page.goto(f"{chain.server.url}/login")
    found = {"/login": serious_violations(page, axe_source)}
    sign_in(page, chain.server.url, chain.server.user_token)
    width = viewport["width"]
    for path in paths:
        page.goto(f"{chain.server.url}{path}")
        found[path] = serious_violations(page, axe_source)
        # Nothing wider than the screen (the page scrolls down, never sideways).
        assert page.evaluate("() => document.documentElement.scrollWidth") <= width, path
        name = path.strip("/").split("/")[0] + ("-one" if path.count("/") > 1 else "")
        shoot(page, shots, f"{name}-{width}")
    context.close()
    assert {p: v for p, v in found.items() if v} == {}
