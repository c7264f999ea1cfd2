"""The seed's manual real-model checks, as end-to-end scenarios (issue 20, item 19).

Each test is one of the seed's "真实模型" acceptance checks, run through the whole chain
(crew-server, crew-computer, the launcher, the real `opencode` in bwrap) with the scripted
model standing in for the real one, once with the warm engine and once with the cold one
(the `chain` fixture of conftest.py):

- one turn records its tool call, a HELD answer, the reply and its cost together;
- two agents in a group, one @mentioning the other, and the exchange ends;
- a task converted from a message, assigned, claimed, reported in its thread, moved to
  review and then done by the user, with an unassigned task claimed in the same turn;
- a deleted session: the next turn starts a new one, its input says to read MEMORY.md,
  and the agent does.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest

from crew_harness.scripted_model import ROOM_ID
from crew_harness.waiting import wait_until
from tests.e2e.chain import Chain
from tests.e2e.opencode_by_hand import OPENCODE
from tests.e2e.test_chain import REPLY_ROOM, having, heredoc, no_new_turn, tool_outputs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# What the scripted model charges for one step (its default usage and the configured price).
STEP_COST = 0.000144


def step_finishes(turn: dict[str, Any]) -> list[dict[str, Any]]:
    return [e["data"] for e in turn["events"] if e["type"] == "step_finish"]


def model_saw(chain: Chain, text: str) -> bool:
    return any(text in r.last_text() for r in chain.model.requests())


# ---------------------------------------------------------------- one turn, recorded together


def test_one_turn_records_its_tool_call_held_answer_reply_and_cost_together(chain: Chain) -> None:
    """Seed: "工具调用、HELD、回复、用量与费用都记进这一轮" — Alice writes a file and says so,
    her first reply is HELD by the user's news, she sends it again; Bob, not addressed, runs
    and says nothing."""
    chain.script(
        [
            {  # Slow, so that the user's news lands before the reply is sent.
                "role": "user",
                "match": having("ACC-A", r"\(@amy, you\)"),
                "times": 1,
                "reply": {
                    "bash": "echo 'release notes' > notes.md && "
                    + heredoc("{{room}}", "notes.md is written."),
                    "delay_s": 3,
                },
            },
            {
                "role": "tool",
                "match": r"Not sent: new messages arrived.*(?P<news>NEWS-\w+)",
                "capture": {"room": rf"crew reply ({ROOM_ID})"},
                "reply": {"bash": heredoc("{{room}}", "notes.md is written, with {{news}}.")},
            },
            {"role": "user", "match": r"\(@ben, you\)", "reply": {"text": "Not for me."}},
        ]
    )
    amy, ben = chain.agent("amy"), chain.agent("ben")
    group = chain.group("release", [amy["id"], ben["id"]])
    chain.post(group["id"], "ACC-A @amy please write the release notes")
    wait_until("Amy's first model request", lambda: model_saw(chain, "(@amy, you)"), timeout=60)
    chain.post(group["id"], "Also: NEWS-date is Friday")

    [turn] = chain.finished_turns(amy["id"], 1)

    assert turn["status"] == "succeeded", (turn["failure"], chain.diagnostics())
    # The tool call: the file, and both crew replies in the turn's own record.
    notes = chain.crew_home / "agents" / amy["id"] / "work" / "notes.md"
    assert notes.read_text() == "release notes\n"
    held, sent = tool_outputs(turn)
    assert held.startswith("Not sent: new messages arrived in this room."), held
    assert "NEWS-date" in held
    assert f"Message sent to room {group['id']}." in sent
    # The reply: one message, the rewritten one.
    bodies = [m["body"] for m in chain.agent_messages(group["id"], amy["id"])]
    assert bodies == ["notes.md is written, with NEWS-date."]
    # Usage and cost: three model steps, each recorded with its cost, adding up to the turn's.
    steps = step_finishes(turn)
    assert len(steps) == 3, steps
    assert turn["usage"]["cost"] == pytest.approx(3 * STEP_COST)
    assert sum(s["cost"] for s in steps) == pytest.approx(turn["usage"]["cost"])
    assert turn["usage"]["input_tokens"] == sum(s["tokens"]["input"] for s in steps) > 0
    # Bob ran for each message that woke him and sent nothing.
    ben_turns = chain.settled_turns(ben["id"])
    assert ben_turns and all(t["status"] == "succeeded" for t in ben_turns)
    assert chain.agent_messages(group["id"], ben["id"]) == []


# ---------------------------------------------------------------- agents @mention each other


def test_an_agent_mentions_another_who_answers_and_the_exchange_ends(chain: Chain) -> None:
    """Seed: "Agent 之间的 @" — Gus asks @hal in the group; Hal is woken, sees the mention
    and answers; Gus reads the answer and the exchange stops there."""
    chain.script(
        [
            {  # Hal, asked by another agent: answers it.
                "role": "user",
                "match": rf"Gus \(@gus\): @hal what is the build number\? \[mentions you\]"
                rf".*{REPLY_ROOM}",
                "reply": {"bash": heredoc("{{room}}", "@gus Build 42.")},
            },
            {  # Gus, asked by the user: asks Hal.
                "role": "user",
                "match": having("ACC-B", r"\(@gus, you\)"),
                "reply": {"bash": heredoc("{{room}}", "@hal what is the build number?")},
            },
            # Anything else (Hal on the user's message, Gus on Hal's answer): nothing to send.
            {"role": "user", "reply": {"text": "Nothing to add."}},
        ]
    )
    gus, hal = chain.agent("gus"), chain.agent("hal")
    group = chain.group("builds", [gus["id"], hal["id"]])
    chain.post(group["id"], "ACC-B @gus please find out the build number from @hal")

    def answered() -> list[dict[str, Any]] | None:
        said = chain.agent_messages(group["id"], hal["id"])
        return said or None

    [answer] = wait_until("Hal's answer", answered, timeout=120)
    assert answer["body"] == "@gus Build 42."
    [question] = chain.agent_messages(group["id"], gus["id"])
    assert question["body"] == "@hal what is the build number?"
    assert question["seq"] < answer["seq"]
    # Hal was woken by Gus's message, which his turn showed as mentioning him.
    hal_turns = chain.settled_turns(hal["id"])
    asked = [t for t in (chain.turn(t["id"]) for t in hal_turns) if "@hal what is" in t["input"]]
    assert asked and all(t["status"] == "succeeded" for t in asked)
    assert "Gus (@gus): @hal what is the build number? [mentions you]" in asked[0]["input"]
    # Gus read the answer in a later turn and sent nothing more: the exchange ended.
    gus_turns = chain.settled_turns(gus["id"])
    read_it = [t for t in (chain.turn(t["id"]) for t in gus_turns) if "Build 42." in t["input"]]
    assert read_it and read_it[-1]["status"] == "succeeded"
    messages_now = len(chain.messages(group["id"]))
    no_new_turn(chain, gus["id"], len(gus_turns))
    assert len(chain.messages(group["id"])) == messages_now


# ---------------------------------------------------------------- a task from start to done


def test_task_converted_assigned_claimed_reported_reviewed_done_with_an_unassigned_one(
    chain: Chain,
) -> None:
    """Seed: "用户把一条消息转成任务并分配给 @alice，Alice 领取、写好文件、改成待审并在任务的讨论串
    里汇报；用户改成完成。同一轮里 Alice 也领取了用户新建的未分配任务并做完"."""
    # The converted message was read already: its task shows as the notice in its thread.
    assigned = r"User created task #(?P<n>\d+), assigned to @ivy\."
    unassigned = r"ACC-C2 tidy the readme \[task #(?P<m>\d+) todo, unassigned\]"
    chain.script(
        [
            {  # Both tasks in one turn: claim and do each, the assigned one to review.
                "role": "user",
                "match": having(assigned, unassigned),
                # The group's own room (the input also holds the task's thread).
                "capture": {"room": rf'## Group "chores".*?Reply with: crew reply ({ROOM_ID})'},
                "reply": {
                    "bash": "crew task claim {{room}} {{n}} && echo '- first entry' > CHANGELOG.md"
                    " && crew task status {{room}} {{n}} in_review --note 'CHANGELOG.md written'"
                    " && crew task claim {{room}} {{m}} && echo 'tidy' > README.md"
                    " && crew task status {{room}} {{m}} done --note 'README.md tidied'"
                },
            },
            {  # Then report on the assigned task in its thread (the claim said where).
                "role": "tool",
                "match": rf"Report on it in its thread: crew reply (?P<thread>{ROOM_ID})",
                "times": 1,
                "reply": {"bash": heredoc("{{thread}}", "CHANGELOG.md is ready for review.")},
            },
            {  # The first message, before it is a task: slow, so both tasks land meanwhile.
                "role": "user",
                "match": having("ACC-C write the changelog"),
                "times": 1,
                "reply": {"text": "Waiting for a task.", "delay_s": 3},
            },
            {"role": "user", "reply": {"text": "Nothing to do."}},
        ]
    )
    ivy = chain.agent("ivy")
    group = chain.group("chores", [ivy["id"]])
    message = chain.post(group["id"], "ACC-C write the changelog")
    wait_until("Ivy's first model request", lambda: model_saw(chain, "ACC-C write"), timeout=60)
    other = chain.expect_ok(
        chain.http.post(
            "/api/tasks", json={"room_id": group["id"], "title": "ACC-C2 tidy the readme"}
        )
    )
    task = chain.expect_ok(
        chain.http.post("/api/tasks/convert", json={"message_id": message["id"], "assignee": "ivy"})
    )

    def task_status(number: int) -> dict[str, Any]:
        [row] = [
            t
            for t in chain.expect_ok(chain.http.get("/api/tasks", params={"room_id": group["id"]}))
            if t["number"] == number
        ]
        return row

    wait_until(
        "the assigned task in review",
        lambda: task_status(task["number"])["status"] == "in_review",
        timeout=120,
    )
    wait_until(
        "the report in the task's thread",
        lambda: any(m["author"]["id"] == ivy["id"] for m in chain.messages(task["thread_id"])),
        timeout=60,
    )
    chain.settled_turns(ivy["id"])
    chain.expect_ok(
        chain.http.post(
            f"/api/tasks/{task['number']}/status", json={"room_id": group["id"], "status": "done"}
        )
    )

    done = task_status(task["number"])
    assert done["status"] == "done" and done["assignee"] == "ivy"
    thread = chain.messages(task["thread_id"])
    [report] = [m for m in thread if m["author"]["id"] == ivy["id"]]
    assert report["body"] == "CHANGELOG.md is ready for review."
    notices = [m["body"] for m in thread if m["kind"] == "notice"]
    assert any("CHANGELOG.md written" in n for n in notices), notices
    # The unassigned task: claimed by Ivy and done, in the same turn as the assigned one.
    extra = task_status(other["number"])
    assert extra["status"] == "done" and extra["assignee"] == "ivy"
    turns = [chain.turn(t["id"]) for t in chain.settled_turns(ivy["id"])]
    [both] = [t for t in turns if "assigned to @ivy. [notice]" in t["input"]]
    assert both["status"] == "succeeded", (both["failure"], chain.diagnostics())
    assert "tidy the readme [task" in both["input"]
    claims = "\n".join(tool_outputs(both))
    assert f"#{task['number']}" in claims and f"#{other['number']}" in claims, claims
    work = chain.crew_home / "agents" / ivy["id"] / "work"
    assert (work / "CHANGELOG.md").read_text() == "- first entry\n"
    assert (work / "README.md").read_text() == "tidy\n"


