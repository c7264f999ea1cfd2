"""A scripted OpenAI-compatible model server for the e2e tests, the demo and the benchmark.

It answers `POST /v1/chat/completions` the way OpenCode 1.18 expects
(`tests/samples/opencode/`, real OpenCode output, and docs/contracts.md "Scripted
model"): SSE chunks with text, streamed tool
calls, a final chunk with `finish_reason`, then a usage chunk (because OpenCode
sends `stream_options.include_usage`). Non-streaming requests get one JSON body.

What each request gets is decided by a `Script`: an ordered list of rules, the
first rule whose conditions hold answers. Conditions look at the request number
and at the conversation (the last message, the last user message, or all of
it); a rule's regex groups fill `{{name}}` holes in its reply, so a rule can
say "when the prompt says `crew reply <room-id>`, call bash with
`crew reply {{room}} <<'EOF' … EOF`". With no matching rule the model says
`ok` (or `done` right after a tool result). Rules can also answer 401, 429,
500 or hang. Every request is recorded for assertions. `POST /oauth/token` is
a scripted OAuth token endpoint (`ModelState.oauth_refresh`), for the model
gateway's refresh of an OAuth login.

Run it as `python -m crew_harness.scripted_model --port N --script FILE` (or
`--scenario NAME` for a built-in script), or in-process with
`ScriptedModel(script).start()`, which serves from a thread on a free port.

Why Starlette + uvicorn rather than a hand-written asyncio server: both are
already dependencies, uvicorn gives correct HTTP/1.1 keep-alive and chunked
streaming (OpenCode's fetch client relies on both), and it can serve from a
thread on a pre-bound socket, which is what tests need.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal

import orjson
import uvicorn
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from crew_common.tcp_listener import tcp_listener

log = logging.getLogger("crew_harness.scripted_model")

MODEL_NAME = "scripted"
TITLE_MARKER = "title generator"  # OpenCode's hidden title agent's system prompt
ROOM_ID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
# A new message by the user in a turn input (not a thread's root line, not an agent's).
USER_MESSAGE = r"\n- \[#[^\]\n]*\] User \(user\):"
_HOLE = re.compile(r"\{\{(\w+)\}\}")


# ---------------------------------------------------------------------------
# The script: what each request gets
# ---------------------------------------------------------------------------


class ScriptError(ValueError):
    """A script file or document is not valid; the message says where."""


class ToolCall(BaseModel):
    """One tool call the model makes; `arguments` may contain `{{name}}` holes."""

    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class Usage(BaseModel):
    """The usage numbers sent in the final chunk (OpenAI names)."""

    model_config = ConfigDict(extra="forbid")

    prompt_tokens: int = Field(default=109, ge=0)
    completion_tokens: int = Field(default=20, ge=0)
    cached_tokens: int = Field(default=10, ge=0)


class ErrorReply(BaseModel):
    """An HTTP error answer instead of a completion."""

    model_config = ConfigDict(extra="forbid")

    status: int = Field(ge=400, le=599)
    message: str = "scripted error"
    retry_after: float | None = None  # seconds, sent as `Retry-After`
    retry_after_ms: int | None = None  # sent as `retry-after-ms` (OpenCode honours it)


class Reply(BaseModel):
    """What the model answers: text and/or tool calls, an error, or a hang.

    `bash` is shorthand for one `bash` tool call with that command.
    `hang: "headers"` never sends a response; `hang: "stream"` sends the first
    chunk and then stalls; both end when the client goes away or the server stops.
    """

    model_config = ConfigDict(extra="forbid")

    text: str | None = None
    reasoning: str | None = None
    bash: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    error: ErrorReply | None = None
    hang: Literal["headers", "stream"] | None = None
    delay_s: float = Field(default=0.0, ge=0.0, le=3600.0)
    usage: Usage = Field(default_factory=Usage)

    def all_tool_calls(self) -> list[ToolCall]:
        calls = list(self.tool_calls)
        if self.bash is not None:
            calls.insert(
                0,
                ToolCall(
                    name="bash",
                    arguments={"command": self.bash, "description": "Run scripted command"},
                ),
            )
        return calls


Where = Literal["last", "user", "any"]


class Rule(BaseModel):
    """When a request gets `reply`. Every given condition must hold.

    - `request`: the request number (1-based, title requests not counted).
    - `role`: the role of the conversation's last message (`user` or `tool`).
    - `match`: a regex searched in the text chosen by `in` (`last` message,
      last `user` message, or `any`: the whole conversation, newest first);
      its named groups become template variables.
    - `capture`: name → regex searched in the whole conversation, newest
      message first; group 1 (or the whole match) becomes that variable. A
      capture that finds nothing makes the rule not apply.
    - `times`: how often this rule may answer in total.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    request: int | None = Field(default=None, ge=1)
    role: Literal["user", "tool", "assistant", "system"] | None = None
    match: str | None = None
    in_: Where = Field(default="last", alias="in")
    capture: dict[str, str] = Field(default_factory=dict)
    times: int | None = Field(default=None, ge=1)
    reply: Reply

    @field_validator("match")
    @classmethod
    def _valid_match(cls, value: str | None) -> str | None:
        if value is not None:
            _compile(value)
        return value

    @field_validator("capture")
    @classmethod
    def _valid_capture(cls, value: dict[str, str]) -> dict[str, str]:
        for pattern in value.values():
            _compile(pattern)
        return value


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern, re.DOTALL)
    except re.error as exc:
        raise ValueError(f"bad regex {pattern!r}: {exc}") from exc


