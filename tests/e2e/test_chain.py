"""The whole chain, end to end: a user message → crew-server → crew-computer → launcher →
the real `opencode` in bwrap, driven by the scripted model → `crew …` → the server's database.

One Computer serves every test in this module (see `conftest.py`); each test
uses its own agents and rooms and sets the model's script for them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from crew_harness.scripted_model import ROOM_ID, message_text
from crew_harness.waiting import wait_until
from tests.e2e.chain import Chain

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

REPLY_ROOM = rf"Reply with: crew reply (?P<room>{ROOM_ID})"


def having(*patterns: str) -> str:
    """A regex that needs every pattern somewhere (any order), then names the reply room."""
    return "".join(f"(?=.*{p})" for p in patterns) + rf".*{REPLY_ROOM}"


def heredoc(room: str, body: str) -> str:
    return f"crew reply {room} <<'EOF'\n{body}\nEOF"


def event_types(turn: dict[str, Any]) -> list[str]:
    """The turn's event types as both engines record them: a warm turn also reports each
    tool call's start (`tool_start`, tests/web/test_browser_tools_live.py), a cold one cannot."""
    return [e["type"] for e in turn["events"] if e["type"] != "tool_start"]


def tool_outputs(turn: dict[str, Any]) -> list[str]:
    return [e["data"]["output"] for e in turn["events"] if e["type"] == "tool_use"]


def sessions_of(chain: Chain, marker: str) -> set[str | None]:
    """The OpenCode session ids of the model requests whose turn input holds `marker`."""
    return {
        r.session
        for r in chain.model.requests()
        if r.body["messages"] and marker in _last_user_text(r.body["messages"])
    }


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    users = [message_text(m) for m in messages if m.get("role") == "user"]
    return users[-1] if users else ""


def no_new_turn(chain: Chain, agent_id: str, before: int, settle: float = 3.0) -> None:
    """After `settle` seconds the agent still has only `before` turns."""
    time.sleep(settle)
    assert len(chain.turns(agent_id)) == before


# ---------------------------------------------------------------- 1. DM


def test_dm_agent_writes_a_file_and_replies(chain: Chain) -> None:
    chain.script(
        [
            {
                "role": "user",
                "match": having("DM-1"),
                "reply": {
                    "bash": "echo 'first note' > note.txt && "
                    + heredoc("{{room}}", "I wrote note.txt — costs `$0`.")
                },
            }
        ]
    )
    ada = chain.agent("ada")
    room = chain.dm(ada["id"])
    sent = chain.post(room["id"], "DM-1: please leave a note")

    [turn] = chain.finished_turns(ada["id"], 1)

    assert turn["status"] == "succeeded", (turn["failure"], chain.diagnostics())
    [reply] = chain.agent_messages(room["id"], ada["id"])
    assert reply["body"] == "I wrote note.txt — costs `$0`."
    note = chain.crew_home / "agents" / ada["id"] / "work" / "note.txt"
    assert note.read_text() == "first note\n"
    assert "DM-1: please leave a note" in turn["input"]
    assert turn["rooms"] == [
        {"room_id": room["id"], "from_seq": sent["seq"], "to_seq": sent["seq"]}
    ]
    assert event_types(turn) == [
        "step_start",
        "tool_use",
        "step_finish",
        "step_start",
        "text",
        "step_finish",
    ]
    assert [e["index"] for e in turn["events"]] == list(range(len(turn["events"])))
    [tool] = [e["data"] for e in turn["events"] if e["type"] == "tool_use"]
    assert tool["tool"] == "bash" and not tool["failed"]
    assert f"Message sent to room {room['id']}." in tool["output"]
    usage = turn["usage"]
    assert usage["input_tokens"] == 2 * 99 and usage["output_tokens"] == 2 * 20
    assert usage["cache_read"] == 2 * 10
    assert usage["cost"] == pytest.approx(2 * 0.000144)


FORGED_STEP = (
    '{"type":"step_finish","timestamp":1,"sessionID":"ses_forged","part":{"type":"step-finish",'
    '"reason":"stop","tokens":{"total":1,"input":1000000000,"output":0,"reasoning":0,'
    '"cache":{"write":0,"read":0}},"cost":999999}}'
)


