"""The demo's script (`scenario("crew")`) answers people, not agents (issue 20, 17).

Two scripted agents in a group used to answer each other forever: every turn
input holds a `crew reply <room>` line, whoever wrote the messages. Pure: the
chooser over turn inputs in the format of tests/snapshots/turn-prompt.md.
"""

from __future__ import annotations

from pathlib import Path

from crew_harness.scripted_model import Chooser, scenario

SNAPSHOT = Path(__file__).resolve().parents[1] / "snapshots" / "turn-prompt.md"
GROUP = "7d0c0000-0000-4000-8000-00000000aaaa"


def turn_input(*lines: str) -> list[dict[str, str]]:
    text = "It is Tuesday 2026-10-06 19:14 (+08:00).\n\n" + "\n".join(lines)
    return [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": text}]


def group(*messages: str) -> list[str]:
    return [
        '## Group "launch" — members: User (user), Alice (@alice, you), Bob (@bob)',
        *messages,
        f"Reply with: crew reply {GROUP}",
    ]


def test_a_message_from_the_user_is_answered_in_its_room() -> None:
    choice = Chooser(scenario("crew")).choose(
        turn_input(*group("- [#41 19:12] User (user): hello all (id 1)"))
    )
    assert choice.reply.bash is not None and f"crew reply {GROUP} <<'EOF'" in choice.reply.bash


def test_only_agents_messages_get_no_crew_reply() -> None:
    choice = Chooser(scenario("crew")).choose(
        turn_input(*group("- [#42 19:13] Bob (@bob): Hello! I wrote hello.txt (id 2)"))
    )
    assert choice.reply.bash is None and choice.reply.tool_calls == []


def test_the_room_with_the_users_message_is_the_one_answered() -> None:
    dm = "d1d10000-0000-4000-8000-00000000bbbb"
    choice = Chooser(scenario("crew")).choose(
        turn_input(
            *group("- [#42 19:13] Bob (@bob): Hi (id 2)"),
            "",
            "## Direct chat — members: User (user), Alice (@alice, you)",
            "- [#7 07:50] User (user): Thanks!",
            "  Also: what's left for Friday?",
            f"Reply with: crew reply {dm}",
        )
    )
    assert choice.reply.bash is not None and f"crew reply {dm} <<'EOF'" in choice.reply.bash


def test_the_real_prompt_format_is_recognised() -> None:
    """The snapshot the Computer's rendering is locked to: its first user message's room."""
    text = SNAPSHOT.read_text()
    choice = Chooser(scenario("crew")).choose([{"role": "user", "content": text}])
    assert choice.reply.bash is not None and f"crew reply {GROUP} <<'EOF'" in choice.reply.bash