class Script(BaseModel):
    """An ordered list of rules; the first that applies answers."""

    model_config = ConfigDict(extra="forbid")

    rules: list[Rule] = Field(default_factory=list)

    @classmethod
    def parse(cls, data: bytes | str | dict[str, Any]) -> Script:
        """Validate a script document (JSON text or a dict); raise ScriptError with the reason."""
        try:
            if isinstance(data, dict):
                return cls.model_validate(data)
            return cls.model_validate(orjson.loads(data))
        except orjson.JSONDecodeError as exc:
            raise ScriptError(f"the script is not valid JSON: {exc}") from exc
        except ValidationError as exc:
            raise ScriptError(f"the script is not valid: {exc}") from exc

    @classmethod
    def load(cls, path: Path) -> Script:
        """Read and validate a script file."""
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ScriptError(f"cannot read the script {path}: {exc.strerror}") from exc
        return cls.parse(raw)


def crew_reply_command(room_var: str, body: str) -> str:
    """The bash command an agent uses to answer: the body goes through a quoted heredoc."""
    return f"crew reply {{{{{room_var}}}}} <<'EOF'\n{body}\nEOF"


def scenario(name: str) -> Script:
    """A built-in script by name (`crew`: answer every turn with `crew reply`; `ok`)."""
    if name == "ok":
        return Script()
    if name == "crew":
        return Script(
            rules=[
                # A HELD answer from `crew reply`: send again, acknowledging the news.
                Rule(
                    role="tool",
                    match=r"Not sent: new messages arrived",
                    capture={"room": rf"crew reply ({ROOM_ID})"},
                    reply=Reply(
                        bash=crew_reply_command(
                            "room", "Thanks, I have read the new messages too. Done."
                        )
                    ),
                ),
                # Only a room with a message from the user (turn-prompt.md's "User (user):"):
                # the demo's agents answer people, not each other (two in a group would
                # otherwise answer each other forever).
                Rule(
                    role="user",
                    match=rf"{USER_MESSAGE}(?:(?!\nReply with: ).)*\nReply with: crew reply "
                    rf"(?P<room>{ROOM_ID})",
                    reply=Reply(
                        bash="echo 'written by the scripted model' > hello.txt && "
                        + crew_reply_command(
                            "room", "Hello! I wrote hello.txt in my work directory."
                        )
                    ),
                ),
            ]
        )
    raise ScriptError(f"unknown scenario {name!r}; known: crew, ok")


