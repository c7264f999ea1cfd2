"""The texts an agent reads (texts.md): AGENTS.md, the turn input, the MEMORY.md template.

Pure functions; snapshot tests fix every word (`tests/snapshots/`). AGENTS.md
holds no paths and no times: it changes only with the agent's settings,
because a change restarts the engine session.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, tzinfo
from typing import Any, Protocol

MEMORY_LIMIT_BYTES = 16 * 1024

MEMORY_TEMPLATE = """\
# MEMORY.md

This file is your own long-term memory. Nobody else writes here.

- It is read at the start of each new session, so keep here what should
  outlast this conversation: people's preferences, decisions, ongoing work,
  where things are, lessons learned.
- Keep it short and current: under 16 KB. Rewrite or drop what no longer matters.
- Do not store secrets here.

## Notes
"""


class AgentIdentity(Protocol):
    """What the texts need to know about an agent (an upstream agent record fits)."""

    @property
    def id(self) -> str: ...

    @property
    def handle(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def persona(self) -> str: ...


RenderRooms = Callable[..., str]


def render_agents_md(agent: AgentIdentity) -> str:
    """AGENTS.md for `agent`: identity, persona and the house rules (texts.md)."""
    persona = agent.persona.strip() or "No persona was given. Be helpful, clear and brief."
    return f"""\
# You are {agent.name} (@{agent.handle})

You are {agent.name}, an AI agent in a team chat called crew.
Your handle is @{agent.handle}: people mention you by writing @{agent.handle}.
You work with one human, the User, and possibly with other agents.

## Persona
{persona}

## How you speak: only through `crew reply`
Nobody reads what you print or what you answer in this session. The only way
to say something is the `crew` command:

```
crew reply <room-id> <<'EOF'
Your message here. Markdown is fine.
EOF
```

- Write the message on stdin with a quoted heredoc (`<<'EOF'`), as above, so
  the shell leaves backticks and `$` alone; the closing `EOF` stands alone on
  its line, at its start. Never put the message on the command line.
- Every section of your input ends with the exact `crew reply` command for
  that room. Answer in the room a message came from.
- `crew --help` lists every command (tasks, reminders, mutes).
- When there is nothing worth saying, say nothing: not answering is fine.

## When a reply is HELD
If new messages arrived in the room since you last read it, `crew reply` does
not send. It prints `Not sent: new messages arrived in this room.` followed by
those messages. Read them first. Then send your reply again (as is or changed)
with the same command, or do not send it at all if it is no longer needed.

## Group chats
- Answer when you are addressed (an @mention, a question to you) or when you
  add something the others have not said.
- Do not pile on: if someone already answered well, stay quiet. Do not reply
  just to agree or to thank.
- Mention someone with @handle when you need their attention.
- A muted group still wakes you when you are @mentioned.

## Threads
- Answer where the message came from: a message in a thread gets its answer in
  that thread, a message in the group gets its answer in the group.
- Open a new thread (`crew reply <room-id> --thread <message-id>`) only when
  the user asks for one. It prints the thread's room id for later replies.

## Tasks
- A task is a message with a number, e.g. `[task #3 todo, unassigned]`, and a
  thread of its own.
- Claim a task before you start on it: `crew task claim <room-id> <number>`.
- Report progress in the task's thread.
- When you are done, move it to review with a note of what was done:
  `crew task status <room-id> <number> in_review --note "what was done"`.
- The room id may be the group or the task's thread; `crew task --help` has
  the other task commands.

## Reminders
When you say you will do something later, set a reminder right away, e.g.
`crew remind <room-id> "check the build" --in 2h`. When it fires you get a
`[notice]` in that room and are woken to act on it.

## Memory
- In a new session, read `MEMORY.md` (in your working directory) first.
- Write there what has lasting value: preferences, decisions, ongoing work.
- Keep it under 16 KB; shorten it when it grows.

## Your working directory
Files you create stay between turns. Background processes do not survive the
turn: anything still running when your turn ends is stopped.
"""


def render_turn_input(
    now: datetime,
    rooms: Sequence[Any],
    agent: AgentIdentity,
    new_session: bool,
    memory_size: int | None,
    *,
    render_rooms: RenderRooms | None = None,
) -> str:
    """The text an engine gets on stdin for one turn (texts.md "The turn input").

    `now` is aware and in the machine's zone (the date line shows its offset);
    `rooms` is the unread answer's `rooms` list (dicts or pydantic models);
    `memory_size` is MEMORY.md's size in bytes (None when absent or not a
    regular file). `render_rooms` defaults to `crew_shim.rendering.render_rooms`,
    the renderer `crew reply` also uses for HELD answers.
    """
    if now.tzinfo is None:
        raise ValueError("render_turn_input needs an aware datetime (with its UTC offset)")
    if render_rooms is None:
        from crew_shim.rendering import render_rooms as shim_render_rooms

        render_rooms = shim_render_rooms
    tz: tzinfo = now.tzinfo
    lines = [f"It is {format_now(now)}."]
    if new_session:
        lines.append("This is a new session: read MEMORY.md first.")
        if memory_size is not None and memory_size > MEMORY_LIMIT_BYTES:
            lines.append(
                f"MEMORY.md is {memory_size // 1024} KB, over the 16 KB limit: "
                "shorten it in this turn, keeping what has lasting value."
            )
    today: date = now.date()
    sections = []
    for room in rooms:
        entry = _as_json(room)
        section = render_rooms([entry], agent_id=agent.id, tz=tz, today=today)
        said = already_said(entry.get("messages") or [], agent.id)
        if said:
            # Before the section's last line, its `Reply with:` command.
            section_lines = section.split("\n")
            section_lines.insert(len(section_lines) - 1, already_said_line(said))
            section = "\n".join(section_lines)
        sections.append(section)
    return "\n".join(lines) + "\n\n" + "\n\n".join(sections) + "\n"


def already_said(messages: Sequence[Mapping[str, Any]], agent_id: str) -> list[int]:
    """The seqs of the agent's own messages after the last one from anybody else.

    Such a room came back although the agent had answered it (its turn ended before the
    messages were marked read: stopped, or its end lost): the input says so, so that it
    does not say the same again (issue 22).
    """
    said: list[int] = []
    for message in messages:
        author = message.get("author") or {}
        if author.get("kind") == "agent" and author.get("id") == agent_id:
            said.append(int(message.get("seq") or 0))
        else:
            said = []
    return said


def already_said_line(seqs: Sequence[int]) -> str:
    """`You already replied here (#42, #43) after the last message from anyone else: …`."""
    which = ", ".join(f"#{seq}" for seq in seqs)
    return (
        f"You already replied here ({which}) after the last message from anyone else: "
        "do not say it again. Reply only if something is still unanswered."
    )


def format_now(now: datetime) -> str:
    """`Tuesday 2026-10-05 19:14 (+08:00)`."""
    offset = now.strftime("%z")
    return f"{now:%A %Y-%m-%d %H:%M} ({offset[:3]}:{offset[3:]})"


def _as_json(room: Any) -> Mapping[str, Any]:
    if isinstance(room, Mapping):
        return room
    dump = getattr(room, "model_dump", None)
    if dump is None:
        raise TypeError(f"cannot render a room of type {type(room).__name__}")
    result: Mapping[str, Any] = dump(mode="json")
    return result
