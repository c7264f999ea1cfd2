"""The launcher API's wire shapes, one copy for both ends (launcher.md, docs/contracts.md).

The launcher validates the requests it receives with these models and writes
its answers and run frames with them; the Computer's client builds its
requests and parses the answers and frames with the very same models.
`openapi/launcher.yaml` states them (tests/launcher/test_openapi.py compares
the two).

Requests are strict (`extra="forbid"`): the launcher builds the engine argv
itself from typed fields, never from a free argv, and an unknown field is an
error rather than something silently ignored. Answers and frames ignore
fields they do not know (`_Answer`): a launcher started from newer files
(an upgrade in place while the Computer runs) may add one.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from crew_common.egress import MAX_RULE_LENGTH, MAX_RULES, MODES, EgressError, EgressPolicy
from crew_common.model_id import MODEL_PATTERN

MIB = 1024 * 1024
DEFAULT_STDOUT_LIMIT = 8 * MIB
MAX_STDOUT_LIMIT = 256 * MIB
MAX_STDIN = 16 * MIB
# Linux refuses one environment string over 128 KiB (MAX_ARG_STRLEN) with
# E2BIG: refuse it here with a reason instead.
MAX_ENV_VALUE = 120 * 1024
MAX_ENV_TOTAL = 1 * MIB

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
SESSION_PATTERN = r"^ses_[A-Za-z0-9]{1,100}$"
TITLE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9 ._:-]{0,79}$"

# computer.md §3: exactly these reach the engine; nothing inherited by accident.
ALLOWED_ENV_KEYS = frozenset(
    {
        "PATH",
        "LANG",
        "TMPDIR",
        "TMPPREFIX",
        "HOME",
        "OPENCODE_DISABLE_PROJECT_CONFIG",
        "OPENCODE_AUTH_CONTENT",
        "OPENCODE_CONFIG_CONTENT",
        "OPENCODE_DISABLE_MODELS_FETCH",
        "PWD",
        "CREW_SERVER_URL",
        "CREW_TOKEN_FILE",
        "CREW_TURN_FILE",
    }
)
_XDG_HOME_KEY = re.compile(r"^XDG_[A-Z]+_HOME$")
# `POST /models`: only OpenCode's own variables; the launcher sets the scratch XDG dirs and PWD.
MODELS_ENV_KEYS = frozenset(
    {
        "OPENCODE_DISABLE_PROJECT_CONFIG",
        "OPENCODE_AUTH_CONTENT",
        "OPENCODE_CONFIG_CONTENT",
        "OPENCODE_DISABLE_MODELS_FETCH",
    }
)
MAX_PRICE_TABLE = 32 * MIB
MAX_LOOPBACK_PORTS = 32
Port = Annotated[int, Field(ge=1, le=65535)]


def env_key_allowed(key: str) -> bool:
    """True for the keys computer.md §3 lists (and every `XDG_*_HOME`)."""
    return key in ALLOWED_ENV_KEYS or bool(_XDG_HOME_KEY.match(key))


def check_env(env: dict[str, str], refused: list[str], what: str) -> dict[str, str]:
    """`env` when its values fit an environment; raises `ValueError` naming `refused` keys."""
    if refused:
        raise ValueError(
            f"environment keys not allowed: {', '.join(sorted(refused))[:300]} ({what})"
        )
    total = 0
    for key, value in env.items():
        if "\x00" in value:
            raise ValueError(f"environment value of {key} contains a NUL byte")
        if len(value) > MAX_ENV_VALUE:
            raise ValueError(f"environment value of {key} is over {MAX_ENV_VALUE} characters")
        total += len(key) + len(value)
    if total > MAX_ENV_TOTAL:
        raise ValueError(f"the environment is over {MAX_ENV_TOTAL} characters in total")
    return env


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Answer(BaseModel):
    # Spelled out although it is pydantic's default: the client's tolerance is deliberate.
    model_config = ConfigDict(extra="ignore")


class EngineArgs(_Strict):
    """The typed arguments of `opencode run`; the launcher turns them into argv."""

    session_id: str | None = Field(default=None, pattern=SESSION_PATTERN)
    model: str | None = Field(default=None, pattern=MODEL_PATTERN)
    title: str | None = Field(default=None, pattern=TITLE_PATTERN)
    dir: str | None = Field(default=None, max_length=4096)


class EgressRuleWire(_Strict):
    """One `allow` rule: a host name (`*.` for subdomains) or an address range, and a port."""

    host: str | None = Field(default=None, max_length=MAX_RULE_LENGTH)
    network: str | None = Field(default=None, max_length=MAX_RULE_LENGTH)
    port: Port | None = None  # null: every port


EgressMode = Literal["open", "public", "allow", "none"]
assert get_args(EgressMode) == MODES


class EgressWire(_Strict):
    """Where the sandbox may connect (crew_common.egress `as_wire`); `public` when absent."""

    mode: EgressMode = "public"
    rules: list[EgressRuleWire] = Field(default_factory=list, max_length=MAX_RULES)

    @model_validator(mode="after")
    def _a_policy(self) -> EgressWire:
        for rule in self.rules:
            if (rule.host is None) == (rule.network is None):
                raise ValueError("an egress rule has exactly one of host and network")
        try:
            self.policy()
        except EgressError as exc:
            raise ValueError(str(exc)) from None
        return self

    def policy(self) -> EgressPolicy:
        """The policy, checked as the server checks the user's form (raises `EgressError`)."""
        return EgressPolicy.from_wire(self.model_dump())

    @classmethod
    def of(cls, policy: EgressPolicy) -> EgressWire:
        return cls.model_validate(policy.as_wire())


