"""An agent's capabilities: its own MCP servers and skills (issue 27).

One definition for the server (which stores them with the agent, refuses a bad
document with a reason, never shows a secret back) and the Computer (which gets
them, secrets in clear, in its agent sync and materialises them into the
agent's OpenCode config and home). Pure.

The document, as the user sends it and the Computer gets it:

    {"mcp_servers": [
        {"type": "local", "name": "notes",
         "command": ["python3", "notes_mcp.py"],
         "environment": {"NOTES_DIR": "notes"},
         "secret_environment": {"NOTES_TOKEN": "s3cret"},
         "enabled": true, "timeout_ms": 5000},
        {"type": "remote", "name": "github",
         "url": "https://api.example.com/mcp",
         "headers": {"X-Org": "acme"},
         "secret_headers": {"Authorization": "Bearer ghp_..."}}],
     "skills": [
        {"name": "release-notes", "description": "How we write release notes",
         "body": "# Release notes\\n...", "files": {"templates/notes.md": "..."}}]}

Rules (every one a refusal with its reason, `CapabilitiesError`):
- unknown fields anywhere are refused (`extra="forbid"`), so is a wrong type;
- names (servers and skills) are `NAME_PATTERN`: lowercase letters, digits and
  single hyphens, not at either end (the Agent Skills rule; OpenCode names an MCP
  tool `<server>_<tool>`, so a server name has no `_`), unique within their list;
- a local server's `command` is an argv list (no shell), 1–64 strings;
- a remote server's `url` is `http://` or `https://` with a host;
- environment names are `[A-Za-z_][A-Za-z0-9_]*`, header names HTTP tokens; a
  name is in the plain or the secret map, never both;
- a skill's `body` plus its `files` is at most `MAX_SKILL_BYTES` (64 KiB, UTF-8);
  file paths are relative (`templates/notes.md`), without `.`/`..`, backslashes or
  a root `SKILL.md` (the Computer writes that one from name, description, body).

Secrets (`secret_environment`, `secret_headers`) are never shown back: `redacted`
replaces each value with `SET` ("(set)"), and a document sent back with "(set)"
keeps the stored value (`with_kept_secrets`). `version` is the sha256 of the
canonical JSON (`canonical`) of the normalised document, secrets included, so a
changed secret is a new version too; it is given to the Computer only.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

NAME_PATTERN = r"^[a-z0-9]+(-[a-z0-9]+)*$"
MAX_SERVER_NAME = 32
MAX_SKILL_NAME = 64
MAX_SERVERS = 16
MAX_SKILLS = 32
MAX_ARGS = 64
MAX_ARG = 4096
MAX_ENTRIES = 64
MAX_VALUE = 8192
MAX_URL = 2048
MAX_DESCRIPTION = 1024
MAX_SKILL_FILES = 32
MAX_SKILL_BYTES = 64 * 1024
MAX_PATH = 200
MAX_TIMEOUT_MS = 600_000
# What a secret's value reads as wherever the user sees it; sent back: "keep it".
SET = "(set)"

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")
PATH_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,99}$")
EMPTY: dict[str, Any] = {"mcp_servers": [], "skills": []}


class CapabilitiesError(ValueError):
    """A capabilities document that cannot be taken; the message says what and why."""


def _no_nul(value: str, what: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{what} contains a NUL character")
    return value


def _check_map(values: dict[str, str], pattern: re.Pattern[str], kind: str) -> dict[str, str]:
    if len(values) > MAX_ENTRIES:
        raise ValueError(f"at most {MAX_ENTRIES} {kind}s")
    for key, value in values.items():
        if not pattern.match(key):
            raise ValueError(f"{key!r} is not a valid {kind} name")
        if len(value) > MAX_VALUE:
            raise ValueError(f"the value of {key} is over {MAX_VALUE} characters")
        if kind == "header" and any(c in value for c in "\r\n\x00"):
            raise ValueError(f"the value of header {key} contains a line break or NUL")
        _no_nul(value, f"the value of {key}")
    return values


class _Strict(BaseModel):
    model_config = ConfigDict(
        strict=True, extra="forbid", json_schema_serialization_defaults_required=True
    )


ServerName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_SERVER_NAME,
        pattern=NAME_PATTERN,
        description="unique among the agent's servers; its tools are `<name>_<tool>` to the "
        "model and in permission rules",
    ),
]


def _integral(value: Any) -> Any:
    """JSON `3.0` is the integer 3 (JSON Schema agrees); strict mode still refuses `true`, `"3"`."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


TimeoutMs = Annotated[
    int,
    Field(
        ge=1,
        le=MAX_TIMEOUT_MS,
        description="how long OpenCode waits for the server (null: OpenCode's default)",
    ),
    BeforeValidator(_integral),
]


