"""What the gateway reads of the usage that passes (issue 23), fed in arbitrary pieces.

The chat-completions stream is the scripted model's, which follows real
OpenCode traffic (tests/samples/opencode/); the Anthropic and OpenAI
responses streams follow the shapes those APIs document.
"""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from computer_service.gateway.usage import RequestUsage, TrafficSnapshot, UsageTap
from crew_harness.scripted_model import Reply, Usage, completion_body, stream_chunks


def sse(*events: dict[str, object], named: bool = False) -> bytes:
    out = b""
    for event in events:
        if named:
            out += b"event: " + str(event["type"]).encode() + b"\n"
        out += b"data: " + orjson.dumps(event) + b"\n\n"
    return out


def tapped(body: bytes, content_type: str, piece: int) -> RequestUsage:
    tap = UsageTap(content_type)
    for at in range(0, len(body), piece):
        tap.feed(body[at : at + piece])
    return tap.close()


CHAT = sse(*stream_chunks(Reply(text="hello there", usage=Usage(prompt_tokens=300)), "c1", 1))
CHAT += b"data: [DONE]\n\n"
RESPONSES = sse(
    {"type": "response.created", "response": {"id": "r1"}},
    {"type": "response.output_text.delta", "delta": "hi"},
    {
        "type": "response.completed",
        "response": {
            "id": "r1",
            "usage": {
                "input_tokens": 40,
                "input_tokens_details": {"cached_tokens": 8},
                "output_tokens": 12,
            },
        },
    },
    named=True,
)
ANTHROPIC = sse(
    {
        "type": "message_start",
        "message": {
            "id": "m1",
            "usage": {
                "input_tokens": 25,
                "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 7,
                "output_tokens": 1,
            },
        },
    },
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 15}},
    {"type": "message_stop"},
    named=True,
)


@pytest.mark.parametrize("piece", [1, 7, 4096])
def test_streams_in_any_pieces(piece: int) -> None:
    assert tapped(CHAT, "text/event-stream", piece) == RequestUsage(300, 20, 10, 0)
    assert tapped(RESPONSES, "text/event-stream; charset=utf-8", piece) == RequestUsage(40, 12, 8)
    assert tapped(ANTHROPIC, "text/event-stream", piece) == RequestUsage(25, 15, 100, 7)


def test_non_streaming_bodies() -> None:
    chat = orjson.dumps(completion_body(Reply(text="ok"), "c1", 1))
    assert tapped(chat, "application/json", 5) == RequestUsage(109, 20, 10)
    anthropic = orjson.dumps({"type": "message", "usage": {"input_tokens": 3, "output_tokens": 4}})
    assert tapped(anthropic, "application/json", 64) == RequestUsage(3, 4)
    google = orjson.dumps({"usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 2}})
    assert tapped(google, "application/json", 64) == RequestUsage(9, 2)


def test_what_is_not_usage_counts_nothing() -> None:
    assert tapped(b"data: {not json\n\ndata: [DONE]\n\n", "text/event-stream", 3) == RequestUsage()
    assert tapped(b"<html>502</html>", "text/html", 4) == RequestUsage()


def test_the_server_keeps_every_count_a_turn_delta_has() -> None:
    # The finish call's `gateway_usage` is what `since` gives; a key the server's model
    # does not know would be dropped without a word (its requests ignore unknown fields).
    from crew_server.models import GatewayUsage

    fields = {f.name: i + 1 for i, f in enumerate(dataclasses.fields(TrafficSnapshot))}
    fields["retry_after_s"] = 7.5
    delta = TrafficSnapshot(**fields).since(TrafficSnapshot())
    assert GatewayUsage.model_validate(delta).model_dump() == delta
