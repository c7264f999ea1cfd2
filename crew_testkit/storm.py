"""A storm of user messages through the real processes while faults strike at random.

The real `crew-server` and `crew-computer` (with the real launcher and sandbox, and
the fake engine) run as subprocesses. A poster sends user messages to the DMs of K
agents at a steady rate; a fault injector, on a schedule drawn from the seed, does
one fault at a time:

- `launcher`: kill -9 of the sandbox launcher (the Computer's child);
- `server`: SIGTERM of crew-server, then the same server again on its port and db;
- `disk`: the server's database lives on a small tmpfs (mounted here; root only);
  a filler file takes all its space for a few seconds, then is deleted;
- `computer`: kill -9 of `crew-computer` itself, then a new one on the same crew home.

Then it waits until every stored message is answered or set aside (or a timeout)
and accounts per message. Each message carries a token `{{m00012}}` and a
`FAKE:RUN` line (`answer_command`): the engine replies `answered: m00012 m00013`
naming every token of its turn input, and on HELD sends again naming the held
messages too. A reply thus names exactly the messages the agent answered.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from crew_harness.waiting import wait_until
from crew_testkit.answer_ledger import Ledger, read_ledger
from crew_testkit.computer_proc import (
    ComputerProc,
    Machine,
    bootstrap_for,
    launch,
    launcher_pids,
    machine,
)
from crew_testkit.crew_server_proc import CrewServer, start_crew_server

FAULT_KINDS = ("launcher", "server", "disk", "computer")
TOKEN = re.compile(r"\{\{(m\d{5,})\}\}")
REPLY = re.compile(r"answered:((?: +m\d{5,})*) *")
SET_ASIDE = re.compile(r"could not handle .* and set (it|them) aside")


ANSWER_SCRIPT = "answer.sh"


def answer_script() -> str:
    """The shell script the fake engine runs in a turn (`sh answer.sh ROOM THINK LINGER`):
    one reply naming every token it got.

    The engine's input is in its own dump (`.fake-opencode/<n>.json`, the newest by
    number). A HELD answer lists the messages that came meanwhile (now delivered to
    the agent): their tokens are added and the reply sent again; the third attempt
    is always posted (the server's HELD bound). Any other refusal ends the turn with
    the refusal standing, so the Computer retries the messages. The engine works
    THINK seconds before it replies and LINGER after (a fault may strike in either).
    Every answer of `crew` goes to the tool's output, so a HELD answer is in the
    turn's events (crew_testkit/answer_ledger.py reads what it showed from there);
    the messages name this script rather than carry it, so that output stays short.
    """
    tokens = "grep -o '{{m[0-9]*}}' | tr -d '{}' | sort -u | tr '\\n' ' '"
    return (
        'sleep "$2"; d=.fake-opencode; f=$d/$(ls $d | grep -F .json | sort -n | tail -n 1)\n'
        f"ids=$(cat $f | {tokens})\n"
        "for t in 1 2 3; do\n"
        '  out=$(echo "answered: $ids" | crew reply "$1"); rc=$?; echo "$out"\n'
        "  [ $rc -eq 0 ] && break\n"
        '  case "$out" in "Not sent:"*) ;; *) break;; esac\n'
        f'  ids="$ids $(echo "$out" | {tokens})"\n'
        'done\nsleep "$3"; exit $rc\n'
    )


def answer_command(room_id: str, think_s: float = 0.0, linger_s: float = 0.0) -> str:
    """The `FAKE:RUN` command of a storm message: the agent's `answer_script` in its work dir.

    The command names `crew reply ROOM` too (words the script ignores): the Computer
    tells a refused reply from the commands it sees (failures.ReplyAttempts), and an
    agent's replies are commands it sees."""
    return f"sh {ANSWER_SCRIPT} {room_id} {think_s:g} {linger_s:g} crew reply {room_id}"


def message_body(number: int, handle: str, command: str) -> str:
    """A storm message: its token on the first line, the engine's instruction on the second."""
    return f"storm message {{{{m{number:05d}}}}} for @{handle}\nFAKE:RUN {command}"


@dataclass(frozen=True)
class StormPlan:
    """What to throw at the Computer."""

    messages: int = 500
    agents: int = 10
    seed: int = 1
    faults: tuple[str, ...] = ("launcher", "server", "disk")
    rate: float = 8.0  # user messages per second
    fault_every_s: float = 8.0  # the mean gap between two faults
    fault_counts: Mapping[str, int] | None = None  # exact counts per kind, overriding the gap
    disk_window_s: float = 3.0
    disk_mb: int = 64
    think_s: float = 0.5  # the engine's work before its reply
    linger_s: float = 0.5  # and after it, before the turn ends
    quiet_timeout_s: float = 150.0  # after the last post and fault: until answered and at rest
    clients: int = 1  # posters at once, sharing `rate`
    engine_mode: str = "cold"  # the Computer's engine (the fake engine speaks both)

    def posting_s(self) -> float:
        return self.messages / self.rate


def fault_schedule(plan: StormPlan) -> list[tuple[float, str]]:
    """`[(seconds after the first post, kind)]`: every kind at least once, spread over the posting."""
    rng = random.Random(f"faults-{plan.seed}")
    if plan.fault_counts is not None:
        kinds = [k for k, n in plan.fault_counts.items() for _ in range(n)]
    elif not plan.faults:
        kinds = []
    else:
        total = max(len(plan.faults), round(plan.posting_s() / plan.fault_every_s))
        kinds = []
        while len(kinds) < total:
            cycle = list(plan.faults)
            rng.shuffle(cycle)
            kinds.extend(cycle)
        kinds = kinds[:total]
    rng.shuffle(kinds)
    # Within the posting, away from its very start (the agents' first turns) and end.
    span = plan.posting_s()
    times = sorted(rng.uniform(0.1 * span, 0.9 * span) for _ in kinds)
    return list(zip(times, kinds, strict=True))


@dataclass
class FaultRecord:
    """One fault as it happened."""

    kind: str
    at: datetime  # when it struck (UTC)
    ended: datetime | None = None  # when the thing was back (server up, disk freed, …)
    note: str = ""


@dataclass
class MessageFate:
    """What became of one stored user message."""

    token: str
    room_id: str
    handle: str
    seq: int
    message_id: str
    created_at: str
    answers: list[str] = field(default_factory=list)  # created_at of each reply naming it
    set_aside: bool = False

    @property
    def pending(self) -> bool:
        return not self.answers and not self.set_aside


@dataclass
class StormResult:
    """The accounting of one storm."""

    plan: StormPlan
    fates: list[MessageFate]
    faults: list[FaultRecord]
    posted: int  # posts the server confirmed
    post_refusals: int  # posts refused or unanswered (server away, disk full)
    turns: Counter[str]  # turn statuses
    wall_s: float  # first post → quiet (or the timeout)
    quiet: bool
    computer_exit: int | None
    notes: list[str]
    drain_s: float | None = None  # the last post → quiet
    kept: Path | None = None  # logs kept for a storm that lost messages
    ledger: Ledger | None = None  # the count read from the server's database at the end
    # What kept the database from rest within the quiet timeout ("" at rest): the unread
    # messages, the running turns and what the Computer said of each agent then.
    unrest: str = ""

    @property
    def stored(self) -> int:
        return len(self.fates)

    @property
    def answered(self) -> int:
        return sum(1 for f in self.fates if f.answers)

    @property
    def answered_twice(self) -> list[MessageFate]:
        return [f for f in self.fates if len(f.answers) > 1]

    @property
    def set_aside(self) -> int:
        return sum(1 for f in self.fates if f.set_aside and not f.answers)

    @property
    def lost(self) -> list[MessageFate]:
        return [f for f in self.fates if f.pending]

    def faults_by_kind(self) -> Counter[str]:
        return Counter(f.kind for f in self.faults)

    def repeats_by_fault(self) -> Counter[str]:
        """Each message answered twice, blamed on the last fault between its first two answers."""
        blamed: Counter[str] = Counter()
        for fate in self.answered_twice:
            first, second = (datetime.fromisoformat(a) for a in sorted(fate.answers)[:2])
            between = [f for f in self.faults if first <= f.at <= second]
            blamed[between[-1].kind if between else "no fault"] += 1
        return blamed


# --------------------------------------------------------------- the processes


@contextlib.contextmanager
def small_disk(path: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of `size_mb` mounted at `path` (root only), unmounted at the end."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(path)],
        check=True,
        capture_output=True,
    )
    try:
        yield path
    finally:
        done = subprocess.run(["umount", str(path)], capture_output=True)
        if done.returncode != 0:
            # Something still holds a file there: detach it now, it goes when released.
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill_disk(directory: Path) -> tuple[Path, int]:
    """Write a filler file until the disk is full → (its path, bytes written)."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    written = 0
    try:
        for size in (1 << 20, 1 << 12, 1 << 9):
            chunk = b"\0" * size
            while True:
                try:
                    written += os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return filler, written


class Storm:
    """The server, the Computer and the threads that post and strike; `run()` once."""

    KINDS: tuple[str, ...] = FAULT_KINDS

    def __init__(self, plan: StormPlan, root: Path, m: Machine, say: Callable[[str], None]):
        self.plan = plan
        self.root = root
        self.m = m
        self.say = say
        self.notes: list[str] = []
        self.faults: list[FaultRecord] = []
        self.posted = 0
        self.post_refusals = 0
        self._stop = threading.Event()
        self._count_lock = threading.Lock()
        self._errors: list[BaseException] = []
        self._server_dir = root / "server"
        self._db_dir = root / "db"
        self.server: CrewServer
        self.computer: ComputerProc
        self.computers: list[ComputerProc] = []
        self.rooms: list[tuple[str, str, str]] = []  # (agent id, handle, room id)

    # ---------------------------------------------------------- set-up

    def start(self, db_dir: Path) -> None:
        self._db_dir = db_dir
        self.server = start_crew_server(self._server_dir, db=db_dir / "crew.db")
        comp = self.server.create_computer("storm")
        self.token = str(comp["token"])
        for n in range(self.plan.agents):
            agent = self.server.create_agent(f"storm{n}", computer_id=comp["computer_id"])
            room = self.server.create_room("dm", [agent["id"]])
            self.rooms.append((agent["id"], agent["handle"], room["id"]))
        self.m.log_in()
        self._launch_computer()
        for agent_id, _, _ in self.rooms:
            work = self.m.crew_home / "agents" / agent_id / "work"
            wait_until(f"the work dir of {agent_id}", work.is_dir, 30)
            (work / ANSWER_SCRIPT).write_text(answer_script())

    def _launch_computer(self) -> None:
        bootstrap = bootstrap_for(
            self.server.url, self.token, self.m, engine_mode=self.plan.engine_mode
        )
        self.computer = launch(self.m, bootstrap)
        self.computers.append(self.computer)
        health = wait_until("the launcher's health", self.computer.health_known, 60)
        if not health["sandbox"]["ok"]:
            raise RuntimeError(f"the sandbox is not usable here: {health['sandbox']['reason']}")

    # ---------------------------------------------------------- the storm

    def run(self) -> StormResult:
        schedule = fault_schedule(self.plan)
        t0 = time.monotonic()
        posters = [
            threading.Thread(
                target=self._guard, args=(lambda n=n: self._post_all(n),), name=f"poster-{n}"
            )
            for n in range(max(1, self.plan.clients))
        ]
        striker = threading.Thread(
            target=self._guard, args=(lambda: self._strike(schedule, t0),), name="faults"
        )
        for poster in posters:
            poster.start()
        striker.start()
        for poster in posters:
            poster.join()
        self._posting_ended = time.monotonic()
        striker.join()
        if self._errors:
            raise self._errors[0]
        self.say(
            f"  posted {self.posted} messages ({self.post_refusals} posts refused), "
            f"{len(self.faults)} faults; waiting until every message is answered or set aside"
        )
        # One budget for both waits: answered, then read (a test's timeout bounds the sum).
        deadline = time.monotonic() + self.plan.quiet_timeout_s
        quiet = self._wait_quiet(deadline)
        wall = time.monotonic() - t0
        drain = time.monotonic() - self._posting_ended if quiet else None
        unrest = self._wait_at_rest(deadline)
        code = self.computer.stop()
        fates = self.account()
        ledger = read_ledger(self.server.db)
        turns: Counter[str] = Counter()
        for agent_id, _, _ in self.rooms:
            turns.update(t["status"] for t in self._turns(agent_id))
        return StormResult(
            self.plan, fates, self.faults, self.posted, self.post_refusals, turns, wall,
            quiet, code, self.notes, drain, ledger=ledger, unrest=unrest,
        )  # fmt: skip

    def _guard(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as exc:
            self._errors.append(exc)
            self._stop.set()

    def _post_all(self, poster: int = 0) -> None:
        """Post until the server confirmed `messages` posts, at the plan's rate (shared by
        `clients` posters at once, each numbering its tokens apart)."""
        clients = max(1, self.plan.clients)
        rng = random.Random(
            f"posts-{self.plan.seed}-{poster}" if poster else f"posts-{self.plan.seed}"
        )
        interval = clients / self.plan.rate
        number = poster - clients + 1
        next_at = time.monotonic()
        with httpx.Client(
            base_url=self.server.url, timeout=10.0, headers=self.server.user_headers
        ) as client:
            while self.posted < self.plan.messages and not self._stop.is_set():
                number += clients
                _, handle, room_id = self.rooms[rng.randrange(len(self.rooms))]
                command = answer_command(room_id, self.plan.think_s, self.plan.linger_s)
                body = message_body(number, handle, command)
                try:
                    answer = client.post(
                        f"/api/rooms/{room_id}/messages", json={"body": body, "thread_of": None}
                    )
                    stored = answer.status_code < 300
                except httpx.HTTPError:
                    stored = False
                # A refused post may still be stored (an answer lost in a restart): its
                # token is never reused, and the final count comes from the server.
                with self._count_lock:
                    if stored:
                        self.posted += 1
                    else:
                        self.post_refusals += 1
                next_at += interval
                time.sleep(max(0.0, next_at - time.monotonic()))

    def _strike(self, schedule: Sequence[tuple[float, str]], t0: float) -> None:
        for at, kind in schedule:
            if self._stop.wait(max(0.0, t0 + at - time.monotonic())):
                return
            struck = time.monotonic() - t0
            record = FaultRecord(kind, datetime.now(UTC))
            getattr(self, f"_fault_{kind}")(record)
            record.ended = datetime.now(UTC)
            self.faults.append(record)
            self.say(f"  {struck:6.1f} s  {kind:8s} {record.note}")

    def _fault_launcher(self, record: FaultRecord) -> None:
        parent = self.computer.proc.pid
        # Right after a kill its replacement may still be starting.
        [pid, *_] = wait_until("a sandbox launcher", lambda: launcher_pids(parent), 30)
        os.kill(pid, signal.SIGKILL)
        record.note = f"kill -9 of launcher {pid}"

    def _fault_server(self, record: FaultRecord) -> None:
        port = int(self.server.url.rsplit(":", 1)[1])
        self.server.stop()
        down = random.Random(f"down-{self.plan.seed}-{len(self.faults)}").uniform(0.5, 2.0)
        time.sleep(down)  # the server is away for a moment, as in a real restart
        self.server = start_crew_server(self._server_dir, db=self.server.db, port=port)
        record.note = f"SIGTERM, away {down:.1f} s, started again on port {port}"

    def _fault_disk(self, record: FaultRecord) -> None:
        filler, written = fill_disk(self._db_dir)
        try:
            time.sleep(self.plan.disk_window_s)  # the window the disk stays full
        finally:
            filler.unlink()
        record.note = f"{written // (1 << 20)} MiB filler for {self.plan.disk_window_s:g} s"

    def _fault_computer(self, record: FaultRecord) -> None:
        old = self.computer
        old.proc.kill()
        old.proc.wait(timeout=10)
        self._launch_computer()
        record.note = f"kill -9 of crew-computer {old.proc.pid}, started again"

    # ---------------------------------------------------------- the accounting

    def _wait_at_rest(self, deadline: float) -> str:
        """Wait (until `deadline`) for the database to say every message is read and no
        turn runs (an answered message still unread would be given again); "" then, else
        what is not at rest and what the Computer says of each agent."""
        while True:
            ledger = read_ledger(self.server.db)
            if ledger.at_rest:
                return ""
            if time.monotonic() >= deadline:
                return f"{ledger.unrest()}\n{self.agents_report()}"
            time.sleep(1.0)

    def agents_report(self) -> str:
        """Each agent's row on the Computer (`GET /agents`): state, turn, retry, reason."""
        try:
            rows = self.computer.get("/agents")
        except (httpx.HTTPError, AssertionError) as exc:
            return f"the Computer's /agents did not answer: {exc}"
        keys = ("state", "turn_id", "pending_wake", "retry_at", "last_result", "last_reason")
        lines = [
            f"@{row['handle']}: " + ", ".join(f"{k}={row.get(k)!r}" for k in (*keys, "problem"))
            for row in rows
        ]
        shown = {row["handle"] for row in rows}
        lines += [f"@{h}: no runner on the Computer" for _, h, _ in self.rooms if h not in shown]
        return "\n".join(lines)

    def _wait_quiet(self, deadline: float) -> bool:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if not any(f.pending for f in self.account()):
                    return True
            time.sleep(1.0)
        return False

    def _messages(self, room_id: str) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        while True:
            page = self.server.client().get(
                f"/api/rooms/{room_id}/messages",
                params={"after_seq": got[-1]["seq"] if got else 0, "limit": 1000},
            )
            page.raise_for_status()
            got.extend(page.json())
            if len(page.json()) < 1000:
                return got

    def _turns(self, agent_id: str) -> list[dict[str, Any]]:
        answer = self.server.client().get(
            "/api/turns", params={"agent_id": agent_id, "limit": 1000}
        )
        answer.raise_for_status()
        return list(answer.json())

    def account(self) -> list[MessageFate]:
        """Every stored user message with the replies naming it and whether it was set aside."""
        fates: list[MessageFate] = []
        for agent_id, handle, room_id in self.rooms:
            messages = self._messages(room_id)
            mine: dict[str, MessageFate] = {}
            for msg in messages:
                kind = msg["author"]["kind"]
                if kind == "user":
                    found = TOKEN.search(msg["body"])
                    if found:
                        mine[found.group(1)] = MessageFate(
                            found.group(1), room_id, handle, msg["seq"], msg["id"],
                            msg["created_at"],
                        )  # fmt: skip
                elif kind == "agent" and (reply := REPLY.fullmatch(msg["body"])):
                    for token in set(reply.group(1).split()):
                        if token in mine:
                            mine[token].answers.append(msg["created_at"])
            if any(SET_ASIDE.search(msg["body"]) for msg in messages):
                self._mark_set_aside(agent_id, room_id, list(mine.values()))
            fates.extend(mine.values())
        return fates

    def _mark_set_aside(self, agent_id: str, room_id: str, fates: list[MessageFate]) -> None:
        """Messages in the claim of a turn that set them aside (a notice marks that turn)."""
        notices = [
            m["created_at"]
            for m in self._messages(room_id)
            if m["author"]["kind"] not in ("user", "agent") and SET_ASIDE.search(m["body"])
        ]
        turns = sorted(self._turns(agent_id), key=lambda t: t["started_at"])
        for at in notices:
            # The turn whose ack posted the notice: the last one started before it.
            before = [t for t in turns if t["started_at"] <= at and t["status"] == "failed"]
            if not before:
                continue
            for room in before[-1]["rooms"]:
                if room["room_id"] != room_id:
                    continue
                for fate in fates:
                    if room["from_seq"] <= fate.seq <= room["to_seq"]:
                        fate.set_aside = True

    def lost_report(self, lost: Sequence[MessageFate]) -> str:
        """What the server and the Computer said about lost messages, for the report."""
        lines = []
        for fate in lost[:10]:
            agent_id = next(a for a, h, _ in self.rooms if h == fate.handle)
            lines.append(
                f"{fate.token} (@{fate.handle}, room {fate.room_id}, seq {fate.seq}, "
                f"posted {fate.created_at})"
            )
            for turn in self._turns(agent_id):
                if f"{{{{{fate.token}}}}}" in self.server.turn(turn["id"])["input"]:
                    lines.append(
                        f"    turn {turn['id']} {turn['status']} {turn['failure']} "
                        f"{turn['started_at']} → {turn['finished_at']}"
                    )
            positions = self.server.positions(agent_id)
            lines.append(f"    positions {positions}")
        return "\n".join(lines)


