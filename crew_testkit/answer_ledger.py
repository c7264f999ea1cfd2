"""How often each message was answered, read from the server's database (issue 22).

The fault tests and the chaos run (`scripts/bench chaos`) count here, straight from
the tables, not through the API and not from what a test believes it posted. It
reads a SQLite file or a PostgreSQL URL (the same tables in both), at rest: after
the Computer stopped or every message settled.

What "answered" means, per (user message M, agent A) where A has a position in M's
room R (for a DM: every message of the room):

- A turn T of A was **given** M when M lies in T's claim of R (`turns.rooms`:
  `from_seq..to_seq`), or when a HELD answer during T showed M (a `crew reply`
  refused with "Not sent: new messages arrived", whose text lists `[#seq …]` lines
  under R's section; read from T's `tool_use` events, whose output the Computer
  cuts at 4 KiB: a cut section without its `Reply with:` line counts for the
  turn's room when it claimed only one). A message in no claim and no HELD text
  of any turn that answered R (a HELD answer cut away, or its events lost; a
  failed turn's claim does not count) was shown by a HELD answer to the turn of
  A's first message in R after it: that turn is taken. A turn with no tool events
  at all (its Computer killed before it sent them) that posted in R was shown the
  messages of others between its claim and that post, short of what a later turn
  of A claimed in R (a HELD answer delivers what it shows, and the server reads it
  with the turn).
- T **answered** R when A posted a normal message in R (or a thread of R) that
  belongs to T: the message's `turn_id` when the table has one, else the turn of A
  that started last at or before the message (an agent's turns never overlap).
- T answered M when it was given M and either answered R, or ended `succeeded`
  (its ack read M: the agent chose to stay silent, and that is an answer too).
- M is answered **once** by exactly one turn, **twice** by two or more, **set
  aside** by none but read with a set-aside notice of A in R after it, **lost**
  otherwise (unread, or read without an answer or notice).
- A **stuck** turn is one still `running` at rest.

Turns whose events have gaps (the Computer died before it sent them) may hide a
HELD answer; they are counted in `gapped_turns` so a reader knows the bound.
"""

from __future__ import annotations

import argparse
import bisect
import re
import sqlite3
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

HELD_FIRST = "Not sent: new messages arrived"
SECTION = re.compile(r"^## ", re.M)
SEQ_LINE = re.compile(r"^- \[#(\d+) ", re.M)
REPLY_WITH = re.compile(r"^Reply with: crew reply (\S+)", re.M)
SET_ASIDE = " could not handle "


@dataclass(frozen=True)
class Fate:
    """One (message, agent) pair and the turns that answered it."""

    message_id: str
    room_id: str
    seq: int
    agent_id: str
    handle: str
    body: str
    answered_by: tuple[str, ...]
    set_aside: bool
    read: bool  # the agent's read position is past it (nothing will give it again)

    @property
    def verdict(self) -> str:
        if len(self.answered_by) == 1:
            return "once"
        if len(self.answered_by) > 1:
            return "twice"
        return "set aside" if self.set_aside else "lost"


