"""The doors of the web app: every page needs a session, every form post its CSRF token.

`page_view` and `form_action` wrap the web app's handlers into Starlette endpoints.
A page without a session redirects to the sign-in form; a form post without a
session is refused (403) before its body is read, one without the session's CSRF
token before anything runs. Only the sign-in form is read without a session, and its
body is capped small (`ANONYMOUS_BODY`).
A refusal of the store (`ApiError`: a taken handle, an unknown model) comes back to
the page it was posted from as a message above its form.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from crew_server.api.http import MAX_BODY, Context
from crew_server.api.stream import PrewarmHints
from crew_server.errors import ApiError, TooLarge
from crew_server.store import Store
from crew_server.web.render import SECURITY_HEADERS, page
from crew_server.web.session import Session, Sessions, csrf_ok
from crew_server.web.streams import BrowserStreams

log = logging.getLogger("crew_server.web")

# The sign-in form (a token, a code, a path) is far smaller: an anonymous client must
# not make the server read and parse a big body.
ANONYMOUS_BODY = 8 * 1024


@dataclass
class Web:
    """What the web app's handlers work with: the API's context and the sessions."""

    ctx: Context
    sessions: Sessions = field(default_factory=Sessions)
    live: BrowserStreams = field(default_factory=BrowserStreams)
    # A room opened or typed in: its agents' Computers warm them (issue 26).
    prewarm: PrewarmHints = field(default_factory=PrewarmHints)
    # One message per session, shown once on the next page (a refused form post).
    flashes: dict[str, str] = field(default_factory=dict)

    @property
    def store(self) -> Store:
        return self.ctx.store

    def hint_room(self, room_id: str) -> list[str]:
        """Ask the Computers of the room's agents to warm them (rate limited; a hint
        that cannot be sent is logged, never the page's failure) → the agents hinted."""
        try:
            return self.prewarm.hint_room(self.store, self.ctx.hub, room_id)
        except Exception:
            log.exception("could not send the prewarm hint of room %s", room_id)
            return []

    def base(self, session: Session, section: str, request: Request) -> dict[str, Any]:
        """What every signed-in page's layout needs."""
        return {
            "csrf": session.csrf,
            "section": section,
            "here": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            "flash": self.flashes.pop(session.session_id, None),
        }


class Form:
    """A posted urlencoded form: the first value of a field, or all of them."""

    def __init__(self, fields: dict[str, list[str]]) -> None:
        self._fields = fields

    def get(self, name: str, default: str = "") -> str:
        values = self._fields.get(name)
        return values[0] if values else default

    def optional(self, name: str) -> str | None:
        """The field stripped, or None when absent or blank."""
        value = self.get(name).strip()
        return value or None

    def all(self, name: str) -> list[str]:
        return list(self._fields.get(name, []))


async def read_form(request: Request, limit: int = MAX_BODY) -> Form:
    """The request's urlencoded form; `TooLarge` (413) over `limit` bytes, declared or
    sent (reading stops there)."""
    too_large = TooLarge(
        f"the form is too large (over {limit // 1024} KiB); reload the page and send it again"
    )
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise too_large
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise too_large
    fields = parse_qs(bytes(raw).decode("utf-8", "replace"), keep_blank_values=True)
    return Form(fields)


def back_to(form: Form, fallback: str) -> str:
    """Where a form returns: its `back` field when it is a path of this site."""
    target = form.get("back")
    if target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return fallback


def see(path: str) -> Response:
    """303: go and GET this page."""
    return RedirectResponse(path, status_code=303, headers=SECURITY_HEADERS)


PageView = Callable[[Web, Request, Session], Awaitable[Response]]
FormAction = Callable[[Web, Request, Session, Form], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


def page_view(web: Web, view: PageView) -> Endpoint:
    """A page: signed-out browsers go to the sign-in form (and come back afterwards)."""

    async def endpoint(request: Request) -> Response:
        session = web.sessions.of(request)
        if session is None:
            here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return see(f"/login?next={quote(here, safe='')}")
        try:
            return await view(web, request, session)
        except ApiError as exc:
            return refusal(request, exc.status, exc.message)

    return endpoint


def form_action(web: Web, action: FormAction, fallback: str = "/rooms") -> Endpoint:
    """A form post: refused without a session or its CSRF token; a store refusal goes
    back to the form's page as a message."""

    async def endpoint(request: Request) -> Response:
        session = web.sessions.of(request)
        if session is None:
            # Before the body is read: an anonymous post costs no parsing.
            return refusal(request, 403, "You are signed out. Sign in again, then repeat this.")
        try:
            form = await read_form(request)
        except TooLarge as exc:
            return refusal(request, exc.status, f"Not sent: {exc.message}.")
        if not csrf_ok(session, form.get("csrf")):
            log.warning("refused a form post to %s without a valid CSRF token", request.url.path)
            return refusal(
                request,
                403,
                "This form was refused: it did not carry this session's CSRF token. "
                "Reload the page and send it again.",
            )
        try:
            return await action(web, request, session, form)
        except ApiError as exc:
            if request.headers.get("x-crew-fetch"):
                return Response(exc.message, status_code=exc.status, headers=SECURITY_HEADERS)
            web.flashes[session.session_id] = exc.message
            return see(back_to(form, fallback))

    return endpoint


def refusal(request: Request, status: int, message: str) -> Response:
    """A page that says what went wrong and what to do."""
    return page(request, "refusal.html", {"status": status, "message": message}, status)