def run_storm(
    plan: StormPlan,
    say: Callable[[str], None] = print,
    keep_on_loss: Path | None = None,
    storm_class: type[Storm] = Storm,
) -> StormResult:
    """Run one storm from start to end; the processes and the disk are gone afterwards.

    With `keep_on_loss`, the server and Computer logs of a storm that lost messages
    (or, by its database, answered one twice or left a turn stuck) are copied there
    (the result's `kept`). `storm_class` may know more fault kinds (its `KINDS`).
    """
    unknown = set(plan.faults) - set(storm_class.KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {storm_class.KINDS}")
    if plan.fault_counts is not None and not set(plan.fault_counts) <= set(plan.faults):
        raise ValueError("fault_counts may only count kinds listed in faults")
    notes: list[str] = []
    if "disk" in plan.faults and os.geteuid() != 0:
        notes.append("the disk-full fault needs root (to mount a small tmpfs): skipped")
        counts = plan.fault_counts
        plan = dataclasses.replace(
            plan,
            faults=tuple(k for k in plan.faults if k != "disk"),
            fault_counts={k: n for k, n in counts.items() if k != "disk"} if counts else None,
        )
    root = Path(tempfile.mkdtemp(prefix="storm-"))
    try:
        with machine() as m:
            storm = storm_class(plan, root, m, say)
            storm.notes.extend(notes)
            with contextlib.ExitStack() as stack:
                db_dir = root / "db"
                if "disk" in plan.faults:
                    db_dir = stack.enter_context(small_disk(db_dir, plan.disk_mb))
                db_dir.mkdir(parents=True, exist_ok=True)
                try:
                    storm.start(db_dir)
                    result = storm.run()
                    if result.lost:
                        say(storm.lost_report(result.lost))
                    bad = result.ledger is not None and not result.ledger.ok
                    if (result.lost or bad) and keep_on_loss is not None:
                        result.kept = _keep_logs(storm, keep_on_loss)
                finally:
                    for computer in storm.computers:
                        with contextlib.suppress(AssertionError):
                            computer.stop(timeout=10)
                    if hasattr(storm, "server"):
                        storm.server.stop()
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _keep_logs(storm: Storm, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    for log in storm._server_dir.glob("*.log"):
        shutil.copy(log, where / log.name)
    for computer in storm.computers:
        shutil.copy(computer.stderr_path, where / computer.stderr_path.name)
    db = Path(str(storm.server.db))
    for part in (db, db.with_name(db.name + "-wal")):
        if part.exists():
            shutil.copy(part, where / part.name)
    return where
