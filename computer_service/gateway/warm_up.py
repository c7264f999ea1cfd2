"""The warm-up's model: a twin of the turn's provider that the gateway answers itself (issue 26).

A prewarm's warm-up (`engine.warm_run.warm_up`) sends one real prompt on the fresh
server, so OpenCode boots what only a model call reaches (the prompt loop, the tool
registry, the provider SDK's first use, its stream parser). It must neither reach the
user's provider nor spend tokens. So the engine's config gets a twin provider
(`TWIN_PROVIDER`, `twin_provider`): the same `npm` package as the turn's provider (so
the same SDK and the same dialect), its `baseURL` this agent's gateway port under
`/crew-warm-up`, the turn's model without a price. The gateway answers that path
locally (`answer`) with a canned, minimal stream in the dialect the request's path
names: OpenAI chat completions (`…/chat/completions`), Anthropic messages
(`…/messages`), OpenAI responses (`…/responses`). It is never forwarded and never
counted as usage.

It answers only while the Computer's warm-up is on (`WarmUpGate`: armed for the
warm-up's prompt only); at any other time it refuses (409), like every route it
needs the agent's placeholder, and it answers nothing but the canned text. A tool in
the sandbox that reaches it during a warm-up gets that canned text: no model, no
credential, no cost (harmless, but it is not a model endpoint for anything).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import Receive, Send

from computer_service.gateway.access import GatewayAccess
from computer_service.gateway.body import read_body

log = logging.getLogger(__name__)

TWIN_PROVIDER = "crew-warm-up"
CANNED_TEXT = "ok"
WARM_UP_BODY_LIMIT = 8 * 1024 * 1024
# The SDK packages whose dialect the canned route speaks (by the request's path).
TWIN_NPM = ("@ai-sdk/openai-compatible", "@ai-sdk/anthropic", "@ai-sdk/openai")
# The packages OpenCode 1.18 loads for the built-in providers a twin can copy.
KNOWN_NPM = {"anthropic": "@ai-sdk/anthropic", "openai": "@ai-sdk/openai"}
PATHS = ("chat/completions", "messages", "responses")


@dataclass(frozen=True)
class WarmUpTwin:
    """What a warm-up needs of its turn: the twin's model and the gate that lets it answer."""

    model: str  # "crew-warm-up/<model id>"
    gate: WarmUpGate


class WarmUpGate:
    """Whether an agent's canned route answers now: only while a warm-up is on."""

    def __init__(self) -> None:
        self._on = 0
        self.answered = 0
        self.refused = 0

    @property
    def on(self) -> bool:
        return self._on > 0

    @contextmanager
    def open(self) -> Iterator[None]:
        """The canned route answers within this block (the warm-up's prompt)."""
        self._on += 1
        try:
            yield
        finally:
            self._on -= 1


def twin_provider(
    section: Any, provider: str, model_id: str, access: GatewayAccess
) -> dict[str, Any] | None:
    """The twin's `provider` entry for the engine's config, or None (a package whose
    dialect the canned route does not speak, or not known: the warm-up is the no-model one)."""
    view: dict[str, Any] = section if isinstance(section, dict) else {}
    npm = view.get("npm") or KNOWN_NPM.get(provider)
    if npm not in TWIN_NPM:
        return None
    models = view.get("models")
    entry = models.get(model_id) if isinstance(models, dict) else None
    model: dict[str, Any] = {"name": model_id, "tool_call": True}
    if isinstance(entry, dict):
        # Its shape (tools, limits, reasoning), never its price: a warm-up costs nothing.
        model.update({k: v for k, v in entry.items() if k in ("tool_call", "limit", "reasoning")})
    model.setdefault("limit", {"context": 100000, "output": 4096})
    return {
        TWIN_PROVIDER: {
            "npm": npm,
            "name": "crew warm-up (answered by the Computer)",
            "options": {"baseURL": access.base_url(TWIN_PROVIDER), "apiKey": access.placeholder},
            "models": {model_id: model},
        }
    }


