"""The user's own OpenCode files, read outside the sandbox (computer.md §3).

Where they are (`UserOpenCode`, XDG defaults), the credentials (`read_auth`,
which says how to log in when they are missing; `auth_for_provider` keeps only
the entry a turn's model needs), the `provider` section of `opencode.json` /
`opencode.jsonc` (`read_user_providers`, through the one JSONC reader
`strip_jsonc`) with its `{env:VAR}` and `{file:path}` references resolved here,
outside the sandbox (`resolve_references`), and the secrets to redact from
failure reasons.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from computer_service import safe_fs
from computer_service.safe_fs import UnsafePath

log = logging.getLogger(__name__)

AUTH_LIMIT = 64 * 1024
USER_CONFIG_LIMIT = 1024 * 1024
KEY_FILE_LIMIT = 64 * 1024
# OpenCode's own config substitutions (opencode.ai/docs/config#variables).
_ENV_REF = re.compile(r"\{env:([^}]+)\}")
_FILE_REF = re.compile(r"\{file:([^}]+)\}")
NO_KEY_HINT = (
    "A key in your environment reaches agents only through your OpenCode config: "
    'set the provider\'s "options": {"apiKey": "{env:YOUR_KEY_VARIABLE}"} (or '
    '"{file:~/path/to/key}") in ~/.config/opencode/opencode.json, with the variable set '
    "where the Computer starts; or run `opencode auth login` (outside crew)."
)


# Providers OpenCode 1.18 runs without any login: `opencode` (OpenCode Zen) keeps its free
# models (cost 0) with the key "public" when there is no key (its provider loader;
# `opencode models` lists them and `opencode run` calls them with no auth.json).
KEYLESS_PROVIDERS = frozenset({"opencode"})


class NotLoggedIn(Exception):
    """The user's OpenCode credentials cannot be used; the message says why."""


@dataclass(frozen=True)
class UserOpenCode:
    """Where the user's own OpenCode credentials, config and price table are."""

    auth_file: Path
    config_files: tuple[Path, ...]
    price_table: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> UserOpenCode:
        """Resolve with the XDG defaults (`~/.local/share`, `~/.config`, `~/.cache`)."""
        home = Path(env.get("HOME") or os.path.expanduser("~"))
        data = Path(env.get("XDG_DATA_HOME") or home / ".local" / "share")
        config = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
        cache = Path(env.get("XDG_CACHE_HOME") or home / ".cache")
        return cls(
            auth_file=data / "opencode" / "auth.json",
            config_files=(
                config / "opencode" / "opencode.json",
                config / "opencode" / "opencode.jsonc",
            ),
            price_table=cache / "opencode" / "models.json",
        )


def read_auth(auth_file: Path) -> str:
    """The user's auth.json as text for `OPENCODE_AUTH_CONTENT`; raises `NotLoggedIn`."""
    where = _tilde(auth_file)
    try:
        data = safe_fs.read_trusted_file(auth_file, AUTH_LIMIT)
    except UnsafePath:
        raise NotLoggedIn(
            f"not logged in: {where} is over 64 KiB, which is not an OpenCode credentials file. "
            "Check it, or log in again with `opencode auth login`."
        ) from None
    if data is None:
        raise NotLoggedIn(
            f"not logged in: no OpenCode credentials at {where}, and the model's provider has "
            f"no section in your OpenCode config. {NO_KEY_HINT} Then wake the agent again."
        )
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise NotLoggedIn(
            f"not logged in: {where} is not valid JSON. Log in again with `opencode auth login`."
        ) from None
    if not isinstance(obj, dict):
        raise NotLoggedIn(f"not logged in: {where} is not a JSON object. Log in again.")
    return data.decode("utf-8")


def auth_for_provider(auth_content: str, provider: str) -> str:
    """Only `provider`'s entry of auth.json (`{}` when it has none): a turn gets no other login."""
    try:
        obj = orjson.loads(auth_content)
    except orjson.JSONDecodeError:
        return "{}"
    if not isinstance(obj, dict) or provider not in obj:
        return "{}"
    return orjson.dumps({provider: obj[provider]}).decode()


def resolve_references(
    providers: dict[str, Any], environ: Mapping[str, str], config_dir: Path
) -> dict[str, Any]:
    """`{env:VAR}` and `{file:path}` in every string of the `provider` section, resolved.

    As OpenCode does it: an unset variable is empty; a file path is relative
    to the config's directory (`~/` is the home), its content trimmed. Done
    here because the engine gets none of the Computer's environment and
    cannot read the user's files. A file that cannot be read is empty (logged).
    """
    home = Path(environ.get("HOME") or os.path.expanduser("~"))

    def file_text(match: re.Match[str]) -> str:
        name = match.group(1)
        path = home / name[2:] if name.startswith("~/") else config_dir / name
        try:
            data = safe_fs.read_trusted_file(path, KEY_FILE_LIMIT)
        except UnsafePath as exc:
            log.warning("your OpenCode config names {file:%s}: %s", name, exc)
            return ""
        if data is None:
            log.warning("your OpenCode config names {file:%s}, which does not exist", name)
            return ""
        return data.decode("utf-8", "replace").strip()

    def resolve(value: Any) -> Any:
        if isinstance(value, str):
            value = _ENV_REF.sub(lambda m: environ.get(m.group(1), ""), value)
            return _FILE_REF.sub(file_text, value)
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v) for v in value]
        return value

    resolved: dict[str, Any] = resolve(providers)
    return resolved