class LocalMcpServer(_Strict):
    """An MCP server OpenCode starts as a process inside the agent's sandbox (stdio)."""

    type: Literal["local"]
    name: ServerName
    command: Annotated[list[str], Field(min_length=1, max_length=MAX_ARGS)] = Field(
        description="the argv (no shell): the program, then its arguments"
    )
    environment: dict[str, str] = Field(
        default_factory=dict, description="plain environment variables for the process"
    )
    secret_environment: dict[str, str] = Field(
        default_factory=dict,
        description='environment variables that are secrets: never shown back (`"(set)"`), '
        "never written into the agent's files",
    )
    enabled: bool = True
    timeout_ms: TimeoutMs | None = None

    @field_validator("command")
    @classmethod
    def _command(cls, argv: list[str]) -> list[str]:
        if not argv[0].strip():
            raise ValueError("the program (command[0]) is empty")
        for arg in argv:
            if len(arg) > MAX_ARG:
                raise ValueError(f"an argument is over {MAX_ARG} characters")
            _no_nul(arg, "an argument")
        return argv

    @field_validator("environment", "secret_environment")
    @classmethod
    def _environment(cls, values: dict[str, str]) -> dict[str, str]:
        return _check_map(values, ENV_NAME, "environment variable")

    @model_validator(mode="after")
    def _disjoint(self) -> LocalMcpServer:
        both = sorted(set(self.environment) & set(self.secret_environment))
        if both:
            raise ValueError(f"{', '.join(both)} is in both environment and secret_environment")
        return self


class RemoteMcpServer(_Strict):
    """An MCP server at a URL; the Computer's gateway adds `secret_headers`, so the
    secret never enters the sandbox."""

    type: Literal["remote"]
    name: ServerName
    url: Annotated[str, Field(min_length=1, max_length=MAX_URL)] = Field(
        description="`http://` or `https://` with a host"
    )
    headers: dict[str, str] = Field(default_factory=dict, description="plain HTTP headers")
    secret_headers: dict[str, str] = Field(
        default_factory=dict,
        description='headers that are secrets (e.g. Authorization): never shown back (`"(set)"`)',
    )
    enabled: bool = True
    timeout_ms: TimeoutMs | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError as exc:
            raise ValueError(f"the url cannot be read: {exc}") from exc
        if parts.scheme not in ("http", "https"):
            raise ValueError("the url must start with http:// or https://")
        if not parts.hostname:
            raise ValueError("the url has no host")
        if any(c.isspace() or c == "\x00" for c in url):
            raise ValueError("the url contains whitespace")
        return url

    @field_validator("headers", "secret_headers")
    @classmethod
    def _headers(cls, values: dict[str, str]) -> dict[str, str]:
        return _check_map(values, HEADER_NAME, "header")

    @model_validator(mode="after")
    def _disjoint(self) -> RemoteMcpServer:
        both = sorted({k.lower() for k in self.headers} & {k.lower() for k in self.secret_headers})
        if both:
            raise ValueError(f"{', '.join(both)} is in both headers and secret_headers")
        return self


McpServer = Annotated[LocalMcpServer | RemoteMcpServer, Field(discriminator="type")]


def _skill_path(path: str) -> str:
    if len(path) > MAX_PATH:
        raise ValueError(f"the file path {path[:40]!r}... is over {MAX_PATH} characters")
    parts = path.split("/")
    if path.startswith("/") or "\\" in path or not all(PATH_PART.match(p) for p in parts):
        raise ValueError(
            f"the file path {path!r} must be relative, of parts made of letters, digits, "
            "`.`, `_`, `-` (no `..`, no leading `/` or `.`, no backslash)"
        )
    if path == "SKILL.md":
        raise ValueError("SKILL.md is written from name, description and body; choose another name")
    return path