class RunRequest(_Strict):
    """`POST /runs`: one engine run of one agent (launcher.md, docs/contracts.md)."""

    run_id: str = Field(pattern=ID_PATTERN)
    agent_id: str = Field(pattern=ID_PATTERN)
    agent_dir: str = Field(max_length=4096)
    runtime_dir: str = Field(max_length=4096)
    bin_dir: str = Field(max_length=4096)
    interpreter_dirs: list[str] = Field(default_factory=list, max_length=32)
    model: str | None = Field(default=None, pattern=MODEL_PATTERN)
    session_id: str | None = Field(default=None, pattern=SESSION_PATTERN)
    engine_args: EngineArgs | None = None
    env: dict[str, str] = Field(default_factory=dict)
    stdin: str = Field(default="", max_length=MAX_STDIN)
    stdout_limit: int = Field(default=DEFAULT_STDOUT_LIMIT, ge=1, le=MAX_STDOUT_LIMIT)
    # Linux: host-loopback TCP ports the sandbox reaches at its own 127.0.0.1
    # (the crew server, local models); every other host-loopback port stays out of reach.
    loopback_ports: list[Port] = Field(default_factory=list, max_length=MAX_LOOPBACK_PORTS)
    # Linux: a TCP port inside the sandbox made reachable on the host's 127.0.0.1 at a
    # port the launcher picks (the `started` frame names it). For an engine server.
    publish_port: Port | None = None
    # Linux: where the sandbox may connect (its firewall); absent: `public`.
    egress: EgressWire = Field(default_factory=EgressWire)

    @field_validator("env")
    @classmethod
    def _env_allowed(cls, env: dict[str, str]) -> dict[str, str]:
        refused = [k for k in env if not env_key_allowed(k)]
        return check_env(env, refused, "only the keys of computer.md §3 reach the engine")

    @field_validator("stdin")
    @classmethod
    def _stdin_plain(cls, stdin: str) -> str:
        if "\x00" in stdin:
            raise ValueError("stdin contains a NUL byte")
        return stdin

    @model_validator(mode="after")
    def _one_model(self) -> RunRequest:
        args = self.engine_args or EngineArgs()
        for name in ("model", "session_id"):
            top, inner = getattr(self, name), getattr(args, name)
            if top is not None and inner is not None and top != inner:
                raise ValueError(f"{name} and engine_args.{name} disagree; send one of them")
        if self.effective_model is None:
            raise ValueError("model is required (provider/model), top level or in engine_args")
        return self

    def work_dir_text(self) -> str | None:
        """`engine_args.dir` when given (the launcher defaults it to the agent's `work/`)."""
        return self.engine_args.dir if self.engine_args else None

    @property
    def effective_model(self) -> str | None:
        return self.model or (self.engine_args.model if self.engine_args else None)

    @property
    def effective_session(self) -> str | None:
        return self.session_id or (self.engine_args.session_id if self.engine_args else None)