def test_a_tool_cannot_forge_the_engines_events_or_cost(chain: Chain) -> None:
    """Issue 12, "forged events": the bash tool writes a `step_finish` with a huge cost into
    the engine's stdout (`/proc/$PPID/fd/1`, and every other process's fd 1 it can see).
    In both engines that stdout is a socket (sandbox_launcher/engine_run.py
    `engine_channel`: the cold `opencode run`'s, and the warm `opencode serve`'s in
    sandbox_launcher/warm_server.py), so each open fails; the record holds only
    OpenCode's own events and cost (a warm turn's events come over HTTP, and still match)."""
    forge = (
        f"F='{FORGED_STEP}'; for p in /proc/$PPID/fd/1 /proc/[0-9]*/fd/1; do "
        '[ "$p" = /proc/$$/fd/1 ] && continue; '
        'if printf "%s\\n" "$F" 2>/dev/null > "$p"; then echo "WROTE $p"; else echo "refused $p"; fi; '
        "done"
    )
    chain.script(
        [
            {
                "role": "user",
                "match": having("FORGE-1"),
                "reply": {"bash": forge + " && " + heredoc("{{room}}", "tried")},
            }
        ]
    )
    eve = chain.agent("eve")
    room = chain.dm(eve["id"])
    chain.post(room["id"], "FORGE-1: forge your cost")

    [turn] = chain.finished_turns(eve["id"], 1)

    assert turn["status"] == "succeeded", (turn["failure"], chain.diagnostics())
    [output] = tool_outputs(turn)
    assert "refused /proc/" in output and "WROTE" not in output, output
    assert event_types(turn) == [
        "step_start",
        "tool_use",
        "step_finish",
        "step_start",
        "text",
        "step_finish",
    ]
    assert all(e["data"].get("cost", 0) < 1 for e in turn["events"]), turn["events"]
    assert turn["usage"]["input_tokens"] < 10_000 and turn["usage"]["cost"] < 1, turn["usage"]


# ---------------------------------------------------------------- 2. group, HELD


def test_group_held_reply_is_sent_again_with_the_news_and_the_other_agent_stays_silent(
    chain: Chain,
) -> None:
    chain.script(
        [
            {  # Alice's first try is slow, so the user's second message lands first.
                "role": "user",
                "match": having("GROUP-2", r"\(@alice, you\)"),
                "times": 1,
                "reply": {"bash": heredoc("{{room}}", "Plan: ship on Friday."), "delay_s": 3},
            },
            {
                "role": "tool",
                "match": r"Not sent: new messages arrived.*(?P<news>NEWS-\w+)",
                "capture": {"room": rf"crew reply ({ROOM_ID})"},
                "reply": {"bash": heredoc("{{room}}", "Plan: ship on Friday, noted {{news}}.")},
            },
            # Bob reads everything and has nothing to add: no crew reply.
            {"role": "user", "match": r"\(@bob, you\)", "reply": {"text": "Nothing to add."}},
        ]
    )
    alice, bob = chain.agent("alice"), chain.agent("bob")
    group = chain.group("launch", [alice["id"], bob["id"]])
    chain.post(group["id"], "GROUP-2: what is the plan?")
    wait_until(
        "Alice's first model request",
        lambda: any("(@alice, you)" in r.last_text() for r in chain.model.requests()),
        timeout=60,
    )
    chain.post(group["id"], "Update: NEWS-freeze starts Thursday")

    alice_turns = chain.finished_turns(alice["id"], 1)
    chain.finished_turns(bob["id"], 1)

    first = alice_turns[0]
    assert first["status"] == "succeeded", (first["failure"], chain.diagnostics())
    outputs = tool_outputs(first)
    assert len(outputs) == 2
    assert outputs[0].startswith("Not sent: new messages arrived in this room.")
    assert "NEWS-freeze" in outputs[0]
    assert f"Message sent to room {group['id']}." in outputs[1]
    bodies = [m["body"] for m in chain.agent_messages(group["id"], alice["id"])]
    assert bodies == ["Plan: ship on Friday, noted NEWS-freeze."]
    assert chain.agent_messages(group["id"], bob["id"]) == []
    bob_turns = chain.settled_turns(bob["id"])
    assert bob_turns and all(t["status"] == "succeeded" for t in bob_turns)


# ---------------------------------------------------------------- 3. thread


