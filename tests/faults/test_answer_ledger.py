"""The count of crew_testkit/answer_ledger.py on rows written by hand: each verdict can be met."""

from __future__ import annotations

from typing import Any

import orjson

from crew_testkit.answer_ledger import count, held_seqs

ROOM = "r1"
AGENT = "a1"


def at(second: int) -> str:
    return f"2026-01-01T00:00:{second:02d}.000000+00:00"


def user(seq: int, second: int) -> dict[str, Any]:
    return _message(seq, second, "user", "u", f"message {seq}")


def agent(seq: int, second: int, body: str = "answer") -> dict[str, Any]:
    return _message(seq, second, "agent", AGENT, body)


def notice(seq: int, second: int) -> dict[str, Any]:
    body = "@alice could not handle 1 message here and set it aside unanswered: boom"
    return _message(seq, second, "system", "", body, kind="notice")


def _message(
    seq: int, second: int, author_kind: str, author_id: str, body: str, kind: str = "normal"
) -> dict[str, Any]:
    return {
        "id": f"m{seq}", "room_id": ROOM, "seq": seq, "author_kind": author_kind,
        "author_id": author_id, "body": body, "kind": kind, "created_at": at(second),
    }  # fmt: skip


def turn(turn_id: str, status: str, low: int, high: int, second: int) -> dict[str, Any]:
    rooms = [{"room_id": ROOM, "from_seq": low, "to_seq": high}]
    return {
        "id": turn_id, "agent_id": AGENT, "status": status, "rooms": orjson.dumps(rooms).decode(),
        "gaps": "[]", "started_at": at(second), "finished_at": None,
    }  # fmt: skip