class ModelsRequest(_Strict):
    """`POST /models`: what `opencode models` needs of the user's OpenCode setup.

    The Computer reads the user's files and sends them; the launcher only
    checks them and runs `opencode models` in scratch directories.
    `price_table` is the user's model catalog (OpenCode's `models.json`).
    """

    env: dict[str, str] = Field(default_factory=dict)
    price_table: str | None = Field(default=None, max_length=MAX_PRICE_TABLE)

    @field_validator("env")
    @classmethod
    def _env_allowed(cls, env: dict[str, str]) -> dict[str, str]:
        refused = [k for k in env if k not in MODELS_ENV_KEYS]
        return check_env(env, refused, "only OpenCode's login and config variables")

    @field_validator("price_table")
    @classmethod
    def _price_table_plain(cls, text: str | None) -> str | None:
        if text is not None and "\x00" in text:
            raise ValueError("price_table contains a NUL byte")
        return text


# The reasons a run (or a warm server) ended at a resource limit (limits.py).
LimitHit = Literal["process_limit", "memory_limit", "shm_full", "disk_limit"]
LIMIT_HITS: tuple[LimitHit, ...] = get_args(LimitHit)
ExitReason = Literal["stopped", "output_too_large", LimitHit]


class StartedFrame(_Answer):
    t: Literal["started"]
    pid: int
    published_port: int | None = None  # the host-loopback port of `publish_port`


class LineFrame(_Answer):
    t: Literal["line"]
    data: str


class LogFrame(_Answer):
    """An OpenCode log line about a model request (`stream`, `stream error`)."""

    t: Literal["log"]
    line: str


class DeniedFrame(_Answer):
    """Connections the sandbox's firewall refused since the last such frame (issue 23).

    One per (address, port, protocol), `count` the refused packets; `name` the
    host name when the sandbox's resolver answered that address. A name the
    resolver refused is one too: `address` empty, `port` 53.
    """

    t: Literal["denied"]
    address: str = Field(max_length=64)
    port: int = Field(ge=0, le=65535)
    protocol: Literal["tcp", "udp"]
    name: str | None = Field(default=None, max_length=300)
    count: int = Field(ge=1)


class ExitFrame(_Answer):
    """The last frame. `code` is the exit status (null when killed by `signal`).

    The launcher writes every field; `signal` and `reason` have defaults for
    the exit frames the Computer's warm engine makes of a server's turn.
    `reason` is one of `ExitReason` (the schema says so), but read as any
    text: a reason a newer launcher adds leaves the run's end to its exit
    status instead of refusing the frame, and with it the run's result.
    """

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    t: Literal["exit"]
    code: int | None
    signal: int | None = None
    stderr_tail: str
    reason: Annotated[str | None, WithJsonSchema(TypeAdapter(ExitReason | None).json_schema())] = (
        None
    )


Frame = StartedFrame | LineFrame | LogFrame | DeniedFrame | ExitFrame


class SandboxHealth(_Answer):
    ok: bool
    backend: Literal["bwrap", "seatbelt"]
    mode: Literal["hybrid", "tmpfs"] | None = None
    reason: str | None = None
    # PATH entries, toolchain roots and read_only_roots refused as secret places, and
    # mounts hidden in every sandbox because their origin cannot be judged (mounts.py).
    not_granted: list[str] = Field(default_factory=list)
    # "namespace": each sandbox has its own network namespace (Linux, pasta);
    # "shared": the host's network, its loopback services included (macOS).
    network: Literal["namespace", "shared"] | None = None


