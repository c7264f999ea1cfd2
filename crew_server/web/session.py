"""Who is signed in to the web app: sessions behind an HttpOnly cookie, and CSRF tokens.

The user signs in with the user token (the one `crew-server` printed at first start);
the server answers with a random session id in an HttpOnly, SameSite=Strict cookie
and keeps the session (with its CSRF token) in memory, so a restart signs everyone
out. Every form post must carry the session's CSRF token. The sign-in form's token is
a signed double submit: the same value in the form and in a short-lived pre-session
cookie, signed with a key of this process, so the server keeps nothing per form (an
anonymous `GET /login` costs no memory). Agents share the loopback, so there is no
mode without sign-in.
"""

from __future__ import annotations

import hashlib
import hmac
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
        self._lock = threading.Lock()
        # Signs the sign-in forms' tokens; a restart makes the open forms stale (as it
        # ends the sessions).
        self._key = secrets.token_bytes(32)

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

    def alive(self, session: Session) -> bool:
        """Whether `session` is still signed in (a live stream asks on each poll)."""
        with self._lock:
            return self._sessions.get(session.session_id) is session and (
                session.expires_at >= time.monotonic()
            )

    def end(self, session: Session) -> None:
        """Sign out: the cookie no longer works, even if a copy of it survives."""
        with self._lock:
            self._sessions.pop(session.session_id, None)

    def new_sign_in(self) -> str:
        """A sign-in form's token (also set as the pre-session cookie): when it was made,
        a nonce, and their signature. Nothing is stored."""
        signed = f"{int(time.monotonic())}.{secrets.token_urlsafe(12)}"
        return f"{signed}.{self._signature(signed)}"

    def use_sign_in(self, form_token: str, cookie_token: str) -> bool:
        """Whether a sign-in post carries a token this server signed less than
        `SIGN_IN_SECONDS` ago, matching its cookie."""
        if not form_token or not same_secret(form_token, cookie_token):
            return False
        signed, _, signature = form_token.rpartition(".")
        made, _, _nonce = signed.partition(".")
        if not (made.isascii() and made.isdigit() and len(made) <= 15):
            return False
        if not same_secret(signature, self._signature(signed)):
            return False
        return 0 <= time.monotonic() - int(made) <= SIGN_IN_SECONDS

    def _signature(self, signed: str) -> str:
        return hmac.new(self._key, signed.encode(), hashlib.sha256).hexdigest()

    def _forget_expired(self) -> None:
        now = time.monotonic()
        for key in [k for k, s in self._sessions.items() if s.expires_at < now]:
            del self._sessions[key]


def same_secret(given: str, expected: str) -> bool:
    """Constant-time equality of two secrets as text; any text is fine (compare_digest
    refuses non-ASCII `str`, which made a non-ASCII token a 500)."""
    return secrets.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )


def csrf_ok(session: Session, form_token: str) -> bool:
    """Whether a form post carries this session's CSRF token."""
    return bool(form_token) and same_secret(form_token, session.csrf)


def set_cookie(response: Response, name: str, value: str, max_age: int) -> None:
    """A cookie scripts cannot read and other sites never send (HttpOnly, SameSite=Strict)."""
    response.set_cookie(name, value, max_age=max_age, path="/", httponly=True, samesite="strict")
