"""The scripted model: its rules and wire format, and the real `opencode run` driving it."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import orjson
import pytest

from crew_harness.scripted_model import (
    Chooser,
    Reply,
    Script,
    ScriptedModel,
    ScriptError,
    opencode_provider,
    scenario,
    stream_chunks,
)
from crew_harness.waiting import wait_until
from tests.e2e.opencode_by_hand import OPENCODE, OpenCodeHome, run_opencode, scripted_config
from tests.support.ci import required_in_ci

ROOM = "0b6c4f1e-2a3d-4c5e-8f90-1a2b3c4d5e6f"


def user(text: str) -> dict[str, object]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def tool(text: str) -> dict[str, object]:
    return {"role": "tool", "tool_call_id": "call_1", "content": text}


# ---------------------------------------------------------------- choosing


def test_first_matching_rule_answers_and_fills_holes_from_groups() -> None:
    script = Script.parse(
        {
            "rules": [
                {"match": "NEVER", "reply": {"text": "no"}},
                {
                    "role": "user",
                    "match": r"crew reply (?P<room>[0-9a-f-]{36})",
                    "reply": {"bash": "crew reply {{room}} <<'EOF'\nhi ${HOME} `x`\nEOF"},
                },
            ]
        }
    )
    choice = Chooser(script).choose([user(f"Reply with: crew reply {ROOM}\n")])
    assert choice.rule == 1
    [call] = choice.reply.all_tool_calls()
    assert call.name == "bash"
    # Shell syntax other than {{holes}} is left alone.
    assert call.arguments["command"] == f"crew reply {ROOM} <<'EOF'\nhi ${{HOME}} `x`\nEOF"


def test_default_is_ok_for_a_prompt_and_done_after_a_tool() -> None:
    chooser = Chooser(Script())
    assert chooser.choose([user("hello")]).reply.text == "ok"
    assert chooser.choose([user("hello"), tool("output")]).reply.text == "done"
    assert chooser.requests == 2


def test_request_number_times_and_captures() -> None:
    script = Script.parse(
        {
            "rules": [
                {"request": 2, "reply": {"text": "second"}},
                {"times": 1, "reply": {"error": {"status": 401}}},
                {
                    "role": "tool",
                    "match": "Not sent",
                    "capture": {"room": r"crew reply ([0-9a-f-]{36})"},
                    "reply": {"text": "again in {{room}} at request {{n}}"},
                },
            ]
        }
    )
    chooser = Chooser(script)
    first = chooser.choose([user("x")])
    assert first.reply.error is not None and first.reply.error.status == 401
    assert chooser.choose([user("x")]).reply.text == "second"
    # The 401 rule is used up, the capture finds the room in an earlier message.
    assistant = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"function": {"name": "bash", "arguments": f'{{"command":"crew reply {ROOM}"}}'}}
        ],
    }
    third = chooser.choose([user("x"), assistant, tool("Not sent: new messages arrived")])
    assert third.reply.text == f"again in {ROOM} at request 3"
    # A capture that finds nothing makes the rule not apply.
    assert chooser.choose([user("x"), tool("Not sent")]).rule is None


def test_match_in_user_looks_at_the_last_user_message_only() -> None:
    script = Script.parse({"rules": [{"match": "MARK", "in": "user", "reply": {"text": "seen"}}]})
    chooser = Chooser(script)
    assert chooser.choose([user("MARK"), tool("no")]).reply.text == "seen"
    assert chooser.choose([user("MARK"), user("later")]).rule is None


@pytest.mark.parametrize(
    "document",
    [
        b"not json",
        b'{"rules": [{"reply": {"text": 3}}]}',
        b'{"rules": [{"match": "(", "reply": {}}]}',
        b'{"rules": [{"reply": {"error": {"status": 200}}}]}',
        b'{"rulez": []}',
    ],
)
def test_bad_scripts_are_refused_with_a_reason(document: bytes) -> None:
    with pytest.raises(ScriptError, match="script"):
        Script.parse(document)


def test_unknown_scenario_names_the_known_ones() -> None:
    with pytest.raises(ScriptError, match="crew, ok"):
        scenario("nope")


def test_stream_chunks_carry_text_tools_finish_and_usage() -> None:
    reply = Reply(text="hello there, this is long enough to split", bash="echo hi")
    chunks = stream_chunks(reply, "chatcmpl-1", 1)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == reply.text
    args = "".join(
        tc["function"]["arguments"]
        for c in chunks
        if c["choices"]
        for tc in c["choices"][0]["delta"].get("tool_calls", [])
    )
    assert orjson.loads(args) == {"command": "echo hi", "description": "Run scripted command"}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 10}


# ---------------------------------------------------------------- over HTTP


def test_http_stream_nonstream_errors_and_record() -> None:
    script = Script.parse(
        {
            "rules": [
                {"match": "E401", "reply": {"error": {"status": 401, "message": "bad key"}}},
                {
                    "match": "E429",
                    "reply": {"error": {"status": 429, "retry_after": 1, "retry_after_ms": 20}},
                },
                {"match": "E500", "reply": {"error": {"status": 500}}},
            ]
        }
    )
    with ScriptedModel(script) as model, httpx.Client(base_url=model.base_url, timeout=5) as http:
        body = {"model": "scripted", "messages": [user("hi")], "stream": True}
        with http.stream(
            "POST", "/chat/completions", json=body, headers={"x-session-id": "ses_1"}
        ) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        assert orjson.loads(lines[-3][6:])["choices"][0]["finish_reason"] == "stop"

        plain = http.post("/chat/completions", json={**body, "stream": False})
        assert plain.json()["choices"][0]["message"]["content"] == "ok"

        r401 = http.post("/chat/completions", json={**body, "messages": [user("E401")]})
        assert r401.status_code == 401 and r401.json()["error"]["message"] == "bad key"
        r429 = http.post("/chat/completions", json={**body, "messages": [user("E429")]})
        assert r429.status_code == 429
        assert r429.headers["retry-after"] == "1" and r429.headers["retry-after-ms"] == "20"
        assert (
            http.post("/chat/completions", json={**body, "messages": [user("E500")]}).status_code
            == 500
        )

        bad = http.post("/chat/completions", content=b"{nope")
        assert bad.status_code == 400 and "not JSON" in bad.json()["error"]["message"]
        assert (
            http.post("/chat/completions", json={"model": "m", "messages": []}).status_code == 400
        )

        title = {
            "model": "scripted",
            "messages": [{"role": "system", "content": "You are a title generator."}, user("x")],
        }
        assert (
            http.post("/chat/completions", json=title).json()["choices"][0]["message"]["content"]
            == "Scripted title"
        )

        recorded = model.requests()
        assert [r.answer for r in recorded] == [
            "text",
            "text",
            "error 401",
            "error 429",
            "error 500",
        ]
        assert [r.number for r in recorded] == [1, 2, 3, 4, 5]
        assert recorded[0].session == "ses_1" and recorded[0].stream
        assert [r.kind for r in model.requests("title")] == ["title"]

        # The script can be swapped over HTTP too (a subprocess server in the demo).
        assert (
            http.put(f"{model.url}/_scripted/script", content=b'{"rules": []}').status_code == 204
        )
        assert http.put(f"{model.url}/_scripted/script", content=b"[]").status_code == 400
        assert len(http.get(f"{model.url}/_scripted/requests").json()) == 6


@pytest.mark.timeout(30)
def test_hang_ends_when_the_client_leaves_or_the_server_stops() -> None:
    script = Script.parse({"rules": [{"reply": {"hang": "headers"}}]})
    model = ScriptedModel(script).start()
    try:
        with httpx.Client(base_url=model.base_url) as http, pytest.raises(httpx.ReadTimeout):
            http.post(
                "/chat/completions", json={"model": "m", "messages": [user("x")]}, timeout=0.5
            )
        assert model.requests()[0].answer == "hang headers"
    finally:
        started = time.monotonic()
        model.stop()
    assert time.monotonic() - started < 5


# ---------------------------------------------------------------- the real opencode


def _need_opencode() -> None:
    if not OPENCODE.exists():
        required_in_ci("OpenCode (scripts/setup installs it into tools/opencode)")


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_real_opencode_runs_the_bash_tool_and_reports_tokens_and_cost(tmp_path: Path) -> None:
    _need_opencode()
    script = Script.parse(
        {
            "rules": [
                {
                    "role": "user",
                    "match": r"crew reply (?P<room>[0-9a-f-]{36})",
                    "reply": {"bash": "echo 'for {{room}}' > out.txt && cat out.txt"},
                }
            ]
        }
    )
    home = OpenCodeHome(tmp_path).prepare()
    with ScriptedModel(script) as model:
        config = scripted_config(opencode_provider(model.base_url))
        out = run_opencode(home, config, f"Answer with: crew reply {ROOM}\n")
        requests = model.requests("all")

    assert out.code == 0, out.stderr[-2000:]
    assert (home.work / "out.txt").read_text() == f"for {ROOM}\n"
    types = [e["type"] for e in out.events]
    assert types == ["step_start", "tool_use", "step_finish", "step_start", "text", "step_finish"]
    tool_use = out.events[1]["part"]
    assert tool_use["tool"] == "bash" and tool_use["state"]["status"] == "completed"
    assert tool_use["state"]["output"] == f"for {ROOM}\n"
    finish = out.events[2]["part"]
    assert finish["reason"] == "tool-calls"
    assert finish["tokens"]["input"] == 99 and finish["tokens"]["cache"]["read"] == 10
    # (99 input × 1 + 20 output × 2 + 10 cached × 0.5) per million.
    assert finish["cost"] == pytest.approx(0.000144)
    assert out.events[4]["part"]["text"] == "done"
    # Two model requests, no hidden title request (we pass --title), the key and session sent.
    assert [r.kind for r in requests] == ["chat", "chat"]
    assert requests[0].authorization == "Bearer scripted-key"
    assert requests[0].session == out.events[0]["sessionID"]
    assert requests[0].body["stream_options"] == {"include_usage": True}
    assert requests[1].last_text() == f"for {ROOM}\n"


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_real_opencode_reports_401_without_retry_and_retries_429(tmp_path: Path) -> None:
    _need_opencode()
    script = Script.parse(
        {
            "rules": [
                {
                    "match": "E401",
                    "reply": {"error": {"status": 401, "message": "Incorrect API key"}},
                },
                {"match": "E429", "reply": {"error": {"status": 429, "retry_after_ms": 10}}},
            ]
        }
    )
    home = OpenCodeHome(tmp_path).prepare()
    with ScriptedModel(script) as model:
        config = scripted_config(opencode_provider(model.base_url))
        denied = run_opencode(home, config, "E401")
        assert len(model.requests()) == 1
        limited = run_opencode(home, config, "E429")
        attempts = len(model.requests()) - 1

    assert denied.code == 1
    [error] = [e for e in denied.events if e["type"] == "error"]
    assert error["error"]["data"]["statusCode"] == 401
    assert limited.code == 1
    assert [e["error"]["data"]["statusCode"] for e in limited.events if e["type"] == "error"] == [
        429
    ]
    assert attempts == 6  # OpenCode's own retries, quick thanks to retry-after-ms


@pytest.mark.timeout(30)
def test_stream_hang_sends_the_first_chunk_then_stalls() -> None:
    script = Script.parse({"rules": [{"reply": {"hang": "stream"}}]})
    with ScriptedModel(script) as model, httpx.Client(base_url=model.base_url) as http:
        body = {"model": "m", "messages": [user("x")], "stream": True}
        with http.stream("POST", "/chat/completions", json=body, timeout=1.0) as response:
            lines = response.iter_lines()
            first = next(lines)
            assert (
                orjson.loads(first.removeprefix("data: "))["choices"][0]["delta"]["role"]
                == "assistant"
            )
            with pytest.raises(httpx.ReadTimeout):
                for _ in lines:
                    pass


@pytest.mark.timeout(60)
def test_command_line_serves_a_script_file_and_refuses_a_bad_one(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    bad = tmp_path / "bad.json"
    bad.write_text('{"rules": [{"match": "("}]}')
    refused = subprocess.run(
        [sys.executable, "-m", "crew_harness.scripted_model", "--script", str(bad)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: the script is not valid")

    good = tmp_path / "good.json"
    good.write_text('{"rules": [{"match": "ping", "reply": {"text": "pong"}}]}')
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "crew_harness.scripted_model",
            "--port",
            str(port),
            "--script",
            str(good),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def answered() -> httpx.Response | None:
            try:
                return httpx.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    json={"model": "scripted", "messages": [user("ping")]},
                    timeout=2,
                )
            except httpx.TransportError:
                return None

        answer = wait_until("the scripted model to answer", answered, 20)
        assert answer.json()["choices"][0]["message"]["content"] == "pong"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_without_a_title_opencode_sends_a_hidden_title_request_the_script_never_sees(
    tmp_path: Path,
) -> None:
    _need_opencode()
    script = Script.parse({"rules": [{"request": 1, "reply": {"text": "first answer"}}]})
    home = OpenCodeHome(tmp_path).prepare()
    with ScriptedModel(script) as model:
        config = scripted_config(opencode_provider(model.base_url))
        out = run_opencode(home, config, "hello", title=None)
        titles, chats = model.requests("title"), model.requests("chat")

    assert out.code == 0, out.stderr[-2000:]
    assert [e["part"]["text"] for e in out.events if e["type"] == "text"] == ["first answer"]
    assert len(titles) == 1 and titles[0].answer == "text"
    assert [r.number for r in chats] == [1]