class EngineHealth(_Answer):
    path: str
    version: str | None = None


class Health(_Answer):
    sandbox: SandboxHealth
    engine: EngineHealth | None


class RunInfo(_Answer):
    run_id: str
    agent_id: str
    pid: int | None
    started_at: str
    bytes_out: int


class RunList(_Answer):
    runs: list[RunInfo]


class StopResult(_Answer):
    run_id: str
    stopping: bool


class ModelList(_Answer):
    models: list[str]


class ErrorBody(_Strict):  # the document closes the error shape
    code: str
    message: str


class ErrorResponse(_Strict):
    error: ErrorBody


# ---- warm servers (`opencode serve`, one per agent; docs/warm-engine.md) ----

SERVER_PASSWORD_KEY = "OPENCODE_SERVER_PASSWORD"
MIN_SERVER_PASSWORD = 32


class ServerRequest(_Strict):
    """`POST /servers`: start the agent's warm `opencode serve` under a cold run's policy.

    The same directories and environment rules as `RunRequest`, plus the
    server's own password (`OPENCODE_SERVER_PASSWORD`, required, only here).
    """

    agent_id: str = Field(pattern=ID_PATTERN)
    agent_dir: str = Field(max_length=4096)
    runtime_dir: str = Field(max_length=4096)
    bin_dir: str = Field(max_length=4096)
    interpreter_dirs: list[str] = Field(default_factory=list, max_length=32)
    env: dict[str, str] = Field(default_factory=dict, repr=False)  # holds the server's password
    # Host-loopback ports the server's sandbox reaches, as a run's `loopback_ports`.
    loopback_ports: list[Port] = Field(default_factory=list, max_length=32)
    # As a run's `egress`: the server's sandbox keeps it for its whole life.
    egress: EgressWire = Field(default_factory=EgressWire)

    @field_validator("env")
    @classmethod
    def _env_allowed(cls, env: dict[str, str]) -> dict[str, str]:
        refused = [k for k in env if not env_key_allowed(k) and k != SERVER_PASSWORD_KEY]
        check_env(env, refused, "only the keys of computer.md §3 and the server's password")
        if len(env.get(SERVER_PASSWORD_KEY, "")) < MIN_SERVER_PASSWORD:
            raise ValueError(
                f"{SERVER_PASSWORD_KEY} is required, at least {MIN_SERVER_PASSWORD} characters"
            )
        return env

    def work_dir_text(self) -> str | None:
        """The server's project is always the agent's `work/` (the launcher's default)."""
        return None


class ServerInfo(_Answer):
    """A warm server: its host pid and start time (to recognise the very process) and its port."""

    agent_id: str
    pid: int
    start_time: int  # field 22 of /proc/<pid>/stat: a reused pid has another
    port: Port  # on the host's 127.0.0.1: the Computer connects to it
    started_at: str
    rss_bytes: int | None = None
    # The process holding the host side of `port`: the server itself, or (in its own
    # network namespace) the launcher's pasta that publishes it. Checked before a connection.
    listener_pid: int
    listener_start_time: int


class ServerList(_Answer):
    servers: list[ServerInfo]


class SweepResult(_Answer):
    agent_id: str
    killed: int
    rss_bytes: int | None = None  # the server's, after the sweep


class ServerLimitHit(_Answer):
    """`GET /servers/{agent_id}/limit`: the limit the server's sandbox ran into, if any.

    A hit ends the server (as it ends a cold run); the Computer fails the turn
    `resource_limit` and starts a new server for the next one.
    """

    agent_id: str
    limit_hit: LimitHit | None


class Denials(_Answer):
    """`POST /servers/{agent_id}/denials`: what the server's firewall refused since the last call."""

    agent_id: str
    denials: list[DeniedFrame]


class ServerStopped(_Answer):
    agent_id: str
    exit_code: int | None
