"""Who is signed in to the web app: sessions behind an HttpOnly cookie, and CSRF tokens.

The user signs in with the user token (the one `crew-server` printed at first start);
the server answers with a random session id in an HttpOnly, SameSite=Strict cookie
and keeps the session (with its CSRF token) in memory, so a restart signs everyone
out. Every form post must carry the session's CSRF token; the sign-in form carries a
one-time token bound to a short-lived pre-session cookie. Agents share the loopback,
so there is no mode without sign-in.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

SESSION_COOKIE = "crew_session"
SIGN_IN_COOKIE = "crew_sign_in"
SESSION_SECONDS = 12 * 3600
SIGN_IN_SECONDS = 15 * 60


@dataclass(frozen=True)
class Session:
    """A signed-in browser: its CSRF token and when it stops being valid."""

    session_id: str
    csrf: str
    expires_at: float


class Sessions:
    """The signed-in browsers and the pending sign-in forms (in memory)."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._sign_ins: dict[str, float] = {}
        self._lock = threading.Lock()

    def start(self) -> Session:
        """A new session (after the user token was checked)."""
        session = Session(
            secrets.token_urlsafe(32), secrets.token_urlsafe(32), time.monotonic() + SESSION_SECONDS
        )
        with self._lock:
            self._forget_expired()
            self._sessions[session.session_id] = session
        return session

    def of(self, request: Request) -> Session | None:
        """The request's live session, from its cookie; None when signed out."""
        session_id = request.cookies.get(SESSION_COOKIE, "")
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None or session.expires_at < time.monotonic():
            return None
        return session

    def end(self, session: Session) -> None:
        """Sign out: the cookie no longer works, even if a copy of it survives."""
        with self._lock:
            self._sessions.pop(session.session_id, None)

    def new_sign_in(self) -> str:
        """A one-time token for a sign-in form (also set as the pre-session cookie)."""
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._forget_expired()
            self._sign_ins[token] = time.monotonic() + SIGN_IN_SECONDS
        return token

    def use_sign_in(self, form_token: str, cookie_token: str) -> bool:
        """Whether a sign-in post carries a token this server gave out, matching its cookie
        (used once)."""
        if not form_token or not secrets.compare_digest(form_token, cookie_token):
            return False
        with self._lock:
            expires = self._sign_ins.pop(form_token, None)
        return expires is not None and expires >= time.monotonic()

    def _forget_expired(self) -> None:
        now = time.monotonic()
        for key in [k for k, s in self._sessions.items() if s.expires_at < now]:
            del self._sessions[key]
        for key in [k for k, t in self._sign_ins.items() if t < now]:
            del self._sign_ins[key]


def csrf_ok(session: Session, form_token: str) -> bool:
    """Whether a form post carries this session's CSRF token."""
    return bool(form_token) and secrets.compare_digest(form_token, session.csrf)


def set_cookie(response: Response, name: str, value: str, max_age: int) -> None:
    """A cookie scripts cannot read and other sites never send (HttpOnly, SameSite=Strict)."""
    response.set_cookie(name, value, max_age=max_age, path="/", httponly=True, samesite="strict")