class Skill(_Strict):
    """Instructions the agent's model can load when a task fits its description."""

    name: Annotated[str, Field(min_length=1, max_length=MAX_SKILL_NAME, pattern=NAME_PATTERN)]
    description: Annotated[str, Field(min_length=1, max_length=MAX_DESCRIPTION)] = Field(
        description="when to use it: the model sees this and decides to load the body"
    )
    body: str = Field(description="Markdown instructions (SKILL.md after its front matter)")
    files: dict[str, str] = Field(
        default_factory=dict,
        description="more files beside SKILL.md, by relative path (`templates/notes.md`)",
    )

    @field_validator("description")
    @classmethod
    def _description(cls, text: str) -> str:
        if not text.strip():
            raise ValueError("the description is blank")
        _no_nul(text, "the description")
        return text

    @field_validator("files")
    @classmethod
    def _files(cls, files: dict[str, str]) -> dict[str, str]:
        if len(files) > MAX_SKILL_FILES:
            raise ValueError(f"at most {MAX_SKILL_FILES} files")
        for path, text in files.items():
            _skill_path(path)
            _no_nul(text, f"the file {path}")
        return files

    @model_validator(mode="after")
    def _size(self) -> Skill:
        _no_nul(self.body, "the body")
        size = len(self.body.encode()) + sum(len(t.encode()) for t in self.files.values())
        if size > MAX_SKILL_BYTES:
            raise ValueError(
                f"the skill is {size} bytes (body and files, UTF-8); at most {MAX_SKILL_BYTES}"
            )
        # A file and a directory of the same name cannot both be written.
        dirs = {"/".join(p.split("/")[:i]) for p in self.files for i in range(1, p.count("/") + 1)}
        clash = sorted(dirs & set(self.files))
        if clash:
            raise ValueError(f"{clash[0]} is both a file and a directory")
        return self


def _unique(names: Iterable[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"two {what} are named {name!r}; names must be unique")
        seen.add(name)


class Capabilities(_Strict):
    """An agent's MCP servers and skills (`crew_common.capabilities`)."""

    mcp_servers: Annotated[list[McpServer], Field(max_length=MAX_SERVERS)] = Field(
        default_factory=list
    )
    skills: Annotated[list[Skill], Field(max_length=MAX_SKILLS)] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names(self) -> Capabilities:
        _unique((s.name for s in self.mcp_servers), "MCP servers")
        _unique((s.name for s in self.skills), "skills")
        return self


def _reason(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors(include_url=False)[:5]:
        # The discriminator's tag (`local`/`remote`) in the location reads as noise.
        loc = ".".join(str(p) for p in err["loc"] if p not in ("local", "remote"))
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "string_pattern_mismatch" and err["loc"][-1] == "name":
            msg = (
                f"{err['input']!r} is not a valid name: lower-case letters and digits, "
                "single hyphens between them (release-notes)"
            )
        problems.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(problems)


def parse(document: Any) -> Capabilities:
    """A document in the user's (or the Computer's) form, checked; None is no capabilities.
    `CapabilitiesError` with every reason (up to five) otherwise."""
    if document is None:
        return Capabilities()
    try:
        return Capabilities.model_validate(document)
    except ValidationError as exc:
        raise CapabilitiesError(f"the capabilities are invalid: {_reason(exc)}") from exc


def normalised(document: Any) -> dict[str, Any]:
    """`parse`d and dumped with every default: the stored and synced form."""
    return parse(document).model_dump(mode="json")


def canonical(document: dict[str, Any]) -> bytes:
    """The canonical JSON of a normalised document: keys sorted, no spaces, UTF-8."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def version(document: dict[str, Any]) -> str:
    """sha256 (hex) of `canonical(document)`: what the Computer compares to re-sync."""
    return hashlib.sha256(canonical(document)).hexdigest()


_SECRET_FIELDS = ("secret_environment", "secret_headers")


def redacted(document: dict[str, Any]) -> dict[str, Any]:
    """The document as the user sees it: every secret value replaced by "(set)"."""
    servers = []
    for server in document.get("mcp_servers", []):
        shown = dict(server)
        for name in _SECRET_FIELDS:
            if name in shown:
                shown[name] = dict.fromkeys(shown[name], SET)
        servers.append(shown)
    return {**document, "mcp_servers": servers}


def with_kept_secrets(sent: Any, stored: dict[str, Any]) -> Any:
    """`sent` (the user's form) with every "(set)" secret replaced by the value stored
    for the same server (by name) and key; `CapabilitiesError` when nothing is stored
    there. Anything that is not a well-formed secret map is left for `parse` to refuse."""
    if not isinstance(sent, dict) or not isinstance(sent.get("mcp_servers"), list):
        return sent
    old = {s["name"]: s for s in stored.get("mcp_servers", [])}
    servers: list[Any] = []
    for server in sent["mcp_servers"]:
        if not isinstance(server, dict):
            servers.append(server)
            continue
        server = dict(server)
        for field in _SECRET_FIELDS:
            secrets = server.get(field)
            if not isinstance(secrets, dict):
                continue
            kept = {}
            for key, value in secrets.items():
                if value == SET:
                    before = old.get(server.get("name"), {}).get(field, {})
                    if key not in before:
                        raise CapabilitiesError(
                            f"the capabilities are invalid: {field} {key} of MCP server "
                            f'{server.get("name")!r} is "(set)" but no value is stored for '
                            "it; send the value"
                        )
                    value = before[key]
                kept[key] = value
            server[field] = kept
        servers.append(server)
    return {**sent, "mcp_servers": servers}
