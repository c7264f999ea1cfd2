"""Pure domain rules: mentions, who is woken, reminder schedules, mute limits, notices,
whether an agent's model is one its Computer reported.

No I/O here; the store feeds these functions what it read and writes what they decide.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from crew_common.model_id import is_model_id

HANDLE_RE = re.compile(r"^[a-z0-9_-]{1,32}$")
_MENTION_RE = re.compile(r"(?<![A-Za-z0-9_@.-])@([a-z0-9_-]{1,32})")

MUTE_MIN = timedelta(minutes=15)
MUTE_MAX = timedelta(days=7)
EVERY_MIN_SECONDS = 900
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
TASK_STATUSES = ("todo", "in_progress", "in_review", "done")
# The bounds of a turn's usage totals (as `crew_server.models.Usage` accepts them).
USAGE_MAX_COUNT = 2**53
USAGE_MAX_COST = 1e12


def mentioned_ids(body: str, members_by_handle: Mapping[str, str]) -> list[str]:
    """Agent ids @mentioned in `body`, in order of first mention, members only.

    A handle may be followed by punctuation (`@bob,`); `@bob-x` mentions `bob-x`
    when that agent exists, else `bob` when a trailing `-`/`_` was sentence punctuation.
    """
    found: list[str] = []
    for match in _MENTION_RE.finditer(body):
        handle = match.group(1)
        agent_id = members_by_handle.get(handle) or members_by_handle.get(handle.rstrip("-_"))
        if agent_id is not None and agent_id not in found:
            found.append(agent_id)
    return found


@dataclass(frozen=True)
class RoomFacts:
    """What the wake rule needs to know about the room a message went to."""

    kind: str  # dm | group | thread
    members: frozenset[str]  # agent ids: dm/group members; for a thread its followers
    muted: frozenset[str]  # agents that muted this group (active mutes only)


def woken_by_message(room: RoomFacts, author_id: str, mentions: Iterable[str]) -> list[str]:
    """Agents a new normal message wakes (upstream.md "Who is woken"), sorted for determinism.

    dm: the agent. group: every member but the author and those who muted it, unless
    @mentioned. thread: its followers (root author, writers, mentioned) and the mentioned.
    """
    mentioned = set(mentions)
    if room.kind == "group":
        woken = {a for a in room.members if a not in room.muted or a in mentioned}
    elif room.kind == "thread":
        woken = set(room.members) | mentioned
    else:
        woken = set(room.members)
    woken.discard(author_id)
    return sorted(woken)


# The loop guard (issue 24): agent messages wake other agents only so often in a row
# since the user last wrote, and only so many a minute. 3 in a row lets one agent ask
# another (@mention), get the answer and acknowledge it, while a pair answering each
# other forever stops after four turns; 12 a minute is a busy group's pace, not a
# runaway's (the demo's pair wrote about 4 a second).
HOP_LIMIT_DEFAULT = 3
HOP_LIMIT_MAX = 100
RATE_LIMIT_DEFAULT = 12
RATE_LIMIT_MIN = 1
RATE_LIMIT_MAX = 600
RATE_WINDOW = timedelta(minutes=1)
PAUSE_REASONS = ("hops", "rate")


@dataclass(frozen=True)
class LoopFacts:
    """What the loop guard knows of a room when an agent message arrives there."""

    hop_limit: int  # agent messages in a row (since the user wrote) that may wake agents
    rate_limit: int  # agent messages a minute that may
    in_a_row: int  # agent messages since the user last wrote, before this one
    last_minute: int  # agent messages in the past minute, before this one
    paused: bool  # a limit was hit already and nobody wrote since


def loop_pause(facts: LoopFacts) -> str | None:
    """Why an agent message may not wake other agents (`hops`, `rate`, or `paused`: the
    room is paused already); None when it may."""
    if facts.paused:
        return "paused"
    if facts.in_a_row >= facts.hop_limit:
        return "hops"
    if facts.last_minute >= facts.rate_limit:
        return "rate"
    return None


def guarded_wakes(woken: list[str], loop: LoopFacts) -> tuple[list[str], str | None]:
    """Whom an agent's message (or a notice of its action) wakes under the loop guard,
    and the pause it starts (`hops` | `rate`), if any.

    Within the limits: everyone in `woken` (mentions included). Beyond them: nobody; it
    starts a pause only when it would have woken someone (a message that concerns nobody,
    e.g. in a dm, is no loop) and none is on already.
    """
    why = loop_pause(loop)
    if why is None:
        return woken, None
    return [], (why if woken and why != "paused" else None)


def woken_by_agent_message(
    room: RoomFacts, author_id: str, mentions: Iterable[str], loop: LoopFacts
) -> tuple[list[str], str | None]:
    """`woken_by_message` for an agent's message, under the loop guard (`guarded_wakes`)."""
    return guarded_wakes(woken_by_message(room, author_id, mentions), loop)