@dataclass
class Ledger:
    """The accounting of one database."""

    fates: list[Fate] = field(default_factory=list)
    stuck: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    gapped_turns: int = 0

    def of(self, verdict: str) -> list[Fate]:
        return [f for f in self.fates if f.verdict == verdict]

    @property
    def unread(self) -> list[Fate]:
        """Messages not read yet: a later turn will be given them (not at rest)."""
        return [f for f in self.fates if not f.read]

    @property
    def at_rest(self) -> bool:
        """Every message read and no turn running: the count can change no more."""
        return not self.unread and not self.stuck

    @property
    def ok(self) -> bool:
        """Nothing answered twice, nothing lost, no turn stuck."""
        return not self.of("twice") and not self.of("lost") and not self.stuck

    def summary(self) -> str:
        """The printed table: messages, once, twice, lost, set aside, stuck turns."""
        lines = [
            f"messages            {len(self.fates):6d}",
            f"answered once       {len(self.of('once')):6d}",
            f"answered twice      {len(self.of('twice')):6d}   (target 0)",
            f"lost                {len(self.of('lost')):6d}   (target 0)",
            f"set aside (notice)  {len(self.of('set aside')):6d}",
            f"stuck turns         {len(self.stuck):6d}   (target 0)",
            f"turns               {self.turns:6d}   ({self.gapped_turns} with event gaps)",
            f"still unread        {len(self.unread):6d}   (0 at rest)",
        ]
        return "\n".join(lines)

    def details(self, limit: int = 10) -> str:
        """The messages answered twice, lost or still unread and the stuck turns, for a failure."""
        bad = [f for f in self.fates if f.verdict in ("twice", "lost") or not f.read][:limit]
        lines = [
            f"{f.verdict}{'' if f.read else ' (unread)'}: #{f.seq} in room {f.room_id} for "
            f"@{f.handle} (turns {', '.join(f.answered_by) or '-'}): {f.body[:60]!r}"
            for f in bad
        ]
        lines += [
            f"stuck: turn {t['id']} of {t['agent_id']} since {t['started_at']}" for t in self.stuck
        ]
        return "\n".join(lines)

    def unrest(self) -> str:
        """What keeps the database from rest, in a line ("" at rest)."""
        if self.at_rest:
            return ""
        return (
            f"not at rest: {len(self.unread)} message(s) unread "
            f"({', '.join(f'#{f.seq} for @{f.handle}' for f in self.unread[:10])}), "
            f"{len(self.stuck)} turn(s) still running"
        )


def read_ledger(db: Path | str) -> Ledger:
    """Read the database at `db` (a SQLite path or a `postgresql://` URL) and count."""
    tables = _read_tables(db)
    return count(tables)


def count(tables: dict[str, list[dict[str, Any]]]) -> Ledger:
    """The ledger of already-read rows (`messages`, `turns`, `positions`, `rooms`,
    `agents`, `held`: the HELD `tool_use` outputs as `{turn_id, output}`)."""
    rooms = {r["id"]: r for r in tables["rooms"]}
    handles = {a["id"]: a["handle"] for a in tables["agents"]}
    turns_of: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for turn in sorted(tables["turns"], key=lambda t: (t["started_at"], t["id"])):
        turns_of[turn["agent_id"]].append(turn)
    starts = {a: [t["started_at"] for t in ts] for a, ts in turns_of.items()}
    turn_by_id = {t["id"]: t for t in tables["turns"]}

    # The rooms each turn answered (a thread counts for its parent room, as the server's).
    answered: dict[str, set[str]] = defaultdict(set)
    notices: dict[tuple[str, str], list[str]] = defaultdict(list)  # (room, handle) → created_at
    for msg in tables["messages"]:
        room = rooms[msg["room_id"]]
        if msg["author_kind"] == "agent" and msg["kind"] == "normal":
            turn_id = msg.get("turn_id") or _turn_at(
                turns_of[msg["author_id"]], starts.get(msg["author_id"], []), msg["created_at"]
            )
            if turn_id is not None:
                answered[turn_id].add(msg["room_id"])
                if room["parent_room_id"]:
                    answered[turn_id].add(room["parent_room_id"])
        elif msg["kind"] == "notice" and SET_ASIDE in msg["body"]:
            handle = msg["body"].split(SET_ASIDE, 1)[0].removeprefix("@")
            notices[(msg["room_id"], handle)].append(msg["created_at"])

    # What each turn was given: its claim, and what HELD answers showed it.
    given: dict[tuple[str, str], list[tuple[str, int, int]]] = defaultdict(list)
    for turn in tables["turns"]:
        for room in orjson.loads(turn["rooms"]):
            key = (turn["agent_id"], room["room_id"])
            given[key].append((turn["id"], int(room["from_seq"]), int(room["to_seq"])))
    for held in tables["held"]:
        owner = turn_by_id.get(held["turn_id"])
        if owner is None:
            continue
        claimed = [r["room_id"] for r in orjson.loads(owner["rooms"])]
        only = claimed[0] if len(claimed) == 1 else None
        for room_id, seq in held_seqs(held["output"], only):
            given[(owner["agent_id"], room_id)].append((owner["id"], seq, seq))
    _infer_unrecorded(tables, given, turns_of, starts)

    def answering(turn_id: str, room_id: str) -> bool:
        return _answers(turn_by_id[turn_id], room_id, answered)

    _infer_held(tables["messages"], given, turns_of, starts, answering)

    read_at = {(p["agent_id"], p["room_id"]): int(p["read_seq"]) for p in tables["positions"]}
    ledger = Ledger(turns=len(tables["turns"]), gapped_turns=sum(
        1 for t in tables["turns"] if orjson.loads(t["gaps"] or "[]")
    ))  # fmt: skip
    for msg in sorted(tables["messages"], key=lambda m: (m["room_id"], m["seq"])):
        if msg["author_kind"] != "user" or msg["kind"] != "normal":
            continue
        for (agent_id, room_id), read_seq in read_at.items():
            if room_id != msg["room_id"]:
                continue
            by = sorted(
                {
                    turn_id
                    for turn_id, low, high in given.get((agent_id, room_id), [])
                    if low <= msg["seq"] <= high
                    and _answers(turn_by_id[turn_id], room_id, answered)
                },
                key=lambda t: turn_by_id[t]["started_at"],
            )
            handle = handles.get(agent_id, agent_id)
            aside = read_seq >= msg["seq"] and any(
                at >= msg["created_at"] for at in notices.get((room_id, handle), [])
            )
            read = read_seq >= msg["seq"]
            fate = Fate(
                msg["id"],
                room_id,
                msg["seq"],
                agent_id,
                handle,
                msg["body"],
                tuple(by),
                aside,
                read,
            )
            ledger.fates.append(fate)
    ledger.stuck = [t for t in tables["turns"] if t["status"] == "running"]
    return ledger


