"""What the browser tests do with a page: sign in, wait for live content, check
accessibility, take screenshots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crew_harness.scripted_model import ROOM_ID

REPLY_ROOM = rf"Reply with: crew reply (?P<room>{ROOM_ID})"
DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 360, "height": 740}
LIVE_TIMEOUT_MS = 90_000


def having(*patterns: str) -> str:
    """A script regex needing every pattern in the turn input; it names the reply room."""
    return "".join(f"(?=.*{p})" for p in patterns) + rf".*{REPLY_ROOM}"


def heredoc(room: str, body: str) -> str:
    """The agent's `crew reply` with `body` through a quoted heredoc."""
    return f"crew reply {room} <<'EOF'\n{body}\nEOF"


def answer_rules(marker: str, handle: str, body: str) -> list[dict[str, Any]]:
    """Script rules: @handle answers a turn holding `marker` with `body`, and sends it again
    when `crew reply` says it was held (another agent's answer came first)."""
    you = rf"\(@{handle}, you\)"
    return [
        {
            "role": "user",
            "match": having(marker, you),
            "reply": {"bash": heredoc("{{room}}", body)},
        },
        {
            "role": "tool",
            "match": "Not sent: new messages",
            "capture": {
                "room": rf"crew reply ({ROOM_ID})",
                "marker": f"({marker})",
                "me": f"({you})",
            },
            "reply": {"bash": heredoc("{{room}}", body)},
        },
    ]


def sign_in(page: Any, base_url: str, token: str) -> None:
    """Sign in through the form, as a person would."""
    page.goto(f"{base_url}/login")
    page.get_by_label("User token", exact=True).fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/rooms")


def shoot(page: Any, folder: Path, name: str) -> Path:
    """A full-page screenshot into the test run's screenshot folder."""
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def serious_violations(page: Any, axe_source: str) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations on the page as it is now."""
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        # Evaluated through DevTools, so the page's CSP (no inline script) does not apply.
        page.evaluate(axe_source)
    violations: list[dict[str, Any]] = page.evaluate(
        """async () => {
            const result = await axe.run(document, {resultTypes: ["violations"]});
            return result.violations.map(v => ({
                id: v.id, impact: v.impact, help: v.help,
                nodes: v.nodes.slice(0, 3).map(n => n.target.join(" ")),
            }));
        }"""
    )
    return [v for v in violations if v["impact"] in ("serious", "critical")]
