"""`scripts/demo --web`: the whole system keeps running with one agent; its sign-in link
(a one-time code, not the user token) opens a signed-in browser, the agent answers
there, and Ctrl+C stops everything."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.opencode_by_hand import OPENCODE
from tests.support.ci import required_in_ci
from tests.web.pages import DESKTOP, LIVE_TIMEOUT_MS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def read_until_link(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """The demo's output up to its sign-in link, and the link (the test's timeout bounds
    the wait; a demo that exits ends it at once)."""
    assert proc.stdout is not None
    seen = ""
    for line in proc.stdout:
        seen += line
        found = re.search(r"(http://127\.0\.0\.1:\d+/login#code=\S+)", line)
        if found:
            return seen, found.group(1)
    raise AssertionError(f"no sign-in link; the demo exited {proc.wait()}:\n{seen}")


def test_the_web_demo_signs_in_from_its_link_and_stops_on_ctrl_c(browser: Any) -> None:
    if not OPENCODE.exists():
        required_in_ci("OpenCode (scripts/setup installs it into tools/opencode)")
    proc = subprocess.Popen(
        [sys.executable, "-m", "crew_harness.demo", "--web"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        said, link = read_until_link(proc)
        assert "@ada" in said
        assert proc.stdout is not None
        said += proc.stdout.readline()  # the line naming the token file
        # The link carries a one-time code, never the user token (browsers keep URLs).
        token_file = re.search(r"with the token in (\S+)\)", said)
        assert token_file, said
        assert Path(token_file.group(1)).read_text().strip() not in link
        context = browser.new_context(viewport=DESKTOP)
        page = context.new_page()
        page.goto(link)
        page.wait_for_url("**/rooms")
        assert "#code" not in page.url
        page.get_by_role("link", name=re.compile("Ada")).first.click()
        page.get_by_label("Message", exact=True).fill("Hello Ada!")
        page.get_by_role("button", name="Send").first.click()
        page.locator("#timeline article.by-agent").first.wait_for(timeout=LIVE_TIMEOUT_MS)
        context.close()
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            # SIGTERM stops the demo cleanly (its server, Computer and model with it);
            # SIGKILL only if it does not, which would leave them running.
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, rest
    assert "Stopping" in rest