def loop_pause_notice(reason: str, loop: LoopFacts) -> str:
    """The one notice a room gets when agents are paused there."""
    head = "Agents paused here until someone writes"
    if reason == "hops":
        count = loop.in_a_row + 1
        what = "1 agent message" if count == 1 else f"{count} agent messages"
        return f"{head} ({what} in a row; this room's hop limit is {loop.hop_limit})"
    return (
        f"{head} ({loop.last_minute + 1} agent messages within a minute; this room allows "
        f"{loop.rate_limit})"
    )


def check_mute_until(until: datetime | None, now: datetime) -> None:
    """Raise ValueError with an English reason when `until` is outside 15 minutes – 7 days."""
    if until is None:
        return
    ahead = until - now
    if ahead < MUTE_MIN - timedelta(seconds=5):
        raise ValueError("a mute must last at least 15 minutes; give a later `until`")
    if ahead > MUTE_MAX + timedelta(seconds=5):
        raise ValueError("a mute can last at most 7 days; give an earlier `until` or none")


def zone_of(tz: str | None) -> tzinfo:
    """An IANA zone name or a `+HH:MM` offset; UTC when absent. ValueError when unknown."""
    if tz is None or tz in ("", "UTC", "Z"):
        return UTC
    offset = re.fullmatch(r"([+-])(\d{2}):?(\d{2})", tz)
    if offset:
        sign = 1 if offset.group(1) == "+" else -1
        hours, minutes = int(offset.group(2)), int(offset.group(3))
        if hours > 23 or minutes > 59:
            raise ValueError(f"time zone offset {tz!r} is out of range")
        return timezone(sign * timedelta(hours=hours, minutes=minutes))
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {tz!r}; use an IANA name or +HH:MM") from exc


def parse_hhmm(text: str) -> tuple[int, int]:
    """`HH:MM` → (hour, minute); ValueError when malformed."""
    match = re.fullmatch(r"(\d{1,2}):(\d{2})", text)
    if not match or int(match.group(1)) > 23 or int(match.group(2)) > 59:
        raise ValueError(f"time {text!r} is not HH:MM (00:00 to 23:59)")
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True)
class Schedule:
    """When a reminder fires: once at `at`, or every N seconds, daily or weekly."""

    at: datetime | None = None
    every: int | None = None
    daily: str | None = None
    weekly_day: str | None = None
    weekly_time: str | None = None
    tz: str | None = None

    @property
    def recurring(self) -> bool:
        return self.at is None


def first_fire(schedule: Schedule, now: datetime) -> datetime:
    """The first time a new reminder fires (`every` starts one period from now)."""
    if schedule.at is not None:
        return schedule.at
    if schedule.every is not None:
        return now + timedelta(seconds=schedule.every)
    return _next_wall_time(schedule, now)


def next_fire(schedule: Schedule, fired_at: datetime, now: datetime) -> datetime | None:
    """When a recurring reminder fires next after firing at `fired_at`; None for one-off.

    Missed periods are skipped: the next time is always after `now`.
    """
    if schedule.at is not None:
        return None
    if schedule.every is not None:
        period = timedelta(seconds=schedule.every)
        nxt = fired_at + period
        if nxt <= now:
            missed = (now - nxt) // period + 1
            nxt += missed * period
        return nxt
    return _next_wall_time(schedule, now)


def _next_wall_time(schedule: Schedule, now: datetime) -> datetime:
    """The next daily/weekly wall-clock time strictly after `now`, in the schedule's zone."""
    zone = zone_of(schedule.tz)
    hhmm = schedule.daily if schedule.daily is not None else schedule.weekly_time
    assert hhmm is not None, "a daily or weekly schedule has a time"
    hour, minute = parse_hhmm(hhmm)
    local_now = now.astimezone(zone)
    for days in range(0, 9):
        day = (local_now + timedelta(days=days)).date()
        if schedule.weekly_day is not None and WEEKDAYS[day.weekday()] != schedule.weekly_day:
            continue
        candidate = datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone)
        if candidate.astimezone(UTC) > now:
            return candidate.astimezone(UTC)
    raise AssertionError("a weekly time always occurs within 8 days")


def reminder_notice(handle: str, title: str) -> str:
    """The notice a due reminder posts in its room."""
    return f"Reminder from @{handle}: {title}"


def set_aside_notice(handle: str, count: int, reason: str) -> str:
    """The notice in a room whose messages an agent could not handle and gave up on."""
    what, them = ("1 message", "it") if count == 1 else (f"{count} messages", "them")
    return f"@{handle} could not handle {what} here and set {them} aside unanswered: {reason}"


def actor_text(handle: str | None) -> str:
    """How a notice names who acted: `@alice` or `User`."""
    return f"@{handle}" if handle else "User"


def task_notice(action: str, number: int, actor: str, *, detail: str = "", note: str = "") -> str:
    """A notice in a task's thread: `@alice moved task #3 to in_review: note`."""
    texts = {
        "created": f"{actor} created task #{number}{detail}.",
        "claimed": f"{actor} claimed task #{number}.",
        "status": f"{actor} moved task #{number} to {detail}.",
        "assigned": f"{actor} assigned task #{number} to {detail}.",
        "unassigned": f"{actor} unassigned task #{number}.",
    }
    text = texts[action]
    return f"{text[:-1]}: {note}" if note else text


