"""A provider login as the gateway holds it: what replaces the placeholder in a request.

`Login.secret()` is the real credential now (an OAuth login refreshes it
first, `oauth.OAuthLogin`); None when the provider needs none (a local model),
in which case the placeholder is removed rather than replaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Login(Protocol):
    """The real credential of one provider of the user's."""

    async def secret(self) -> str | None:
        """The credential to send now; raises `LoginFailed` when there is none to send."""
        ...


class LoginFailed(Exception):
    """The login cannot give a credential now (a refresh refused); the message says why."""


@dataclass(frozen=True)
class KeyLogin:
    """An API key: from auth.json, or the user's config (`{env:}`/`{file:}` resolved)."""

    key: str | None

    async def secret(self) -> str | None:
        return self.key
