"""An agent's way into the gateway: its own port and its own placeholder credential.

The port is the agent's identity (the launcher forwards it into that agent's
sandbox only); the placeholder is what the engine sends where a key would go.
It is random, valid only on that agent's port, and worth nothing elsewhere.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

PLACEHOLDER_PREFIX = "crew-gw-"


@dataclass(frozen=True)
class GatewayAccess:
    """Where one agent's engine reaches the gateway, and the credential it sends there."""

    port: int
    placeholder: str

    def base_url(self, provider: str) -> str:
        """The `options.baseURL` of `provider` in the engine's config."""
        return f"http://127.0.0.1:{self.port}/{provider}"


def new_placeholder() -> str:
    """A fresh placeholder: recognisable in a log, unguessable."""
    return PLACEHOLDER_PREFIX + secrets.token_hex(16)