def tables(
    messages: list[dict[str, Any]],
    turns: list[dict[str, Any]],
    read_seq: int,
    held: list[dict[str, Any]] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    return {
        "rooms": [{"id": ROOM, "kind": "dm", "parent_room_id": None}],
        "agents": [{"id": AGENT, "handle": "alice"}],
        "positions": [
            {"agent_id": AGENT, "room_id": ROOM, "delivered_seq": read_seq, "read_seq": read_seq}
        ],
        "turns": turns,
        "messages": messages,
        "held": held or [],
        "tool_turns": [{"turn_id": t["id"]} for t in turns],
    }


def verdicts(rows: dict[str, list[dict[str, Any]]]) -> list[str]:
    return [f.verdict for f in count(rows).fates]


def test_one_turn_that_replied_answers_its_claim_once() -> None:
    rows = tables([user(1, 1), user(2, 1), agent(3, 3)], [turn("t1", "succeeded", 1, 2, 2)], 3)
    assert verdicts(rows) == ["once", "once"]
    assert count(rows).ok


def test_a_message_given_again_to_a_turn_that_replies_again_is_answered_twice() -> None:
    rows = tables(
        [user(1, 1), agent(2, 3), agent(3, 6)],
        [turn("t1", "interrupted", 1, 1, 2), turn("t2", "succeeded", 1, 1, 5)],
        3,
    )
    ledger = count(rows)
    assert verdicts(rows) == ["twice"] and not ledger.ok
    assert ledger.fates[0].answered_by == ("t1", "t2")


def test_a_failed_turn_that_never_replied_does_not_count() -> None:
    rows = tables(
        [user(1, 1), agent(2, 6)],
        [turn("t1", "failed", 1, 1, 2), turn("t2", "succeeded", 1, 1, 5)],
        2,
    )
    assert verdicts(rows) == ["once"]


def test_a_silent_success_is_an_answer() -> None:
    rows = tables([user(1, 1)], [turn("t1", "succeeded", 1, 1, 2)], 1)
    assert verdicts(rows) == ["once"]


def test_a_message_shown_by_held_counts_for_that_turn() -> None:
    output = (
        "Not sent: new messages arrived in this room.\n\n## Direct chat — members: …\n"
        "- [#2 00:00] User (user): message 2\nReply with: crew reply r1\n"
    )
    rows = tables(
        [user(1, 1), user(2, 3), agent(3, 4), agent(4, 8)],
        [turn("t1", "interrupted", 1, 1, 2), turn("t2", "succeeded", 2, 2, 7)],
        4,
        held=[{"turn_id": "t1", "output": output}],
    )
    assert verdicts(rows) == ["once", "twice"]
    assert list(held_seqs(output)) == [("r1", 2)]


def test_held_text_cut_before_its_room_counts_for_the_turns_only_room() -> None:
    output = "Not sent: new messages arrived in this room.\n\n## Direct chat\n- [#2 00:00] User"
    assert list(held_seqs(output, "r1")) == [("r1", 2)]
    assert list(held_seqs(output)) == []


def test_set_aside_lost_unread_and_stuck() -> None:
    aside = tables([user(1, 1), notice(2, 5)], [turn("t1", "failed", 1, 1, 2)], 2)
    assert verdicts(aside) == ["set aside"]
    read_unanswered = tables([user(1, 1)], [turn("t1", "failed", 1, 1, 2)], 1)
    assert verdicts(read_unanswered) == ["lost"]
    pending = count(tables([user(1, 1)], [turn("t1", "running", 1, 1, 2)], 0))
    assert [f.verdict for f in pending.fates] == ["lost"]
    assert len(pending.stuck) == 1 and not pending.at_rest and not pending.ok


def test_what_keeps_the_database_from_rest_is_named() -> None:
    unread = count(tables([user(1, 1), user(2, 3)], [turn("t1", "failed", 1, 1, 2)], 1))
    assert (
        unread.unrest()
        == "not at rest: 1 message(s) unread (#2 for @alice), 0 turn(s) still running"
    )
    assert "(unread): #2 in room r1 for @alice" in unread.details()
    running = count(tables([user(1, 1)], [turn("t1", "running", 1, 1, 2)], 1))
    assert running.unrest().endswith("1 turn(s) still running")
    at_rest = count(tables([user(1, 1), agent(2, 3)], [turn("t1", "succeeded", 1, 1, 2)], 2))
    assert at_rest.at_rest and at_rest.unrest() == ""


def test_a_held_text_cut_away_counts_for_the_next_reply_even_in_a_failed_turns_claim() -> None:
    # t1 failed on #1-#3 without a reply; t2 was given #1 only and its HELD answer showed
    # #2 and #3, but the Computer cut the output at 4 KiB after #2 (chaos seeds 14, 22).
    output = "Not sent: new messages arrived in this room.\n\n## Direct chat\n- [#2 00:00] User"
    rows = tables(
        [user(1, 1), user(2, 1), user(3, 1), agent(4, 8)],
        [turn("t1", "failed", 1, 3, 2), turn("t2", "succeeded", 1, 1, 7)],
        4,
        held=[{"turn_id": "t2", "output": output}],
    )
    assert verdicts(rows) == ["once", "once", "once"]
    assert count(rows).fates[2].answered_by == ("t2",)


def test_a_turn_without_tool_events_was_shown_only_what_the_next_claim_did_not_take() -> None:
    # t1's Computer was killed before its events went out; it posted at #4 after #2 and #3
    # arrived. The server read up to #2 for it (t2 claimed from #3), so a HELD answer showed
    # it #2 only; #3 is t2's (chaos seed 33).
    rows = tables(
        [user(1, 1), user(2, 3), user(3, 4), agent(4, 5), agent(5, 9)],
        [turn("t1", "interrupted", 1, 1, 2), turn("t2", "succeeded", 3, 3, 8)],
        5,
    )
    rows["tool_turns"] = [{"turn_id": "t2"}]
    assert verdicts(rows) == ["once", "once", "once"]
    assert [f.answered_by for f in count(rows).fates] == [("t1",), ("t1",), ("t2",)]