def test_thread_mention_wakes_only_that_agent_and_the_group_shows_a_summary(chain: Chain) -> None:
    chain.script(
        [
            {
                "role": "user",
                "match": having("THREAD-3", r"\(@cleo, you\)"),
                "reply": {"bash": heredoc("{{room}}", "Answered in the thread.")},
            }
        ]
    )
    cleo, dan = chain.agent("cleo"), chain.agent("dan")
    group = chain.group("ops", [cleo["id"], dan["id"]])
    root = chain.post(group["id"], "Root message for a thread")
    chain.finished_turns(cleo["id"], 1)
    chain.finished_turns(dan["id"], 1)
    dan_turns = len(chain.turns(dan["id"]))

    chain.post(group["id"], "THREAD-3 @cleo can you look at this?", thread_of=root["id"])
    turns = chain.finished_turns(cleo["id"], 2)

    assert turns[1]["status"] == "succeeded", (turns[1]["failure"], chain.diagnostics())
    timeline = chain.messages(group["id"])
    [root_now] = [m for m in timeline if m["id"] == root["id"]]
    thread_id = root_now["thread"]["id"]
    assert root_now["thread"]["replies"] == 2
    thread = chain.messages(thread_id)
    assert [m["body"] for m in thread] == [
        "THREAD-3 @cleo can you look at this?",
        "Answered in the thread.",
    ]
    assert thread[1]["author"]["id"] == cleo["id"]
    assert all(m["body"] != "Answered in the thread." for m in timeline)
    no_new_turn(chain, dan["id"], dan_turns)


# ---------------------------------------------------------------- 4. task


def test_task_is_claimed_worked_on_and_sent_to_review_with_a_note(chain: Chain) -> None:
    chain.script(
        [
            {
                "role": "user",
                "match": rf"\[task #(?P<n>\d+) todo, assigned to @erin\].*{REPLY_ROOM}",
                "reply": {
                    "bash": "crew task claim {{room}} {{n}} && echo 'the summary' > summary.md && "
                    "crew task status {{room}} {{n}} in_review --note 'Wrote summary.md'"
                },
            }
        ]
    )
    erin = chain.agent("erin")
    group = chain.group("tasks", [erin["id"]])
    message = chain.post(group["id"], "TASK-4 write the summary")
    chain.finished_turns(erin["id"], 1)
    task = chain.expect_ok(
        chain.http.post(
            "/api/tasks/convert", json={"message_id": message["id"], "assignee": "erin"}
        )
    )

    def reviewed() -> dict[str, Any] | None:
        [host] = [m for m in chain.messages(group["id"]) if m["id"] == message["id"]]
        return host if (host["task"] or {}).get("status") == "in_review" else None

    host = wait_until("the task to reach in_review", reviewed, timeout=90)
    assert host["task"]["assignee"] == "erin"
    summary = chain.crew_home / "agents" / erin["id"] / "work" / "summary.md"
    assert summary.read_text() == "the summary\n"
    notes = [m["body"] for m in chain.messages(task["thread_id"]) if m["kind"] == "notice"]
    assert any("Wrote summary.md" in body for body in notes), notes
    turns = chain.finished_turns(erin["id"], 2)
    [worked] = [t for t in turns if "todo, assigned to @erin]" in t["input"]]
    assert worked["status"] == "succeeded", (worked["failure"], chain.diagnostics())


# ---------------------------------------------------------------- 5 + 6. memory and sessions


def test_session_continues_then_restarts_and_memory_is_read(chain: Chain) -> None:
    chain.script(
        [
            {
                "role": "user",
                "match": having("MEM-1"),
                "reply": {
                    "bash": "echo 'The user likes tea.' >> MEMORY.md && "
                    + heredoc("{{room}}", "Noted in my memory.")
                },
            },
            {
                "role": "user",
                "match": having("MEM-3"),
                "reply": {"bash": "grep 'likes tea' MEMORY.md | crew reply {{room}}"},
            },
        ]
    )
    fay = chain.agent("fay")
    room = chain.dm(fay["id"])
    chain.post(room["id"], "MEM-1 remember: I like tea")
    chain.finished_turns(fay["id"], 1)
    chain.post(room["id"], "MEM-2 anything new?")
    first, second = chain.finished_turns(fay["id"], 2)
    [session_1], [session_2] = sessions_of(chain, "MEM-1"), sessions_of(chain, "MEM-2")

    assert session_1 is not None and session_1 == session_2  # 6. the session continues
    assert "This is a new session: read MEMORY.md first." in first["input"]
    assert "new session" not in second["input"]

    # A changed persona changes AGENTS.md: the session is dropped.
    chain.expect_ok(chain.http.patch(f"/api/agents/{fay['id']}", json={"persona": "Terse."}))
    # The Computer replaces the runner on the `agents` event, with the new AGENTS.md.
    agents_md = chain.crew_home / "agents" / fay["id"] / "AGENTS.md"
    wait_until("the new AGENTS.md", lambda: "Terse." in agents_md.read_text())
    chain.post(room["id"], "MEM-3 what do I like?")
    third = chain.finished_turns(fay["id"], 3)[-1]
    [session_3] = sessions_of(chain, "MEM-3")

    assert third["status"] == "succeeded", (third["failure"], chain.diagnostics())
    assert "This is a new session: read MEMORY.md first." in third["input"]
    assert session_3 is not None and session_3 != session_1
    bodies = [m["body"] for m in chain.agent_messages(room["id"], fay["id"])]
    assert bodies == ["Noted in my memory.", "The user likes tea."]