def held_seqs(output: str, only_room: str | None = None) -> Iterable[tuple[str, int]]:
    """`(room_id, seq)` of each message a HELD answer in a tool's output showed; a
    section cut before its `Reply with:` line counts for `only_room` when given."""
    at = output.find(HELD_FIRST)
    while at >= 0:
        end = output.find(HELD_FIRST, at + 1)
        chunk = output[at : end if end >= 0 else len(output)]
        for section in SECTION.split(chunk)[1:]:
            found = REPLY_WITH.search(section)
            room = found.group(1) if found is not None else only_room
            if room is not None:
                for seq in SEQ_LINE.findall(section):
                    yield room, int(seq)
        at = end


def _infer_held(
    messages: list[dict[str, Any]],
    given: dict[tuple[str, str], list[tuple[str, int, int]]],
    turns_of: dict[str, list[dict[str, Any]]],
    starts: dict[str, list[str]],
    answering: Callable[[str, str], bool] | None = None,
) -> None:
    """Give each user message no answering turn was given to the turn of the agent's next
    message in its room (the HELD answer that showed it is no longer readable: cut at
    4 KiB, or its events lost). A message given only to turns that did not answer the
    room (a failed turn's claim) counts as given to none."""
    by_room: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for msg in messages:
        by_room[msg["room_id"]].append(msg)
    for (agent_id, room_id), ranges in list(given.items()):
        rows = sorted(by_room.get(room_id, []), key=lambda m: m["seq"])
        replies = [m for m in rows if m["author_kind"] == "agent" and m["author_id"] == agent_id]
        for msg in rows:
            if msg["author_kind"] != "user" or any(
                lo <= msg["seq"] <= hi and (answering is None or answering(t, room_id))
                for t, lo, hi in ranges
            ):
                continue
            later = next((r for r in replies if r["seq"] > msg["seq"]), None)
            if later is None:
                continue
            turn_id = later.get("turn_id") or _turn_at(
                turns_of[agent_id], starts.get(agent_id, []), later["created_at"]
            )
            if turn_id is not None:
                ranges.append((turn_id, int(msg["seq"]), int(msg["seq"])))


def _answers(turn: dict[str, Any], room_id: str, answered: dict[str, set[str]]) -> bool:
    return room_id in answered.get(turn["id"], set()) or turn["status"] == "succeeded"


def _turn_at(turns: list[dict[str, Any]], starts: list[str], at: str) -> str | None:
    """The turn that started last at or before `at`."""
    index = bisect.bisect_right(starts, at) - 1
    return str(turns[index]["id"]) if index >= 0 else None


