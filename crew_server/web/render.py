"""How the web app's pages are rendered: the Jinja2 templates, their filters, and the
security headers every answer carries.

Everything an agent wrote (message bodies, names, personas, tool input and output)
reaches the page through Jinja2's autoescaping, except through the two filters that emit
markup: `markdown` (message bodies, turn text: markdown.py renders with raw HTML off and
cleans the result with an allow-list sanitizer) and `mentions`, which escapes first and
then wraps `@handle` (which holds no markup characters). The Content-Security-Policy
allows scripts, styles and connections only from this server, and no inline script: even
markup that slipped through would not run.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import orjson
from markupsafe import Markup, escape
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from crew_server.web.markdown import markdown
from crew_server.web.streams import CLIENT_IDS
from crew_server.web.turn_events import shown_event
from crew_server.web.turn_trace import trace_rows

HERE = Path(__file__).parent
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
_MENTION = re.compile(r"@([a-z0-9_-]{1,32})")


def mentions(text: str) -> Markup:
    """The escaped text with each `@handle` marked (the handle pattern holds no markup)."""
    escaped = str(escape(text))
    return Markup(_MENTION.sub(r'<span class="mention">@\1</span>', escaped))


def clock_time(value: str | None) -> str:
    """`2026-12-01T01:02:03.456Z` → `01:02` (the full time goes into `datetime=`)."""
    if not value:
        return ""
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).strftime("%H:%M")
    except ValueError:
        return value


def day_time(value: str | None) -> str:
    """`2026-12-01T01:02:03.456Z` → `2026-12-01 01:02:03` (UTC)."""
    if not value:
        return ""
    return value.replace("T", " ")[:19]


def money(value: float | int | None) -> str:
    """A cost in dollars, short: `$0`, `< $0.0001`, `$0.00014`, `$0.0412`, `$1.25`.

    Below a dollar two significant digits show a cheap turn's cost without six places."""
    dollars = float(value or 0)
    if dollars <= 0:
        return "$0"
    if dollars < 0.0001:
        return "< $0.0001"
    if dollars >= 1:
        return f"${dollars:,.2f}"
    places = max(2, 1 - math.floor(math.log10(dollars)))
    return f"${dollars:.{places}f}"


def duration(seconds: float | int | None) -> str:
    """A span of time as people say it: `45 s`, `2 min 3 s`, `30 min`, `1 h 30 min`,
    `1 day 2 h` (seconds only under an hour)."""
    if seconds is None:
        return ""
    if 0 < float(seconds) < 1:
        return "< 1 s"
    total = max(0, round(float(seconds)))
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    parts = [
        f"{days} day{'s' if days != 1 else ''}" if days else "",
        f"{hours} h" if hours else "",
        f"{minutes} min" if minutes else "",
        f"{secs} s" if secs and not days and not hours else "",
    ]
    return " ".join(p for p in parts if p) or "0 s"


def every(seconds: float | int | None) -> str:
    """A reminder's period: `every 2 h`, `every 30 min`, `every day`."""
    if seconds is not None and round(float(seconds)) == 86_400:
        return "every day"
    return f"every {duration(seconds)}"


def seqs(room: dict[str, Any]) -> str:
    """The messages a turn read in one room (`from_seq..to_seq`): `message 4`, `messages 3–5`."""
    first, last = room["from_seq"], room["to_seq"]
    return f"message {last}" if first == last else f"messages {first}–{last}"


def took(started_at: str | None, finished_at: str | None) -> str:
    """How long a turn ran (finished − started), as `duration` says it; "" while running."""
    if not started_at or not finished_at:
        return ""
    try:
        start = datetime.fromisoformat(started_at.replace("Z", "+00:00"))
        end = datetime.fromisoformat(finished_at.replace("Z", "+00:00"))
    except ValueError:
        return ""
    return duration((end - start).total_seconds())


def pretty(value: object) -> str:
    """A tool's input (or any JSON) indented for reading; text stays as it is."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        markdown=markdown,
        mentions=mentions,
        duration=duration,
        every=every,
        took=took,
        seqs=seqs,
        clock_time=clock_time,
        day_time=day_time,
        money=money,
        pretty=pretty,
        shown_event=shown_event,
        trace_rows=trace_rows,
    )
    env.filters["client_id"] = CLIENT_IDS.of
    return env


templates = Jinja2Templates(env=_environment())


def page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
    """A whole page (or a fragment) rendered from `templates/name`, with the security headers."""
    return templates.TemplateResponse(
        request, name, context, status_code=status, headers=SECURITY_HEADERS
    )


def fragment(name: str, context: dict[str, Any]) -> str:
    """A template rendered to text (for live updates)."""
    return templates.get_template(name).render(context)
