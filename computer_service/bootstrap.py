"""The bootstrap JSON the desktop app writes on the Computer's stdin (computer.md §1)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator

MAX_BOOTSTRAP_BYTES = 64 * 1024


class BootstrapError(Exception):
    """The bootstrap line is missing or invalid; the message is safe to print (no token)."""


class Bootstrap(BaseModel):
    """What the Computer needs to start: where the server is and its credential."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    server_url: str = Field(min_length=1, max_length=2048)
    token: str = Field(min_length=1, max_length=4096, repr=False)
    crew_home: Path | None = None
    # Strict: `"4"` or `true` here is a bug in the app that wrote the line, not a count.
    max_concurrent_turns: Annotated[int, Strict()] | None = Field(default=None, ge=1, le=1024)
    opencode_path: Path | None = None
    sandbox_mode: Literal["hybrid", "tmpfs"] | None = None
    # How long one turn may run before it is ended (computer.md §3; 30 min by default).
    turn_time_limit_s: Annotated[int, Strict()] = Field(default=30 * 60, ge=1, le=7 * 24 * 3600)

    @field_validator("server_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    def resolved_crew_home(self) -> Path:
        """The crew home: the bootstrap's, else `$CREW_HOME`, else `~/.crew`."""
        if self.crew_home is not None:
            return self.crew_home.expanduser().absolute()
        env = os.environ.get("CREW_HOME")
        if env:
            return Path(env).expanduser().absolute()
        return Path.home() / ".crew"

    def turn_capacity(self) -> int:
        """`max_concurrent_turns`, defaulting to the number of CPUs (at least 2)."""
        if self.max_concurrent_turns is not None:
            return self.max_concurrent_turns
        return max(2, os.cpu_count() or 2)


def parse_bootstrap(line: bytes) -> Bootstrap:
    """Parse one line of bootstrap JSON; raise `BootstrapError` with a token-free reason."""
    if not line.strip():
        raise BootstrapError(
            "no bootstrap received: write one line of JSON with server_url and token to stdin"
        )
    if len(line) > MAX_BOOTSTRAP_BYTES:
        raise BootstrapError(
            f"bootstrap line is over {MAX_BOOTSTRAP_BYTES} bytes: send one short line of JSON"
        )
    try:
        raw = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise BootstrapError(
            f"bootstrap is not valid JSON ({exc.msg}): send one line of JSON"
        ) from None
    if not isinstance(raw, dict):
        raise BootstrapError("bootstrap must be a JSON object with server_url and token")
    try:
        return Bootstrap.model_validate(raw)
    except ValidationError as exc:
        # Name the fields and the problem, never echo the values (one may be the token).
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'bootstrap'}: {err['msg']}"
            for err in exc.errors(include_input=False, include_url=False)
        )
        raise BootstrapError(f"bootstrap is invalid: {problems}") from None