# ---------------------------------------------------------------- a deleted session


def delete_opencode_session(chain: Chain, agent_id: str, session_id: str) -> None:
    """`opencode session delete`, as the user would, on the agent's own OpenCode data.

    Run as the caller (the engine user of a root Computer cannot reach the crew home on
    the host); what it created there is given back to the data's owner afterwards.
    """
    agent_dir = chain.crew_home / "agents" / agent_id
    data_dir = agent_dir / "engines" / "opencode" / "data"
    owner = data_dir.stat()
    scratch = chain.root / f"session-delete-{agent_id}"
    scratch.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(scratch),
        "XDG_DATA_HOME": str(data_dir),
        "XDG_CONFIG_HOME": str(scratch / "config"),
        "XDG_CACHE_HOME": str(scratch / "cache"),
        "XDG_STATE_HOME": str(scratch / "state"),
        "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
    }
    done = subprocess.run(
        [str(OPENCODE), "session", "delete", session_id],
        env=env,
        cwd=agent_dir / "work",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    if owner.st_uid != os.getuid():
        for entry in [data_dir, *data_dir.rglob("*")]:
            os.lchown(entry, owner.st_uid, owner.st_gid)


def session_of(chain: Chain, agent_id: str) -> str:
    import orjson

    record = chain.crew_home / "agents" / agent_id / "engines" / "opencode" / "session.json"
    session: str = orjson.loads(record.read_bytes())["session_id"]
    return session


def test_a_deleted_session_starts_a_new_one_that_reads_memory_first(chain: Chain) -> None:
    """Seed: "删掉会话记录让下一轮开新会话后问“我叫什么名字”，她先读记忆，用英文答出名字"."""
    chain.script(
        [
            {
                "role": "user",
                "match": having("ACC-D1"),
                "reply": {
                    "bash": "echo 'The user is called Wang; answer in English.' >> MEMORY.md && "
                    + heredoc("{{room}}", "Noted, Wang.")
                },
            },
            {  # A new session: read the memory first, as the input says.
                "role": "user",
                "match": having("ACC-D2", r"This is a new session: read MEMORY\.md first\."),
                "reply": {"bash": "cat MEMORY.md"},
            },
            {
                "role": "tool",
                "match": r"The user is called (?P<name>\w+)",
                "capture": {"room": rf"crew reply ({ROOM_ID})"},
                "reply": {"bash": heredoc("{{room}}", "Your name is {{name}}.")},
            },
            {"role": "user", "match": "ACC-D2", "reply": {"text": "I do not know."}},
        ]
    )
    jo = chain.agent("jo")
    room = chain.dm(jo["id"])
    chain.post(room["id"], "ACC-D1 my name is Wang, answer in English from now on")
    [first] = chain.finished_turns(jo["id"], 1)
    assert first["status"] == "succeeded", (first["failure"], chain.diagnostics())
    old_session = session_of(chain, jo["id"])
    chain.settled_turns(jo["id"])

    delete_opencode_session(chain, jo["id"], old_session)
    chain.post(room["id"], "ACC-D2 what is my name?")
    second = chain.finished_turns(jo["id"], 2)[-1]

    assert second["status"] == "succeeded", (second["failure"], chain.diagnostics())
    assert "This is a new session: read MEMORY.md first." in second["input"]
    assert "ACC-D2 what is my name?" in second["input"]
    new_session = session_of(chain, jo["id"])
    assert new_session != old_session
    outputs = tool_outputs(second)
    assert "The user is called Wang" in outputs[0], outputs
    bodies = [m["body"] for m in chain.agent_messages(room["id"], jo["id"])]
    assert bodies == ["Noted, Wang.", "Your name is Wang."]
