"""The bootstrap: the JSON the desktop app writes on the Computer's stdin (computer.md §1),
or the config file of `crew-computer run --config FILE` with the token kept elsewhere.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)

from computer_service.delivery import RETRY_BASE_S, RETRY_WINDOW_S
from crew_common.secret_places import secret_overlap

MAX_BOOTSTRAP_BYTES = 64 * 1024
# Where `crew-computer run --config` finds the token when the config names no token_file.
TOKEN_ENV = "CREW_COMPUTER_TOKEN"


class BootstrapError(Exception):
    """The bootstrap line is missing or invalid; the message is safe to print (no token)."""


class TurnLimits(BaseModel):
    """What one turn's sandbox may use (the launcher's --max-processes, --memory-mb, --shm-mb,
    --disk-mb: the agent's directories together, watched, not a filesystem quota;
    --max-connections).

    `memory_mb` holds only where the launcher gets a cgroup (README, "Resource limits").
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_processes: Annotated[int, Strict()] = Field(default=4096, ge=64, le=1_000_000)
    memory_mb: Annotated[int, Strict()] = Field(default=4096, ge=256, le=16 * 1024 * 1024)
    shm_mb: Annotated[int, Strict()] = Field(default=64, ge=1, le=1024 * 1024)
    disk_mb: Annotated[int, Strict()] = Field(default=10 * 1024, ge=1, le=1024 * 1024 * 1024)
    # TCP connections one sandbox holds at a time (Linux; past it a connect is refused).
    max_connections: Annotated[int, Strict()] = Field(default=256, ge=8, le=65536)

    def launcher_args(self) -> list[str]:
        """The launcher's command-line flags for these limits."""
        return [
            "--max-processes",
            str(self.max_processes),
            "--memory-mb",
            str(self.memory_mb),
            "--shm-mb",
            str(self.shm_mb),
            "--disk-mb",
            str(self.disk_mb),
            "--max-connections",
            str(self.max_connections),
        ]


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
    # Linux: host-loopback TCP ports every sandbox may reach besides the crew server's
    # and the local models' of the user's OpenCode config (which are forwarded anyway).
    sandbox_loopback_ports: tuple[Annotated[int, Strict(), Field(ge=1, le=65535)], ...] = Field(
        default=(), max_length=16
    )
    # The first wait before a failed turn is tried again (doubling to 5 min). Tests
    # shorten it; an app has no reason to set it.
    retry_base_s: float = Field(default=RETRY_BASE_S, gt=0, le=300)
    # How long a turn's events, ack and finish wait for a crew server that is away before
    # the runner gives up on them (the messages come back at the next wake). Tests shorten it.
    upstream_retry_window_s: float = Field(default=RETRY_WINDOW_S, gt=0, le=600)

    # The warm engine (docs/warm-engine.md): "warm" keeps one `opencode serve` per agent,
    # "cold" runs one `opencode run` per turn. Default: warm where supported (Linux, bwrap).
    engine_mode: Literal["warm", "cold"] | None = None
    # A warm server without a turn for this long is stopped (10 min by default).
    warm_idle_timeout_s: Annotated[int, Strict()] = Field(default=600, ge=1, le=7 * 24 * 3600)
    # The warm servers' resident memory stays under this (MiB; default a quarter of the RAM).
    warm_memory_mb: Annotated[int, Strict()] | None = Field(default=None, ge=64, le=16 * 1024**2)
    # A warm server left over this after a turn is restarted (docs/warm-engine.md).
    warm_server_max_mb: Annotated[int, Strict()] = Field(default=1536, ge=64, le=16 * 1024**2)

    # The model gateway's OAuth token endpoints, by provider, over its built-in table
    # (`computer_service/gateway/oauth.py`). Tests point them at a scripted endpoint.
    gateway_token_endpoints: dict[str, Annotated[str, Field(pattern=r"^https?://")]] = Field(
        default_factory=dict, max_length=16
    )

    # How long one turn may run before it is ended (computer.md §3; 30 min by default).
    turn_time_limit_s: Annotated[int, Strict()] = Field(default=30 * 60, ge=1, le=7 * 24 * 3600)
    # Directories every agent may read (never write), e.g. a repository; never a secret place.
    read_only_roots: list[Path] = Field(default_factory=list, max_length=16)
    # Processes, memory and /dev/shm of one turn (a limit hit ends it: `resource_limit`).
    turn_limits: TurnLimits = TurnLimits()

    @field_validator("token")
    @classmethod
    def _header_safe_token(cls, value: str) -> str:
        # It goes into an Authorization header: a newline or a space there would make
        # the HTTP client refuse it with an error that quotes the token.
        if not all("!" <= char <= "~" for char in value):
            raise ValueError(
                "must be printable ASCII without spaces or control characters "
                "(a newline copied with it? remove it)"
            )
        return value

    @field_validator("server_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _safe_read_only_roots(self) -> Bootstrap:
        home = Path(os.path.realpath(Path.home()))
        crew_home = Path(os.path.realpath(self.resolved_crew_home()))
        for root in self.read_only_roots:
            if not root.is_absolute():
                raise ValueError(f"read_only_roots: {root} is not an absolute path")
            real = Path(os.path.realpath(root))
            if not real.is_dir():
                raise ValueError(f"read_only_roots: {root} is not an existing directory")
            why = secret_overlap(real, home, crew_home)
            if why is not None:
                raise ValueError(
                    f"read_only_roots: {root} can never be readable by agents: {why}. "
                    "Name a directory that holds no credentials (a repository, say)"
                )
        return self

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
    return _validated(raw)


def load_config(path: Path, environ: Mapping[str, str]) -> Bootstrap:
    """The bootstrap of `crew-computer run --config FILE`; raise `BootstrapError` (token-free).

    The file holds the bootstrap's fields as one JSON object, except the token:
    that comes from the file named by its `token_file` field, else from
    `$CREW_COMPUTER_TOKEN` — never from the command line, where `ps` shows it.
    Relative paths in it are relative to the file's directory.
    """
    try:
        with path.open("rb") as file:
            text = file.read(MAX_BOOTSTRAP_BYTES + 1)
    except OSError as exc:
        raise BootstrapError(f"cannot read the config {path}: {exc.strerror}") from None
    if len(text) > MAX_BOOTSTRAP_BYTES:
        raise BootstrapError(f"the config {path} is over {MAX_BOOTSTRAP_BYTES} bytes")
    try:
        raw = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise BootstrapError(f"the config {path} is not valid JSON ({exc.msg})") from None
    if not isinstance(raw, dict):
        raise BootstrapError(f"the config {path} must be a JSON object with server_url")
    if "token" in raw:
        raise BootstrapError(
            f"the config {path} must not hold the token: put it in a file (mode 0600) "
            f"named by token_file, or in ${TOKEN_ENV}"
        )
    base = path.parent
    for field in ("crew_home", "opencode_path"):
        if isinstance(raw.get(field), str):
            raw[field] = str(base / Path(raw[field]).expanduser())
    roots = raw.get("read_only_roots")
    if isinstance(roots, list):
        raw["read_only_roots"] = [
            str(base / Path(r).expanduser()) if isinstance(r, str) else r for r in roots
        ]
    token_file = raw.pop("token_file", None)
    if token_file is not None:
        if not isinstance(token_file, str) or not token_file:
            raise BootstrapError(f"the config {path}: token_file must be a path")
        raw["token"] = _read_token_file(base / Path(token_file).expanduser())
    elif environ.get(TOKEN_ENV):
        raw["token"] = environ[TOKEN_ENV]
    else:
        raise BootstrapError(
            f"no token: name a token file in the config {path} (token_file) or set ${TOKEN_ENV}"
        )
    return _validated(raw)


def _read_token_file(path: Path) -> str:
    try:
        with path.open("rb") as file:
            mode = stat.S_IMODE(os.fstat(file.fileno()).st_mode)
            data = file.read(MAX_BOOTSTRAP_BYTES + 1)
    except OSError as exc:
        raise BootstrapError(f"cannot read the token file {path}: {exc.strerror}") from None
    if mode & 0o077:
        # As ssh does with a private key: a token others could read may already be theirs.
        raise BootstrapError(
            f"the token file {path} is accessible by others (mode {mode:04o}): make it "
            f"yours alone with `chmod 600 {path}` (and get a new token from the server if "
            "someone else may have read it), then start again"
        )
    try:
        # The newline an editor or `echo` leaves at the end is not part of the token.
        return data.decode().strip()
    except UnicodeDecodeError:
        raise BootstrapError(f"the token file {path} is not UTF-8 text") from None


def _validated(raw: dict[str, Any]) -> Bootstrap:
    try:
        return Bootstrap.model_validate(raw)
    except ValidationError as exc:
        # Name the fields and the problem, never echo the values (one may be the token).
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'bootstrap'}: {err['msg']}"
            for err in exc.errors(include_input=False, include_url=False)
        )
        raise BootstrapError(f"bootstrap is invalid: {problems}") from None