def _infer_unrecorded(
    tables: dict[str, list[dict[str, Any]]],
    given: dict[tuple[str, str], list[tuple[str, int, int]]],
    turns_of: dict[str, list[dict[str, Any]]],
    starts: dict[str, list[str]],
) -> None:
    """A turn that posted in a room but whose tool events never reached the server (its
    Computer killed first): the messages of others between its claim and its first post
    there were shown to it by a HELD answer (the server posts over unseen messages only
    after holding twice, which this cannot tell)."""
    recorded = {r["turn_id"] for r in tables["tool_turns"]}
    by_room: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for msg in tables["messages"]:
        by_room[msg["room_id"]].append(msg)
    for turn in tables["turns"]:
        if turn["id"] in recorded:
            continue
        agent_id = turn["agent_id"]
        for claim in orjson.loads(turn["rooms"]):
            rows = sorted(by_room.get(claim["room_id"], []), key=lambda m: m["seq"])
            posted = [
                m
                for m in rows
                if m["author_kind"] == "agent"
                and m["author_id"] == agent_id
                and m["seq"] > claim["to_seq"]
                and (
                    m.get("turn_id")
                    or _turn_at(turns_of[agent_id], starts[agent_id], m["created_at"])
                )
                == turn["id"]
            ]
            if not posted:
                continue
            # What a later turn of the agent claimed here the server had not read for this
            # one: a HELD answer would have delivered it (and the server read it with the turn).
            later = [
                int(r["from_seq"])
                for t in turns_of[agent_id]
                if t["started_at"] > turn["started_at"]
                for r in orjson.loads(t["rooms"])
                if r["room_id"] == claim["room_id"]
            ]
            bound = min([posted[0]["seq"], *later])
            for msg in rows:
                if msg["author_kind"] == "user" and claim["to_seq"] < msg["seq"] < bound:
                    key = (agent_id, claim["room_id"])
                    given[key].append((turn["id"], int(msg["seq"]), int(msg["seq"])))


# ---------------------------------------------------------------- reading


QUERIES = {
    "rooms": "SELECT id, kind, parent_room_id FROM rooms",
    "agents": "SELECT id, handle FROM agents",
    "positions": "SELECT agent_id, room_id, delivered_seq, read_seq FROM positions",
    "turns": "SELECT id, agent_id, status, rooms, gaps, started_at, finished_at FROM turns",
    "held": "SELECT turn_id, data FROM turn_events WHERE type = 'tool_use' AND data LIKE ?",
    "tool_turns": "SELECT DISTINCT turn_id FROM turn_events WHERE type = 'tool_use'",
}
MESSAGE_COLUMNS = "id, room_id, seq, author_kind, author_id, body, kind, created_at"


def _read_tables(db: Path | str) -> dict[str, list[dict[str, Any]]]:
    text = str(db)
    if text.startswith(("postgresql://", "postgres://")):
        return _read_postgres(text)
    return _read_sqlite(Path(text))


def _read_sqlite(path: Path) -> dict[str, list[dict[str, Any]]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        columns = {r["name"] for r in conn.execute("PRAGMA table_info(messages)")}
        return _tables(lambda sql, args=(): [dict(r) for r in conn.execute(sql, args)], columns)
    finally:
        conn.close()


def _read_postgres(url: str) -> dict[str, list[dict[str, Any]]]:
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(url, row_factory=dict_row) as conn:
        columns = {
            r["column_name"]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'messages' AND table_schema = current_schema()"
            )
        }

        def rows(sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
            return [dict(r) for r in conn.execute(sql.replace("?", "%s").encode(), args)]

        return _tables(rows, columns)


def _tables(rows: Any, message_columns: set[str]) -> dict[str, list[dict[str, Any]]]:
    """Every table the count needs; `turn_id` of messages when the schema has one."""
    wanted = MESSAGE_COLUMNS + (", turn_id" if "turn_id" in message_columns else "")
    tables = {name: rows(sql) for name, sql in QUERIES.items() if name != "held"}
    tables["messages"] = rows(f"SELECT {wanted} FROM messages")
    tables["held"] = [
        {"turn_id": r["turn_id"], "output": str(orjson.loads(r["data"]).get("output") or "")}
        for r in rows(QUERIES["held"], (f"%{HELD_FIRST}%",))
    ]
    return tables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", help="the server's SQLite file or PostgreSQL URL")
    args = parser.parse_args(argv)
    ledger = read_ledger(args.db)
    print(ledger.summary())
    if not ledger.ok:
        print(ledger.details())
    return 0 if ledger.ok else 1


if __name__ == "__main__":
    sys.exit(main())