# ---------------------------------------------------------------------------
# Choosing the reply (pure)
# ---------------------------------------------------------------------------


def content_text(content: Any) -> str:
    """The text of a chat message `content`: a string or a list of `{type: text}` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def message_text(message: dict[str, Any]) -> str:
    """A message's text, plus the arguments of any tool calls it made."""
    text = content_text(message.get("content"))
    for call in message.get("tool_calls") or []:
        if isinstance(call, dict):
            fn = call.get("function") or {}
            if isinstance(fn, dict):
                text += "\n" + str(fn.get("arguments", ""))
    return text


def is_title_request(messages: list[dict[str, Any]]) -> bool:
    """OpenCode's hidden title request (sent for new sessions without `--title`)."""
    return any(
        m.get("role") == "system" and TITLE_MARKER in content_text(m.get("content"))
        for m in messages
    )


def _fill(value: Any, variables: dict[str, str]) -> Any:
    if isinstance(value, str):
        return _HOLE.sub(lambda m: variables.get(m.group(1), m.group(0)), value)
    if isinstance(value, dict):
        return {k: _fill(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, variables) for v in value]
    return value


def _rule_variables(
    rule: Rule, number: int, messages: list[dict[str, Any]]
) -> dict[str, str] | None:
    """The rule's variables when it applies to this request, else None."""
    if rule.request is not None and rule.request != number:
        return None
    last = messages[-1] if messages else {}
    if rule.role is not None and last.get("role") != rule.role:
        return None
    newest_first = [message_text(m) for m in reversed(messages)]
    variables: dict[str, str] = {"n": str(number)}
    if rule.match is not None:
        if rule.in_ == "last":
            haystacks = newest_first[:1]
        elif rule.in_ == "user":
            users = [message_text(m) for m in reversed(messages) if m.get("role") == "user"]
            haystacks = users[:1]
        else:
            haystacks = newest_first
        pattern = _compile(rule.match)
        found = next((m for h in haystacks if (m := pattern.search(h))), None)
        if found is None:
            return None
        variables.update({k: v for k, v in found.groupdict().items() if v is not None})
    for name, regex in rule.capture.items():
        pattern = _compile(regex)
        hit = next((m for h in newest_first if (m := pattern.search(h))), None)
        if hit is None:
            return None
        variables[name] = hit.group(1) if pattern.groups else hit.group(0)
    return variables


def default_reply(messages: list[dict[str, Any]]) -> Reply:
    """With no rule: `done` right after a tool result, `ok` otherwise."""
    last_role = messages[-1].get("role") if messages else None
    return Reply(text="done" if last_role == "tool" else "ok")


class Choice(BaseModel):
    """Which rule answered a request (index None: the default) and the filled reply."""

    rule: int | None
    reply: Reply


class Chooser:
    """Applies a script to successive requests, counting requests and rule uses."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests = 0
        self.uses: dict[int, int] = {}

    def choose(self, messages: list[dict[str, Any]]) -> Choice:
        """Count this request and pick its reply."""
        self.requests += 1
        for index, rule in enumerate(self.script.rules):
            if rule.times is not None and self.uses.get(index, 0) >= rule.times:
                continue
            variables = _rule_variables(rule, self.requests, messages)
            if variables is None:
                continue
            self.uses[index] = self.uses.get(index, 0) + 1
            filled = Reply.model_validate(_fill(rule.reply.model_dump(), variables))
            return Choice(rule=index, reply=filled)
        return Choice(rule=None, reply=default_reply(messages))


# ---------------------------------------------------------------------------
# Rendering answers (pure)
# ---------------------------------------------------------------------------


def _pieces(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), size):
        yield text[start : start + size]


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def stream_chunks(reply: Reply, completion_id: str, created: int) -> list[dict[str, Any]]:
    """The SSE `data:` objects of one streamed answer, in order (before `[DONE]`)."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": MODEL_NAME,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    chunks = [chunk({"role": "assistant", "content": ""})]
    if reply.reasoning:
        chunks += [chunk({"reasoning_content": p}) for p in _pieces(reply.reasoning, 24)]
    if reply.text:
        chunks += [chunk({"content": p}) for p in _pieces(reply.text, 24)]
    calls = reply.all_tool_calls()
    for index, call in enumerate(calls):
        call_id = f"call_{completion_id[-6:]}_{index}"
        chunks.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": ""},
                        }
                    ]
                }
            )
        )
        arguments = orjson.dumps(call.arguments).decode()
        chunks += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]})
            for p in _pieces(arguments, 32)
        ]
    chunks.append(chunk({}, "tool_calls" if calls else "stop"))
    chunks.append(
        {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": MODEL_NAME,
            "choices": [],
            "usage": usage_body(reply.usage),
        }
    )
    return chunks


