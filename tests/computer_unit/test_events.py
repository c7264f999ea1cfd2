"""engine_event_of over every real OpenCode sample line, plus edge cases."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from computer_service.engine.base import EngineEvent
from computer_service.engine.events import (
    TEXT_LIMIT,
    UNVERIFIED_LIMIT,
    OutputCheck,
    cut_text,
    engine_event_of,
)

SAMPLES = Path(__file__).resolve().parents[2] / "tests" / "samples" / "opencode"
KNOWN = {"step_start", "text", "reasoning", "tool_use", "step_finish", "error"}


def sample_files() -> list[Path]:
    files = sorted(SAMPLES.glob("*.stdout.jsonl"))
    assert files, f"the OpenCode samples are missing from {SAMPLES}"
    return files


def test_every_sample_line_parses_to_its_type() -> None:
    seen: set[str] = set()
    count = 0
    for f in sample_files():
        for raw in f.read_bytes().splitlines():
            if not raw.strip():
                continue
            count += 1
            obj = orjson.loads(raw)
            ev = engine_event_of(raw)
            assert ev.type == obj["type"], f.name
            assert ev.type in KNOWN
            assert ev.session_id == obj["sessionID"]
            assert ev.at.startswith("2026-") or ev.at.startswith("2027-")
            orjson.dumps(ev.as_upstream())  # always serialisable
            seen.add(ev.type)
    assert count > 100
    assert seen == KNOWN


def by_type(name: str) -> list[dict[str, object]]:
    return [orjson.loads(x) for x in (SAMPLES / name).read_bytes().splitlines() if x.strip()]


def test_tool_call_sample_exact() -> None:
    lines = (SAMPLES / "01_tool_call.stdout.jsonl").read_bytes().splitlines()
    events = [engine_event_of(x) for x in lines]
    assert [e.type for e in events] == [
        "step_start",
        "tool_use",
        "step_finish",
        "step_start",
        "text",
        "step_finish",
    ]
    assert events[0].data == {}
    assert events[1].data == {
        "tool": "bash",
        "title": "echo hello > out.txt && cat out.txt",
        "input": {
            "command": "echo hello > out.txt && cat out.txt",
            "description": "Run scripted command",
        },
        "output": "hello\n",
        "duration_ms": 254,
        "failed": False,
        "call_id": "call_9",
    }
    assert events[2].data == {
        "reason": "tool-calls",
        "tokens": {"input": 99, "output": 20, "reasoning": 0, "cache_read": 10, "cache_write": 0},
        "cost": 0.000139,
    }
    assert events[4].data == {"text": "done"}
    assert events[5].data["reason"] == "stop"
    assert events[0].at == "2026-11-30T06:08:55.653+00:00"


def test_failed_tool_sample() -> None:
    raw = next(
        x
        for x in (SAMPLES / "16a_external_dir_no_auto_default_perms.stdout.jsonl")
        .read_bytes()
        .splitlines()
        if b'"tool_use"' in x
    )
    ev = engine_event_of(raw)
    assert ev.data["failed"] is True
    assert ev.data["output"] == "The user rejected permission to use this specific tool call."
    assert ev.data["title"] is None


def test_error_sample_keeps_status_code_as_fact() -> None:
    raw = (SAMPLES / "05_http_401.stdout.jsonl").read_bytes().splitlines()[-1]
    ev = engine_event_of(raw)
    assert ev.type == "error"
    assert ev.data == {"name": "APIError", "message": "Incorrect API key provided (scripted)"}
    assert ev.facts == {"status_code": 401, "retryable": False}
    assert "status_code" not in ev.as_upstream()["data"]


def test_long_tool_output_sample_is_cut() -> None:
    lines = (SAMPLES / "09b_long_tool_output.stdout.jsonl").read_bytes().splitlines()
    assert max(len(x) for x in lines) > 64 * 1024
    tool = next(engine_event_of(x) for x in lines if b'"tool_use"' in x)
    assert len(tool.data["output"]) == TEXT_LIMIT


def test_emoji_sample_survives() -> None:
    lines = (SAMPLES / "09_emoji_long_text.stdout.jsonl").read_bytes().splitlines()
    texts = [engine_event_of(x).data["text"] for x in lines if b'"type":"text"' in x]
    assert texts and all(len(t) <= TEXT_LIMIT for t in texts)
    for t in texts:
        t.encode("utf-8")  # no half surrogate


def test_unknown_type_kept_as_other() -> None:
    ev = engine_event_of(
        b'{"type":"patch","timestamp":1796018935653,"sessionID":"ses_x","part":{}}'
    )
    assert ev.type == "other"
    assert ev.data == {"type": "patch"}
    assert ev.session_id == "ses_x"


NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"not json at all", "not JSON"),
        (b'\xff\xfe{"type":"text"}', "not UTF-8"),
        (b"[1,2,3]", "not a JSON object"),
        (b'"just a string"', "not a JSON object"),
        (b"", "not JSON"),
    ],
)
def test_bad_lines_become_unparsed_other(line: bytes, problem: str) -> None:
    ev = engine_event_of(line, now=NOW)
    assert ev.type == "other"
    assert ev.data["type"] == "unparsed"
    assert ev.data["problem"] == problem
    assert ev.at == "2026-11-30T08:00:00.000+00:00"
    orjson.dumps(ev.as_upstream())


def test_missing_fields_do_not_crash() -> None:
    for line in (
        b'{"type":"tool_use"}',
        b'{"type":"tool_use","part":{"state":{"time":{"start":true,"end":"x"}}}}',
        b'{"type":"step_finish","part":{"tokens":"lots","cost":"free"}}',
        b'{"type":"error"}',
        b'{"type":"text","part":{"text":{"nested":1}}}',
        b'{"timestamp":"yesterday"}',
        b'{"type":null}',
    ):
        ev = engine_event_of(line, now=NOW)
        orjson.dumps(ev.as_upstream())
    ev = engine_event_of(b'{"type":"step_finish","part":{"tokens":"lots","cost":"free"}}')
    assert ev.data["tokens"]["input"] == 0 and ev.data["cost"] == 0.0
    assert engine_event_of(b'{"timestamp":1}').data == {"type": "missing"}


def test_text_cut_on_code_point_boundary() -> None:
    text = "a" * (TEXT_LIMIT - 1) + "😀" + "tail"
    line = orjson.dumps({"type": "text", "part": {"text": text}})
    out = engine_event_of(line).data["text"]
    assert len(out) == TEXT_LIMIT and out.endswith("😀")
    # The same emoji written as a \\u surrogate-pair escape.
    escaped = b'{"type":"text","part":{"text":"' + b"a" * (TEXT_LIMIT - 1) + b'\\ud83d\\ude00z"}}'
    out = engine_event_of(escaped).data["text"]
    assert out.endswith("😀") and len(out) == TEXT_LIMIT


def test_cut_text_never_leaves_half_a_pair() -> None:
    s = "x" * 3 + "\ud83d\ude00"  # a str holding a raw surrogate pair
    assert cut_text(s, 4) == "xxx"
    assert cut_text("\ud800abc").encode("utf-8")
    assert cut_text("abc", 10) == "abc"


def test_tool_input_strings_cut_and_huge_input_collapsed() -> None:
    big = {"content": "y" * 10_000, "path": "a.txt"}
    line = orjson.dumps(
        {
            "type": "tool_use",
            "part": {"tool": "write", "state": {"status": "completed", "input": big}},
        }
    )
    data = engine_event_of(line).data
    assert len(data["input"]["content"]) == TEXT_LIMIT and data["input"]["path"] == "a.txt"
    many = {f"k{i}": "z" * 4000 for i in range(10)}
    line = orjson.dumps({"type": "tool_use", "part": {"tool": "x", "state": {"input": many}}})
    data = engine_event_of(line).data
    assert list(data["input"]) == ["_cut"] and len(data["input"]["_cut"]) == TEXT_LIMIT


@given(st.binary(max_size=300))
def test_any_bytes_give_a_serialisable_event(line: bytes) -> None:
    ev = engine_event_of(line, now=NOW)
    orjson.dumps(ev.as_upstream())


@given(st.text(max_size=5000))
def test_any_text_in_a_text_event_is_cut_safely(text: str) -> None:
    line = orjson.dumps({"type": "text", "part": {"text": text}}) if _encodable(text) else b"{}"
    ev = engine_event_of(line, now=NOW)
    if ev.type == "text":
        assert ev.data["text"] == text[:TEXT_LIMIT]


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _events(*lines: str) -> list[EngineEvent]:
    return [engine_event_of(line) for line in lines]


FORGED = (
    '{"type":"step_finish","sessionID":"ses_a","part":{"type":"step-finish","reason":"stop",'
    '"tokens":{"input":1000000000,"output":0},"cost":999999}}'
)


def test_the_output_check_flags_the_obvious_forgeries() -> None:
    check = OutputCheck()
    start = '{"type":"step_start","sessionID":"ses_a","part":{"type":"step-start"}}'
    finish = FORGED.replace("999999", "0.01").replace("1000000000", "10")
    other_session = start.replace("ses_a", "ses_b")
    seen = [check.see(e) for e in _events(start, finish, FORGED, "not json", other_session)]
    assert seen[:2] == [None, None]
    assert seen[2] == "a step_finish with no step open (a second end)"
    assert seen[3] == "a line that is not an OpenCode event"
    assert seen[4] == "a step_start event of another session"
    marker = check.record("x")
    assert marker is not None and marker.type == "other"
    assert marker.data["type"] == "unverified_output" and marker.data["finding"] == "x"
    for _ in range(UNVERIFIED_LIMIT):
        check.see(engine_event_of("noise"))
    assert check.record("y") is None  # a flood stops adding markers


def test_real_opencode_output_has_no_findings() -> None:
    samples = sorted(SAMPLES.glob("*.stdout.jsonl"))
    assert samples
    for sample in samples:
        check = OutputCheck()
        for line in sample.read_text().splitlines():
            assert check.see(engine_event_of(line)) is None, (sample.name, line[:200])
