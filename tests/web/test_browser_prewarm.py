"""Warm before the person asks, in Chromium (issue 26), through the whole chain:
crew-server, the warm Computer, the real OpenCode in bwrap and the scripted model.

A person opens a dm whose agent has no warm server and starts typing: the page's
open sends the `prewarm` hint, the first keystroke posts `…/prewarm` (app.js; 204),
and the Computer starts the agent's server before the message exists. The turn the
message brings finds that server warm (`/metrics`); the reply shows in the timeline.
The send → visible time is measured and printed, not asserted (a shared machine).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from crew_harness.waiting import wait_until
from tests.e2e.chain import Chain
from tests.e2e.test_stop_wake import answer_rules
from tests.web.pages import DESKTOP, LIVE_TIMEOUT_MS, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def counters(chain: Chain) -> dict[str, float]:
    with chain.computer.introspection() as local:
        text = local.get("/metrics").text
    samples = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {name: float(value) for name, value in samples if name.startswith("crew_")}


def engine_of(chain: Chain, agent_id: str) -> dict[str, Any] | None:
    with chain.computer.introspection() as local:
        answer = local.get(f"/agents/{agent_id}")
    return answer.json().get("engine") if answer.status_code == 200 else None


def test_typing_in_a_dm_warms_its_agent_before_the_message(browser: Any, chain: Chain) -> None:
    chain.script(answer_rules("WEB-PREWARM", "Warm and ready."))
    ada = chain.agent("ada-prewarm")
    room = chain.dm(ada["id"])
    wait_until("the Computer to take the agent", lambda: engine_of(chain, ada["id"]), 30)
    assert engine_of(chain, ada["id"])["warm"] is False  # type: ignore[index]
    before = counters(chain)
    warm_key = 'crew_warm_turn_server_total{found="warm"}'
    none_key = 'crew_warm_turn_server_total{found="none"}'

    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    sign_in(page, chain.server.url, chain.server.user_token)
    opened = time.perf_counter()
    page.goto(f"{chain.server.url}/rooms/{room['id']}")
    field = page.locator("form[data-composer] textarea").first
    with page.expect_response(lambda r: r.url.endswith("/prewarm")) as typed:
        field.press_sequentially("WEB-PREWARM are you th", delay=20)
    assert typed.value.status == 204  # the first keystroke's hint (app.js)
    # The person types on; meanwhile the Computer starts the agent's server.
    wait_until(
        "the prewarm's server",
        lambda: (
            counters(chain).get("crew_prewarm_starts_total", 0)
            == before.get("crew_prewarm_starts_total", 0) + 1
        ),
        60,
    )
    ready = time.perf_counter()
    field.press_sequentially("ere?")
    sent = time.perf_counter()
    page.get_by_role("button", name="Send").click()
    reply = page.locator("#timeline article.by-agent").first
    reply.wait_for(timeout=LIVE_TIMEOUT_MS)
    visible = time.perf_counter()
    assert "Warm and ready." in reply.inner_text()
    print(
        f"\nprewarm in Chromium: page open → server warm {ready - opened:.2f} s; "
        f"send → reply visible {visible - sent:.3f} s"
    )
    after = counters(chain)
    assert after[warm_key] == before.get(warm_key, 0) + 1, (before, after)
    assert after.get(none_key, 0) == before.get(none_key, 0), (before, after)
    assert after["crew_prewarm_hints_received_total"] >= 1
    [turn] = chain.finished_turns(ada["id"], 1)
    assert turn["status"] == "succeeded", turn
    context.close()