# ---------------------------------------------------------------- 7. reminder


def test_reminder_fires_and_wakes_the_agent(chain: Chain) -> None:
    chain.script(
        [
            {
                "role": "user",
                "match": having("REMIND-7"),
                "reply": {
                    "bash": "crew remind {{room}} 'check the oven' --in 20m && "
                    + heredoc("{{room}}", "I will check in 20 minutes.")
                },
            },
            {
                "role": "user",
                "match": having("Reminder from @gus: check the oven"),
                "reply": {"bash": heredoc("{{room}}", "The oven is checked.")},
            },
        ]
    )
    gus = chain.agent("gus")
    room = chain.dm(gus["id"])
    chain.post(room["id"], "REMIND-7 check the oven later please")
    [first] = chain.finished_turns(gus["id"], 1)
    assert first["status"] == "succeeded", (first["failure"], chain.diagnostics())

    chain.dev_clock(21 * 60)
    second = chain.finished_turns(gus["id"], 2)[-1]

    assert second["status"] == "succeeded", (second["failure"], chain.diagnostics())
    assert "Reminder from @gus: check the oven" in second["input"]
    messages = chain.messages(room["id"])
    assert [m["kind"] for m in messages][-2:] == ["notice", "normal"]
    assert messages[-1]["body"] == "The oven is checked."


# ---------------------------------------------------------------- 8. mute


def test_muted_group_wakes_only_on_a_mention(chain: Chain) -> None:
    chain.script(
        [
            {
                "role": "user",
                "match": having("MUTE-8 please mute"),
                "reply": {"bash": "crew mute {{room}}"},
            },
            {
                "role": "user",
                "match": having(r"\(you muted it\)", "@hal ping"),
                "reply": {"bash": heredoc("{{room}}", "Pong, I saw both messages.")},
            },
        ]
    )
    hal = chain.agent("hal")
    group = chain.group("noisy", [hal["id"]])
    chain.post(group["id"], "MUTE-8 please mute this group")
    chain.finished_turns(hal["id"], 1)

    chain.post(group["id"], "just chatter, no mention")
    no_new_turn(chain, hal["id"], 1)
    chain.post(group["id"], "@hal ping")
    second = chain.finished_turns(hal["id"], 2)[-1]

    assert second["status"] == "succeeded", (second["failure"], chain.diagnostics())
    assert "(you muted it)" in second["input"]
    assert "just chatter, no mention" in second["input"]
    assert "@hal ping [mentions you]" in second["input"]
    bodies = [m["body"] for m in chain.agent_messages(group["id"], hal["id"])]
    assert bodies == ["Pong, I saw both messages."]


# ---------------------------------------------------------------- 9. stop


def test_stop_mid_turn_cancels_without_ack_and_the_next_turn_gets_the_same_messages(
    chain: Chain,
) -> None:
    chain.script([{"role": "user", "match": "STOP-9", "reply": {"hang": "headers"}}])
    ivy = chain.agent("ivy")
    room = chain.dm(ivy["id"])
    sent = chain.post(room["id"], "STOP-9 this will hang")
    wait_until(
        "the hanging model request",
        lambda: any("STOP-9" in r.last_text() for r in chain.model.requests()),
        timeout=60,
    )
    with chain.computer.introspection() as local:
        stopped = local.post(f"/agents/{ivy['id']}/stop")
        assert stopped.status_code < 300, stopped.text
        [cancelled] = chain.finished_turns(ivy["id"], 1, timeout=30)
        assert cancelled["status"] == "cancelled"
        assert chain.agent_messages(room["id"], ivy["id"]) == []

        chain.script(
            [
                {
                    "role": "user",
                    "match": having("STOP-9"),
                    "reply": {"bash": heredoc("{{room}}", "Back, and answering now.")},
                }
            ]
        )
        woken = local.post(f"/agents/{ivy['id']}/wake")
        assert woken.status_code < 300, woken.text
    second = chain.finished_turns(ivy["id"], 2)[-1]

    assert second["status"] == "succeeded", (second["failure"], chain.diagnostics())
    assert (
        second["rooms"]
        == cancelled["rooms"]
        == [{"room_id": room["id"], "from_seq": sent["seq"], "to_seq": sent["seq"]}]
    )
    assert "STOP-9 this will hang" in second["input"]