_SECRET_KEY_NAME = re.compile(r"key|token|secret|password|authorization", re.IGNORECASE)


def config_secrets(providers: dict[str, Any]) -> list[str]:
    """Values of the provider section that are credentials (`apiKey`, a token header), to redact."""
    found: list[str] = []

    def walk(v: Any, name: str) -> None:
        if isinstance(v, str):
            if len(v) >= 8 and _SECRET_KEY_NAME.search(name):
                found.append(v)
        elif isinstance(v, dict):
            for key, x in v.items():
                walk(x, str(key))
        elif isinstance(v, list):
            for x in v:
                walk(x, name)

    walk(providers, "")
    return found


def auth_secrets(auth_content: str) -> list[str]:
    """String values of the auth file (API keys, OAuth tokens), to redact from reasons."""
    found: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, str) and len(v) >= 8:
            found.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    # The content was validated as JSON when read; a failure here only means no redaction.
    with contextlib.suppress(orjson.JSONDecodeError):
        walk(orjson.loads(auth_content))
    return found


def read_user_providers(
    config_files: tuple[Path, ...], environ: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
    """The `provider` section of the user's opencode.json / .jsonc (first found), or None.

    With `environ`, its `{env:…}` and `{file:…}` references are resolved
    (`resolve_references`). A malformed file is logged and ignored: the turn
    may still work with the built-in providers, and a missing custom provider
    shows up as `model_unavailable` with its own reason.
    """
    for path in config_files:
        try:
            data = safe_fs.read_trusted_file(path, USER_CONFIG_LIMIT)
        except UnsafePath as exc:
            log.warning("ignoring your OpenCode config: %s", exc)
            continue
        if data is None:
            continue
        try:
            obj = orjson.loads(strip_jsonc(data.decode("utf-8")))
        except (orjson.JSONDecodeError, UnicodeDecodeError) as exc:
            log.warning("ignoring %s: not valid JSON(C): %s", path, exc)
            continue
        provider = obj.get("provider") if isinstance(obj, dict) else None
        if not isinstance(provider, dict):
            return None
        return provider if environ is None else resolve_references(provider, environ, path.parent)
    return None


def referenced_variables(config_files: tuple[Path, ...]) -> set[str]:
    """The environment variables the `provider` section names as `{env:VAR}` (its keys)."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            found.update(_ENV_REF.findall(value))
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(read_user_providers(config_files))
    return found


# ---- JSONC ----


def strip_jsonc(text: str) -> str:
    """JSONC → JSON: drop `//` and `/* */` comments and trailing commas, never inside strings.

    One pass: strings are copied whole, comments skipped, and a comma is
    dropped when the next thing after blanks and comments closes an object or
    an array.
    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = _string_end(text, i)
            out.append(text[i:j])
            i = j
        elif (j := _comment_end(text, i)) > i:
            # A block comment may separate two tokens: keep them apart.
            out.append(" " if text[i + 1] == "*" else "")
            i = j
        elif c == "," and _next_significant(text, i + 1) in ("}", "]"):
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _string_end(text: str, i: int) -> int:
    """Index just past the JSON string that starts at `text[i]` (a quote)."""
    n = len(text)
    j = i + 1
    while j < n:
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == '"':
            return j + 1
        j += 1
    return n


def _comment_end(text: str, i: int) -> int:
    """Index just past the comment at `text[i]`, or `i` when none starts there.

    A `//` comment ends before its newline; an unterminated `/*` runs to the end.
    """
    if text.startswith("//", i):
        nl = text.find("\n", i)
        return len(text) if nl < 0 else nl
    if text.startswith("/*", i):
        end = text.find("*/", i + 2)
        return len(text) if end < 0 else end + 2
    return i


def _next_significant(text: str, i: int) -> str:
    """The first character from `i` on that is neither blank nor in a comment ("" at the end)."""
    n = len(text)
    while i < n:
        if text[i] in " \t\r\n":
            i += 1
        elif (j := _comment_end(text, i)) > i:
            i = j
        else:
            return text[i]
    return ""


def _tilde(path: Path) -> str:
    home = os.environ.get("HOME")
    text = str(path)
    if home and text.startswith(home.rstrip("/") + "/"):
        return "~" + text[len(home.rstrip("/")) :]
    return text


# The OpenCode generation this Computer speaks: 2.x moved its whole server API (`/api/*`,
# new events, `/interrupt`), so its turns would all fail.
SUPPORTED_OPENCODE = "1.18.33"
_VERSION = re.compile(r"(\d+)\.(\d+)")


def unsupported_opencode(version: str | None) -> str | None:
    """Why this `opencode --version` cannot run agents here, or None (an unreadable one runs)."""
    found = _VERSION.search(version or "")
    if found is None or int(found.group(1)) < 2:
        return None
    return (
        f"OpenCode {version} is not supported: OpenCode 2 changed its server API, which this "
        f"Computer does not speak yet. Install OpenCode 1.x (npm i -g opencode-ai@"
        f"{SUPPORTED_OPENCODE}) or point opencode_path at one, then restart the Computer."
    )
