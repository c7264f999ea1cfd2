"""Bad input through the whole chain: bootstrap garbage, a garbled event stream,
broken engine output and refused `crew` bodies. Clear errors, nothing crashes,
nothing lost.

Also tested elsewhere: the bootstrap parser's table (tests/computer/test_bootstrap.py),
malformed wake payloads (tests/computer/test_service.py), engine line parsing
(tests/computer_unit/test_events.py), `crew`'s local refusals against the server
(tests/shim/test_reply.py), and the schemathesis fuzz of the three OpenAPI
surfaces (tests/server/test_openapi.py, tests/launcher/test_openapi.py,
tests/computer/test_introspection_schema.py).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from crew_harness.waiting import wait_until
from crew_testkit.computer_proc import bootstrap_for, launch, machine
from tests.faults.chain import read_positions, wake_event
from tests.faults.sse_proxy import SSEProxy
from tests.support.computer import need_sandbox, usable
from tests.support.turns import finished

pytestmark = pytest.mark.timeout(120)

SECRET = "computer-token-that-must-not-leak-4711"


def _bootstrap_exit(line: bytes) -> tuple[int, bytes, str]:
    """Run `python -m computer_service` with `line` on stdin (then EOF): status, stdout, stderr."""
    with machine() as m:
        proc = subprocess.Popen(
            [sys.executable, "-m", "computer_service"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=m.env(),
            cwd=m.root,
        )
        # A huge line is refused before it is all read: communicate() copes with the closed pipe.
        out, err = proc.communicate(line, timeout=30)
        return proc.returncode, out, err.decode("utf-8", "replace")


GOOD = f'"server_url": "http://127.0.0.1:9", "token": "{SECRET}"'


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(b"\x00\x01\x02garbage\n", "not valid JSON", id="binary"),
        pytest.param(
            b'{"server_url": "http://x", "tok' + SECRET.encode(), "not valid JSON", id="cut"
        ),
        pytest.param(f"[{GOOD}]\n".encode(), "not valid JSON", id="array-of-pairs"),
        pytest.param(f'["{SECRET}"]\n'.encode(), "must be a JSON object", id="array"),
        pytest.param(f'"{SECRET}"\n'.encode(), "must be a JSON object", id="string"),
        pytest.param(b"null\n", "must be a JSON object", id="null"),
        pytest.param(f'{{"token": "{SECRET}"}}\n'.encode(), "server_url", id="no-server-url"),
        pytest.param(b'{"server_url": "http://127.0.0.1:9"}\n', "token", id="no-token"),
        pytest.param(
            f'{{"server_url": 8765, "token": "{SECRET}"}}\n'.encode(), "server_url", id="url-int"
        ),
        pytest.param(b'{"server_url": "http://x", "token": 4711}\n', "token", id="token-int"),
        pytest.param(
            f'{{"server_url": "http://x", "token": ["{SECRET}"]}}\n'.encode(),
            "token",
            id="token-list",
        ),
        pytest.param(
            f'{{{GOOD}, "max_concurrent_turns": "4"}}\n'.encode(),
            "max_concurrent_turns",
            id="count-string",
        ),
        pytest.param(
            f'{{{GOOD}, "max_concurrent_turns": true}}\n'.encode(),
            "max_concurrent_turns",
            id="count-bool",
        ),
        pytest.param(
            f'{{{GOOD}, "crew_home": {{"path": "/tmp"}}}}\n'.encode(), "crew_home", id="home-obj"
        ),
        pytest.param(
            f'{{{GOOD}, "sandbox_mode": "off"}}\n'.encode(), "sandbox_mode", id="mode-unknown"
        ),
        pytest.param(
            f'{{"server_url": "http://x", "token": "{SECRET}\xff"}}\n'.encode("latin-1"),
            "not valid JSON",
            id="invalid-utf8",
        ),
        pytest.param(
            f'{{"server_url": "http://x", "token": "{SECRET}", "pad": "{"p" * 200_000}"}}\n'.encode(),
            "over",
            id="huge-line",
        ),
        pytest.param(b"x" * 300_000, "over", id="huge-no-newline"),
        # A token httpx would refuse as a header value, quoting it ("Illegal header value").
        pytest.param(
            f'{{"server_url": "http://127.0.0.1:9", "token": "{SECRET}\\nrest"}}\n'.encode(),
            "token: Value error, must be printable ASCII",
            id="token-newline",
        ),
        pytest.param(
            f'{{"server_url": "http://127.0.0.1:9", "token": "{SECRET}\\u0001"}}\n'.encode(),
            "control characters",
            id="token-control",
        ),
        pytest.param(
            f'{{"server_url": "http://127.0.0.1:9", "token": "{SECRET} x"}}\n'.encode(),
            "without spaces",
            id="token-space",
        ),
        pytest.param(
            f'{{"server_url": "http://127.0.0.1:9", "token": "{SECRET}é"}}\n'.encode(),
            "printable ASCII",
            id="token-non-ascii",
        ),
        pytest.param(b"\n", "no bootstrap received", id="empty-line"),
        pytest.param(b"   \t  \n", "no bootstrap received", id="blank-line"),
    ],
)
def test_bootstrap_garbage_exits_1_with_one_line_and_no_token(line: bytes, expected: str) -> None:
    code, out, err = _bootstrap_exit(line)
    assert code == 1, err
    assert out == b""  # no `ready`
    assert err.count("\n") == 1 and err.endswith("\n"), err  # one line: no traceback
    assert err.startswith("crew-computer: ") and expected in err, err
    assert SECRET not in err and "4711" not in err


def test_a_garbled_event_stream_is_logged_and_the_next_good_wake_handled(
    crew_server: Any,
) -> None:
    need_sandbox()
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("sse1", computer_id=comp["computer_id"])
    dm = crew_server.create_room("dm", [agent["id"]])
    proxy = SSEProxy(crew_server.url).start()
    with machine() as m:
        m.log_in()
        c = launch(m, bootstrap_for(proxy.url, comp["token"], m))
        try:
            usable(c)
            wait_until("the event stream", lambda: proxy.streams)
            garbage = [
                b"this line has no colon at all\n\n",
                b"event: wake\ndata: not json\n\n",
                b"event: wake\ndata: [1, 2]\n\n",
                b'event: wake\ndata: {"agent_id": 5}\n\n',
                b"event: wake\ndata: {\xff\xfe broken utf-8\n\n",
                b"event: wake\ndata: " + b"{" * 100_000 + b"\n\n",
                b'event: wake\ndata: {"agent_id": "00000000-0000-0000-0000-000000000000"}\n\n',
                b"event: frobnicate\ndata: {}\n\n",
                b"retry: soon\ndata: {}\n\n",
                b"event: agents\ndata: whatever\n\n",
                b"\xff\xfe\xfd\n\n",
            ]
            for raw in garbage:
                proxy.inject(raw)
            wait_until(
                "the garbage to be logged",
                lambda: (
                    c.stderr().count("ignored a malformed wake event") >= 5
                    and "ignored an unknown event 'frobnicate'" in c.stderr()
                ),
            )
            crew_server.post(dm["id"], "after the garbage")
            proxy.inject(wake_event(agent["id"]))
            [turn] = finished(crew_server, agent["id"], 1)
            assert turn["status"] == "succeeded", turn
            assert len(proxy.streams) == 1  # nothing in there needed a reconnect
            assert c.proc.poll() is None and c.get("/health")["connected"] is True

            # An event id that cannot be sent back as Last-Event-ID, then the stream ends:
            # the Computer reconnects (without it), syncs, and handles what is waiting.
            proxy.inject(b"id: 41\nevent: ping\ndata: {}\n\n")
            proxy.inject("id: caf\u00e9 \u2603\nevent: ping\ndata: {}\n\n".encode())
            crew_server.post(dm["id"], "while the stream was down")
            proxy.close_stream()
            turns = finished(crew_server, agent["id"], 2)
            assert turns[1]["status"] == "succeeded", turns
            assert "while the stream was down" in crew_server.turn(turns[1]["id"])["input"]
            assert len(proxy.streams) == 2
            assert proxy.streams[1].get("last-event-id") in (None, "41"), proxy.streams[1]

            # A good id is sent back on the next reconnect; wakes keep working.
            proxy.inject(b"id: 77\nevent: ping\ndata: {}\n\n")
            proxy.close_stream()
            wait_until("a third stream", lambda: len(proxy.streams) == 3)
            assert proxy.streams[2].get("last-event-id") == "77"
            crew_server.post(dm["id"], "the last one")
            proxy.inject(wake_event(agent["id"]))
            turns = finished(crew_server, agent["id"], 3)
            assert [t["status"] for t in turns] == ["succeeded"] * 3

            # An id the server refuses to resume from (`abc`: 422): the Computer tries
            # once with it, then resumes without it instead of retrying it forever.
            proxy.inject(b"id: abc\nevent: ping\ndata: {}\n\n")
            proxy.close_stream()
            wait_until("the stream resumed", lambda: len(proxy.streams) == 4)
            assert [r.get("last-event-id") for r in proxy.refused] == ["abc"]
            assert "last-event-id" not in proxy.streams[3]
            crew_server.post(dm["id"], "after a refused id")
            proxy.inject(wake_event(agent["id"]))
            turns = finished(crew_server, agent["id"], 4)
            assert [t["status"] for t in turns] == ["succeeded"] * 4
            assert "after a refused id" in crew_server.turn(turns[3]["id"])["input"]
            assert c.proc.poll() is None
        finally:
            code = c.stop()
            proxy.stop()
        assert code == 0, c.stderr()[-3000:]
        assert "Traceback" not in c.stderr(), c.stderr()[-3000:]


def test_garbled_answers_from_the_server_are_logged_and_nothing_is_lost(crew_server: Any) -> None:
    """The server did the work, but its answer arrives as garbage (a broken proxy)."""
    need_sandbox()
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("garbled1", computer_id=comp["computer_id"])
    dm = crew_server.create_room("dm", [agent["id"]])
    proxy = SSEProxy(crew_server.url).start()
    with machine() as m:
        m.log_in()
        c = launch(m, bootstrap_for(proxy.url, comp["token"], m))
        try:
            usable(c)
            wait_until("the event stream", lambda: proxy.streams)
            # The claim's answer is garbage: no turn; the messages stay unread.
            proxy.garble("POST", "/unread")
            first = crew_server.post(dm["id"], "claimed but garbled")
            proxy.inject(wake_event(agent["id"]))
            wait_until(
                "the failed claim logged", lambda: "claiming unread messages failed" in c.stderr()
            )
            assert crew_server.turns(agent["id"]) == []
            assert read_positions(crew_server, agent["id"])[dm["id"]] == (first["seq"], 0)
            proxy.inject(wake_event(agent["id"]))
            [turn] = finished(crew_server, agent["id"], 1)
            assert turn["status"] == "succeeded", turn
            assert "claimed but garbled" in crew_server.turn(turn["id"])["input"]

            # The agent list's answer is garbage: the stream is opened again and synced.
            proxy.garble("GET", "/computer/agents")
            proxy.inject(b"event: agents\ndata: {}\n\n")
            wait_until("a new stream", lambda: len(proxy.streams) == 2)
            second = crew_server.post(dm["id"], "after the garbled list")
            proxy.inject(wake_event(agent["id"]))
            turns = finished(crew_server, agent["id"], 2)
            assert [t["status"] for t in turns] == ["succeeded", "succeeded"]
            assert read_positions(crew_server, agent["id"])[dm["id"]] == (second["seq"],) * 2
            assert proxy.garbled == [
                f"POST /computer/agents/{agent['id']}/unread",
                "GET /computer/agents",
            ]
            assert c.proc.poll() is None
        finally:
            code = c.stop()
            proxy.stop()
        assert code == 0, c.stderr()[-3000:]
        assert "Traceback" not in c.stderr(), c.stderr()[-3000:]


def test_broken_engine_output_is_recorded_and_a_line_over_the_cap_loses_nothing(
    crew_server: Any,
) -> None:
    need_sandbox()
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("lines1", computer_id=comp["computer_id"])
    dm = crew_server.create_room("dm", [agent["id"]])
    with machine() as m:
        m.log_in()
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
        try:
            usable(c)
            crew_server.post(dm["id"], "broken lines:\nFAKE:BADLINES")
            [bad] = finished(crew_server, agent["id"], 1)
            assert bad["status"] == "succeeded", bad
            events = crew_server.turn(bad["id"])["events"]
            others = [e["data"] for e in events if e["type"] == "other"]
            # Each line that is not OpenCode's is followed by the record's note saying so.
            marks = [o for o in others if o["type"] == "unverified_output"]
            assert [m["finding"] for m in marks] == ["a line that is not an OpenCode event"] * 2
            assert others.index(marks[0]) == 1 and others[3] == marks[1], others
            # The launcher's frames carry text: invalid UTF-8 arrives repaired (U+FFFD).
            assert [o for o in others if o["type"] != "unverified_output"] == [
                {"type": "unparsed", "problem": "not JSON", "text": "this is not json"},
                {"type": "unparsed", "problem": "not JSON", "text": "\ufffd\ufffd broken utf-8"},
                {"type": "patch"},
            ], others
            # The text and the finish after the broken lines are there, in order.
            kinds = [e["type"] for e in events]
            assert kinds.index("other") < kinds.index("text") < kinds.index("step_finish")
            assert [e["index"] for e in events] == list(range(len(events)))

            # Invalid UTF-8 inside an event's JSON string: the event is kept, repaired.
            crew_server.post(dm["id"], "broken text:\nFAKE:BADTEXT")
            _, badtext = finished(crew_server, agent["id"], 2)
            assert badtext["status"] == "succeeded", badtext
            texts = [
                e["data"] for e in crew_server.turn(badtext["id"])["events"] if e["type"] == "text"
            ]
            assert texts == [{"text": "caf\ufffd\ufffd ok"}], texts

            # One line of 9 MiB: over the 8 MiB cap. The turn fails, nothing is acked.
            huge = crew_server.post(dm["id"], "one huge line:\nFAKE:ONCE HUGELINE")
            *_, capped = finished(crew_server, agent["id"], 3)
            assert capped["status"] == "failed", capped
            assert capped["failure"]["class"] == "output_too_large", capped
            delivered, read = read_positions(crew_server, agent["id"])[dm["id"]]
            assert (delivered, read) == (huge["seq"], huge["seq"] - 1)
            assert c.proc.poll() is None

            # The runner tries that message again by itself, alone (a content failure
            # narrows the claim to the oldest message); the new one follows in its own turn.
            crew_server.post(dm["id"], "are you still there?")
            *_, again, after = finished(crew_server, agent["id"], 5)
            assert (again["status"], after["status"]) == ("succeeded", "succeeded")
            text = crew_server.turn(again["id"])["input"]
            assert "FAKE:ONCE HUGELINE" in text and "are you still there?" not in text
            assert "are you still there?" in crew_server.turn(after["id"])["input"]
            delivered, read = read_positions(crew_server, agent["id"])[dm["id"]]
            assert read == delivered == huge["seq"] + 1
        finally:
            code = c.stop()
        assert code == 0, c.stderr()[-3000:]
        assert "Traceback" not in c.stderr(), c.stderr()[-3000:]


def test_oversize_and_empty_crew_bodies_from_the_sandbox_post_nothing(crew_server: Any) -> None:
    need_sandbox()
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("bodies1", computer_id=comp["computer_id"])
    dm = crew_server.create_room("dm", [agent["id"]])
    room = dm["id"]
    script = "; ".join(
        [
            f"head -c 20001 /dev/zero | tr '\\0' x | crew reply {room}",
            "echo rc-oversize=$?",
            f"printf '' | crew reply {room}",
            "echo rc-empty=$?",
            f"printf ' \\n\\t\\n' | crew reply {room}",
            "echo rc-blank=$?",
        ]
    )
    with machine() as m:
        m.log_in()
        crew_server.post(room, f"bodies:\nFAKE:RUN {script}")
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
        try:
            usable(c)
            [turn] = finished(crew_server, agent["id"], 1)
            assert turn["status"] == "succeeded", turn
            [tool] = [
                e["data"] for e in crew_server.turn(turn["id"])["events"] if e["type"] == "tool_use"
            ]
            output = tool["output"]
            for case in ("oversize", "empty", "blank"):
                assert f"rc-{case}=1" in output, output
            errors = [line for line in output.splitlines() if line.startswith("error: ")]
            assert len(errors) == 3, output
            assert "20,000" in errors[0] or "20000" in errors[0], errors
            assert all(x["author"]["kind"] == "user" for x in crew_server.messages(room))
        finally:
            code = c.stop()
        assert code == 0, c.stderr()[-3000:]