# ---------------------------------------------------------------- 10. model errors


def test_model_errors_fail_the_turn_with_their_class_and_keep_the_messages(chain: Chain) -> None:
    chain.script(
        [
            {
                "match": "ERR-10",
                "times": 1,
                "reply": {"error": {"status": 401, "message": "bad key"}},
            },
            {"match": "ERR-10", "reply": {"error": {"status": 429, "retry_after_ms": 10}}},
        ]
    )
    jo = chain.agent("jo")
    room = chain.dm(jo["id"])
    sent = chain.post(room["id"], "ERR-10 hello")
    [denied] = chain.finished_turns(jo["id"], 1)
    assert denied["status"] == "failed"
    assert denied["failure"]["class"] == "not_logged_in"

    _wake(chain, jo["id"])
    limited = chain.finished_turns(jo["id"], 2)[-1]
    assert limited["status"] == "failed"
    assert limited["failure"]["class"] == "rate_limited"
    assert chain.agent_messages(room["id"], jo["id"]) == []
    [position] = chain.server.positions(jo["id"])
    assert position["read_seq"] < sent["seq"] <= position["delivered_seq"]  # delivered, not read
    chain.script(
        [
            {
                "role": "user",
                "match": having("ERR-10"),
                "reply": {"bash": heredoc("{{room}}", "Working again.")},
            }
        ]
    )

    _wake(chain, jo["id"])
    third = chain.finished_turns(jo["id"], 3)[-1]
    assert third["status"] == "succeeded", (third["failure"], chain.diagnostics())
    expected = [{"room_id": room["id"], "from_seq": sent["seq"], "to_seq": sent["seq"]}]
    assert denied["rooms"] == limited["rooms"] == third["rooms"] == expected
    assert [m["body"] for m in chain.agent_messages(room["id"], jo["id"])] == ["Working again."]


def _wake(chain: Chain, agent_id: str) -> None:
    with chain.computer.introspection() as local:
        response: httpx.Response = local.post(f"/agents/{agent_id}/wake")
        assert response.status_code < 300, response.text


# ---------------------------------------------------------------- last: stopping


def test_closing_stdin_stops_the_computer_cleanly(chain: Chain) -> None:
    """Runs last in this module (per engine mode): the app closes the Computer's stdin.

    Warm: the agents' `opencode serve` servers are still up from the earlier tests
    (idle for less than the idle timeout); the Computer stops them before it exits.
    Cold: no engine process runs between turns. Either way none is left afterwards.
    """
    runtime = chain.crew_home / "runtime"
    assert [p.name for p in runtime.iterdir()], "no run directory while running"
    if chain.engine_mode == "warm":
        servers = sandbox_processes(chain.crew_home)
        assert servers, f"no warm server is running before the stop; {chain.diagnostics()}"
    else:  # the last turn's sandbox ends with its run (the kernel ends its members just after)
        wait_until("no sandbox between turns", lambda: not sandbox_processes(chain.crew_home))

    code = chain.computer.stop()

    assert code == 0, chain.diagnostics()
    # The launcher waited for each server; the kernel ends the namespace members after.
    wait_until(
        "no process of the Computer left",
        lambda: not processes_naming(chain.crew_home),
        timeout=15,
    )
    assert list(runtime.iterdir()) == []
    assert not chain.computer.socket.exists()
    assert not list((chain.crew_home / "sockets").iterdir())


def processes_naming(path: Path) -> list[list[str]]:
    """The command lines of this machine's processes that name `path`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue  # it ended while we looked
        if any(str(path) in a for a in args):
            found.append(args)
    return found


def sandbox_processes(crew_home: Path) -> list[list[str]]:
    """Processes naming the Computer's CREW_HOME other than its launcher: the sandboxes.

    The launcher runs as `python -I -m sandbox_launcher serve …`; a sandbox's argv names
    files inside that package (landlock_exec.py), so only the exact module name counts.
    """
    return [args for args in processes_naming(crew_home) if "sandbox_launcher" not in args]