def agent_status(
    last_turn_status: str | None, budget_state: Mapping[str, object] | None = None
) -> str:
    """idle | replying | error, from the agent's most recent turn; budget while a reached
    cap holds its turns (and none runs)."""
    if last_turn_status != "running" and budget_state is not None and budget_state["held"]:
        return "budget"
    if last_turn_status == "running":
        return "replying"
    if last_turn_status == "failed":
        return "error"
    return "idle"


def usage_from_events(events: Iterable[Mapping[str, object]]) -> dict[str, float]:
    """Usage totals summed over `step_finish` events (when the finish carries none)."""
    totals: dict[str, float] = {
        "input_tokens": 0,
        "output_tokens": 0,
        "reasoning_tokens": 0,
        "cache_read": 0,
        "cache_write": 0,
        "cost": 0.0,
    }

    def counted(value: object, high: float) -> float | None:
        # Numbers a broken engine line could carry (negative, NaN, huge) are not summed.
        if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= high:
            return value  # NaN fails the comparison
        return None

    for event in events:
        if event.get("type") != "step_finish":
            continue
        data = event.get("data")
        if not isinstance(data, Mapping):
            continue
        tokens = data.get("tokens")
        if isinstance(tokens, Mapping):
            for src, dst in (
                ("input", "input_tokens"),
                ("output", "output_tokens"),
                ("reasoning", "reasoning_tokens"),
                ("cache_read", "cache_read"),
                ("cache_write", "cache_write"),
            ):
                if (value := counted(tokens.get(src), USAGE_MAX_COUNT)) is not None:
                    totals[dst] = min(totals[dst] + value, USAGE_MAX_COUNT)
        if (cost := counted(data.get("cost"), USAGE_MAX_COST)) is not None:
            totals["cost"] = min(totals["cost"] + cost, USAGE_MAX_COST)
    return totals


@dataclass(frozen=True)
class ModelCheck:
    """What the server says about an agent's model on its Computer.

    `refusal` (with the `nearest` reported models) refuses the change; `unchecked`
    says why an accepted model could not be checked against a list.
    """

    refusal: str | None = None
    nearest: tuple[str, ...] = ()
    unchecked: str | None = None


NEAREST_MODELS = 5
_PICK = (
    "Pick one of the models the agent's Computer reported (`models` in GET /api/computers; "
    "`opencode models` on that machine lists the same)"
)


def check_model(model: str, computer: str | None, reported: Sequence[str]) -> ModelCheck:
    """Whether `model` may be the model of an agent on `computer` (its name; None: no
    Computer), which reported `reported` (empty: nothing reported yet).

    Ids that are not `provider/model` are always refused; a model missing from a
    non-empty list is refused with the nearest ones. With no list to compare, the
    model is accepted and `unchecked` says so: agents are usually created before
    their Computer first connects.
    """
    nearest = tuple(nearest_models(model, reported))
    if not is_model_id(model):
        shown = model if len(model) <= 80 else model[:79] + "…"
        return ModelCheck(
            f"the model {shown!r} is not a model id OpenCode can use: ids are "
            f"`provider/model`, e.g. `anthropic/claude-sonnet-4-5`. {_PICK}"
            + _nearest_text(nearest),
            nearest,
        )
    if computer is None:
        return ModelCheck(unchecked="the model was not checked: the agent has no Computer yet")
    if not reported:
        return ModelCheck(
            unchecked=f"the model was not checked: Computer {computer!r} has not reported "
            "its models yet (it does when it connects). If the model is unknown there, the "
            "agent's turns fail with `model_unavailable`"
        )
    if model in reported:
        return ModelCheck()
    return ModelCheck(
        f"Computer {computer!r} did not report the model {model!r}. {_PICK}"
        + _nearest_text(nearest),
        nearest,
    )


def nearest_models(model: str, reported: Sequence[str]) -> list[str]:
    """The reported models closest to `model`, best first (a bare `gpt-4o` finds
    `openai/gpt-4o`: the part after `provider/` is compared too)."""
    bare = model.split("/", 1)[-1]
    scores: dict[str, float] = {}
    for candidate in reported:
        score = max(_similarity(model, candidate), _similarity(bare, candidate.split("/", 1)[-1]))
        if score >= _NEAR:
            scores[candidate] = score
    return sorted(scores, key=lambda c: (-scores[c], c))[:NEAREST_MODELS]


_NEAR = 0.6


def _similarity(a: str, b: str) -> float:
    """difflib's ratio, skipping the full comparison when the cheap bounds rule it out
    (as `difflib.get_close_matches` does): a Computer may report 2,000 models."""
    matcher = difflib.SequenceMatcher(None, a, b)
    if matcher.real_quick_ratio() < _NEAR or matcher.quick_ratio() < _NEAR:
        return 0.0
    return matcher.ratio()


def _nearest_text(nearest: Sequence[str]) -> str:
    return f"; the nearest: {', '.join(nearest)}" if nearest else ""