async def answer(
    gate: WarmUpGate, method: str, rest: str, receive: Receive, send: Send, agent_id: str
) -> None:
    """The canned route (module doc): a warm-up's model call answered here."""
    if method != "POST" or rest.strip("/").removeprefix("v1/") not in PATHS:
        await _error(send, 404, "the crew warm-up route answers only a model call")
        return
    if not gate.on:
        gate.refused += 1
        log.warning("gateway: agent %s: a warm-up call outside a warm-up refused", agent_id)
        await _error(send, 409, "the crew warm-up route answers only the Computer's warm-up")
        return
    body = await read_body(receive, WARM_UP_BODY_LIMIT)
    request = _json(body) if body is not None else None
    if not isinstance(request, dict):
        await _error(send, 400, "the crew warm-up route takes a JSON model call")
        return
    gate.answered += 1
    kind = rest.strip("/").removeprefix("v1/")
    model = str(request.get("model") or "crew-warm-up")
    stream = request.get("stream") is True
    if not stream:
        await _send(send, 200, "application/json", orjson.dumps(canned_body(kind, model)))
        return
    events = b"".join(canned_stream(kind, model))
    await _send(send, 200, "text/event-stream", events)


def canned_stream(kind: str, model: str) -> list[bytes]:
    """The SSE of one minimal answer (one text delta, a finish) in `kind`'s dialect."""
    now = int(time.time())
    if kind == "messages":
        msg: dict[str, Any] = {
            "id": "msg_crewwarmup",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [
            _event("message_start", {"type": "message_start", "message": msg}),
            _event(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            ),
            _event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": CANNED_TEXT},
                },
            ),
            _event("content_block_stop", {"type": "content_block_stop", "index": 0}),
            _event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 0},
                },
            ),
            _event("message_stop", {"type": "message_stop"}),
        ]
    if kind == "responses":
        rid, iid = "resp_crewwarmup", "msg_crewwarmup"
        item = {"type": "message", "id": iid, "role": "assistant", "status": "in_progress"}
        done_item = {
            **item,
            "status": "completed",
            "content": [{"type": "output_text", "text": CANNED_TEXT, "annotations": []}],
        }
        response = {"id": rid, "object": "response", "created_at": now, "model": model}
        usage = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        return [
            _data({"type": "response.created", "response": {**response, "status": "in_progress"}}),
            _data({"type": "response.output_item.added", "output_index": 0, "item": item}),
            _data(
                {
                    "type": "response.output_text.delta",
                    "item_id": iid,
                    "output_index": 0,
                    "content_index": 0,
                    "delta": CANNED_TEXT,
                }
            ),
            _data({"type": "response.output_item.done", "output_index": 0, "item": done_item}),
            _data(
                {
                    "type": "response.completed",
                    "response": {**response, "status": "completed", "usage": usage},
                }
            ),
        ]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-crewwarmup",
            "object": "chat.completion.chunk",
            "created": now,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    return [
        _data(chunk({"role": "assistant", "content": CANNED_TEXT})),
        _data(chunk({}, "stop")),
        _data({**chunk({}), "choices": [], "usage": usage}),
        b"data: [DONE]\n\n",
    ]


def canned_body(kind: str, model: str) -> dict[str, Any]:
    """A non-streamed minimal answer in `kind`'s dialect."""
    if kind == "messages":
        return {
            "id": "msg_crewwarmup",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": CANNED_TEXT}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
    if kind == "responses":
        return {
            "id": "resp_crewwarmup",
            "object": "response",
            "status": "completed",
            "model": model,
            "output": [
                {
                    "type": "message",
                    "id": "msg_crewwarmup",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": CANNED_TEXT, "annotations": []}],
                }
            ],
            "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
        }
    return {
        "id": "chatcmpl-crewwarmup",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": CANNED_TEXT},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\n" + _data(data)


def _data(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def _json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


async def _send(send: Send, status: int, content_type: str, body: bytes) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-cache"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _error(send: Send, status: int, message: str) -> None:
    body = orjson.dumps({"error": {"type": "crew_gateway", "message": message}})
    await _send(send, status, "application/json", body)