def completion_body(reply: Reply, completion_id: str, created: int) -> dict[str, Any]:
    """The JSON body of a non-streamed answer."""
    calls = reply.all_tool_calls()
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or ""}
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call_{completion_id[-6:]}_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": orjson.dumps(c.arguments).decode()},
            }
            for i, c in enumerate(calls)
        ]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": MODEL_NAME,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
        "usage": usage_body(reply.usage),
    }


def error_response(error: ErrorReply) -> Response:
    """An OpenAI-style error answer with the retry headers the rule asked for."""
    kind = {401: "invalid_request_error", 429: "rate_limit_error"}.get(error.status, "api_error")
    headers: dict[str, str] = {}
    if error.retry_after is not None:
        headers["Retry-After"] = f"{error.retry_after:g}"
    if error.retry_after_ms is not None:
        headers["retry-after-ms"] = str(error.retry_after_ms)
    body = {"error": {"message": error.message, "type": kind, "code": str(error.status)}}
    return Response(
        orjson.dumps(body), status_code=error.status, headers=headers, media_type="application/json"
    )


# ---------------------------------------------------------------------------
# The HTTP app
# ---------------------------------------------------------------------------


class ChatRequest(BaseModel):
    """The part of a chat-completions request we read; the rest is recorded as is."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool = False


class RecordedRequest(BaseModel):
    """One request as the server saw it, for assertions."""

    number: int  # 0 for title requests
    at: float
    kind: Literal["chat", "title"]
    stream: bool
    rule: int | None
    answer: str  # text / tools / error <status> / hang <where>
    authorization: str | None
    session: str | None  # OpenCode's x-session-id header
    body: dict[str, Any]

    def last_text(self) -> str:
        """The text of the request's last message (the turn input or a tool result)."""
        messages = self.body.get("messages") or []
        return message_text(messages[-1]) if messages else ""

    def tool_names(self) -> list[str]:
        """The names of the tools the request offers the model (an MCP tool is `<server>_<tool>`)."""
        tools = self.body.get("tools") or []
        return sorted(str((t.get("function") or {}).get("name")) for t in tools)

    def system_text(self) -> str:
        """The text of the request's system messages (where OpenCode lists the skills)."""
        messages = self.body.get("messages") or []
        return "\n".join(message_text(m) for m in messages if m.get("role") == "system")


class ModelState:
    """The script, the counters and the record, shared by the app and its owner."""

    def __init__(self, script: Script, required_key: str | None = None) -> None:
        self._lock = threading.Lock()
        self._chooser = Chooser(script)
        # When set, a request without `Authorization: Bearer <key>` is refused (401),
        # as a real provider does: tests see whether the key reached the model.
        self.required_key = required_key
        self._requests: list[RecordedRequest] = []
        self.stopping: asyncio.Event | None = None  # created on the serving loop
        # A scripted OAuth token endpoint (`POST /oauth/token`): the refresh token it takes
        # now (None: it refuses every grant), and the grants it was asked for.
        self.oauth_refresh: str | None = None
        self.oauth_grants: list[dict[str, str]] = []

    def set_script(self, script: Script) -> None:
        """Replace the script; request numbering starts again at 1."""
        with self._lock:
            self._chooser = Chooser(script)

    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def clear(self) -> None:
        with self._lock:
            self._requests.clear()

    def decide(
        self, request: Request, chat: ChatRequest, body: dict[str, Any]
    ) -> tuple[RecordedRequest, Reply]:
        """Count and record one request and choose its reply."""
        with self._lock:
            if is_title_request(chat.messages):
                number, rule, reply = 0, None, Reply(text="Scripted title")
                kind: Literal["chat", "title"] = "title"
            else:
                choice = self._chooser.choose(chat.messages)
                number, rule, reply = self._chooser.requests, choice.rule, choice.reply
                kind = "chat"
            record = RecordedRequest(
                number=number,
                at=time.time(),
                kind=kind,
                stream=chat.stream,
                rule=rule,
                answer=_describe(reply),
                authorization=request.headers.get("authorization"),
                session=request.headers.get("x-session-id"),
                body=body,
            )
            self._requests.append(record)
        return record, reply


