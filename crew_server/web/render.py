"""How the web app's pages are rendered: the Jinja2 templates, their filters, and the
security headers every answer carries.

Everything an agent wrote (message bodies, names, personas, tool input and output)
reaches the page through Jinja2's autoescaping; the only filter that emits markup,
`mentions`, escapes first and then wraps `@handle` (which holds no markup characters).
The Content-Security-Policy allows scripts, styles and connections only from this
server, and no inline script: even markup that slipped through would not run.
"""

from __future__ import annotations

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

from crew_server.web.streams import CLIENT_IDS
from crew_server.web.turn_events import shown_event

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
    """A cost in dollars, precise enough for a cheap turn."""
    return f"${float(value or 0):.6f}"


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
        mentions=mentions,
        clock_time=clock_time,
        day_time=day_time,
        money=money,
        pretty=pretty,
        shown_event=shown_event,
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