def _describe(reply: Reply) -> str:
    if reply.error is not None:
        return f"error {reply.error.status}"
    if reply.hang is not None:
        return f"hang {reply.hang}"
    if reply.all_tool_calls():
        return "tools " + ",".join(c.name for c in reply.all_tool_calls())
    return "text"


def _bad_request(message: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "code": "400"}},
        status_code=400,
    )


class HangUntilGone(Response):
    """Never answers: waits until the client disconnects or the server stops."""

    def __init__(self, stopping: asyncio.Event) -> None:
        super().__init__()
        self._stopping = stopping

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def client_gone() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        waiters = [
            asyncio.ensure_future(client_gone()),
            asyncio.ensure_future(self._stopping.wait()),
        ]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        if self._stopping.is_set():
            await Response("the scripted model is stopping", status_code=503)(scope, receive, send)


def build_app(state: ModelState) -> Starlette:
    """The Starlette app answering chat completions from `state`'s script."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.stopping = asyncio.Event()
        yield
        state.stopping.set()

    async def completions(request: Request) -> Response:
        raw = await request.body()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return _bad_request("The request body is not JSON. Send a chat-completions JSON body.")
        if not isinstance(body, dict):
            return _bad_request("The request body must be a JSON object.")
        try:
            chat = ChatRequest.model_validate(body)
        except ValidationError as exc:
            return _bad_request(f"The request is not a chat-completions request: {exc}")
        record, reply = state.decide(request, chat, body)
        if state.required_key is not None and record.authorization != (
            f"Bearer {state.required_key}"
        ):
            message = "Missing or wrong API key: send Authorization: Bearer <your key>."
            return error_response(ErrorReply(status=401, message=message))
        assert state.stopping is not None
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.error is not None:
            return error_response(reply.error)
        if reply.hang == "headers":
            return HangUntilGone(state.stopping)
        completion_id = f"chatcmpl-{record.number:04d}{int(record.at * 1000) % 1000000:06d}"
        created = int(record.at)
        if not chat.stream:
            return Response(
                orjson.dumps(completion_body(reply, completion_id, created)),
                media_type="application/json",
            )
        chunks = stream_chunks(reply, completion_id, created)
        stopping = state.stopping

        async def events() -> AsyncIterator[bytes]:
            if reply.hang == "stream":
                yield b"data: " + orjson.dumps(chunks[0]) + b"\n\n"
                await stopping.wait()
                return
            for item in chunks:
                yield b"data: " + orjson.dumps(item) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache"},
        )

    async def models(request: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "crew"}]}
        )

    async def recorded(request: Request) -> Response:
        rows = [r.model_dump() for r in state.requests()]
        return Response(orjson.dumps(rows), media_type="application/json")

    async def replace_script(request: Request) -> Response:
        try:
            script = Script.parse(await request.body())
        except ScriptError as exc:
            return _bad_request(str(exc))
        state.set_script(script)
        return Response(status_code=204)

    async def oauth_token(request: Request) -> Response:
        # A refresh grant as JSON (Anthropic's) or a form (OpenAI's). The n-th grant gives
        # the access token `scripted-access-<n>` and rotates the refresh token.
        if request.headers.get("content-type", "").startswith("application/json"):
            raw = orjson.loads(await request.body())
            grant = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
        else:
            grant = dict(urllib.parse.parse_qsl((await request.body()).decode()))
        with state._lock:
            state.oauth_grants.append(grant)
            n = len(state.oauth_grants)
            if state.oauth_refresh is None or grant.get("refresh_token") != state.oauth_refresh:
                return JSONResponse({"error": "invalid_grant"}, status_code=400)
            state.oauth_refresh = f"scripted-refresh-{n}"
        return JSONResponse(
            {
                "access_token": f"scripted-access-{n}",
                "refresh_token": f"scripted-refresh-{n}",
                "expires_in": 3600,
            }
        )

    return Starlette(
        routes=[
            Route("/oauth/token", oauth_token, methods=["POST"]),
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/_scripted/requests", recorded, methods=["GET"]),
            Route("/_scripted/script", replace_script, methods=["PUT"]),
        ],
        lifespan=lifespan,
    )


# ---------------------------------------------------------------------------
# Serving: in a thread (tests) or as a process
# ---------------------------------------------------------------------------


class ScriptedModel:
    """The scripted model served from a background thread on 127.0.0.1.

    Use as a context manager, or `start()` / `stop()`. `base_url` is what goes
    in OpenCode's provider `options.baseURL`.
    """

    def __init__(
        self,
        script: Script | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        required_key: str | None = None,
    ):
        self.state = ModelState(script or scenario("crew"), required_key)
        self._host = host
        self._port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (`…/v1`)."""
        return f"{self.url}/v1"

    def set_script(self, script: Script) -> None:
        """Replace the script; request numbering starts again at 1."""
        self.state.set_script(script)

    def requests(self, kind: Literal["chat", "title", "all"] = "chat") -> list[RecordedRequest]:
        """The requests received so far (by default without title requests)."""
        return [r for r in self.state.requests() if kind == "all" or r.kind == kind]

    def clear(self) -> None:
        self.state.clear()

    def start(self) -> ScriptedModel:
        """Bind, serve from a thread, and return once it accepts connections."""
        sock = tcp_listener(self._host, self._port)  # TCP_NODELAY: no 40 ms per answer
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            build_app(self.state),
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        server = self._server
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="scripted-model", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the scripted model did not start; see the log above")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        """Stop serving (hanging requests get 503) and wait for the thread."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = None

    def __enter__(self) -> ScriptedModel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def opencode_provider(base_url: str, api_key: str = "scripted-key") -> dict[str, Any]:
    """The OpenCode `provider` section that points `local/scripted` at this server.

    The model has a price (`cost`, USD per million tokens) so turns cost something.
    """
    return {
        "local": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "Local scripted model",
            "options": {"baseURL": base_url, "apiKey": api_key},
            "models": {
                MODEL_NAME: {
                    "name": "Scripted",
                    "tool_call": True,
                    "cost": {"input": 1, "output": 2, "cache_read": 0.5},
                    "limit": {"context": 100000, "output": 8000},
                }
            },
        }
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m crew_harness.scripted_model --port N (--script FILE | --scenario NAME)`."""
    parser = argparse.ArgumentParser(
        prog="python -m crew_harness.scripted_model",
        description="A scripted OpenAI-compatible chat-completions server (tests, demo, bench).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18080)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--script", type=Path, help="a JSON script file")
    source.add_argument("--scenario", default="crew", help="a built-in script: crew, ok")
    parser.add_argument(
        "--require-key",
        default=None,
        help="refuse (401) requests without Authorization: Bearer <this key>",
    )
    args = parser.parse_args(argv)
    try:
        script = Script.load(args.script) if args.script else scenario(args.scenario)
    except ScriptError as exc:
        print(f"error: {exc}. Fix the script and start again.", file=sys.stderr)
        return 2
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            "error: the scripted model only listens on loopback. Use --host 127.0.0.1.",
            file=sys.stderr,
        )
        return 2
    state = ModelState(script, args.require_key)
    uvicorn.run(
        build_app(state),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=2,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
