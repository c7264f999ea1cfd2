"""Why an OpenCode run failed: a pure classification (computer.md §3 "Classifying failures").

Input is what the run left behind — exit status, the launcher's reason, the
last `error` event, whether stdout was empty, the last 64 KiB of stderr — and
the output is a `Failure` with a fixed class and a short English reason, or
None for success. Reasons are redacted: no agent directory path, no token.
`model_id_failure` checks a model id before any run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from computer_service.engine.base import EngineEvent, Failure, FailureClass
from computer_service.engine.user_opencode import NO_KEY_HINT
from crew_common.model_id import is_model_id
from crew_shim.reply import HELD_FIRST

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RATE_LIMIT = re.compile(r"rate.?limit|too many requests|quota", re.IGNORECASE)
_MODEL_NOT_FOUND = re.compile(r"Model not found: ?([^\s\"'\\]*)")
_SESSION_NOT_FOUND = "Session not found"
# What the sandbox's own tools print when they cannot set up a run (before OpenCode starts):
# bubblewrap, the Landlock helper (sandbox_launcher/landlock.py), the run's cgroup
# (sandbox_launcher/limits.py), macOS sandbox-exec.
_SANDBOX_SETUP = re.compile(r"^(?:bwrap|crew-landlock|crew-cgroup|sandbox-exec): ")
_REASON_LIMIT = 500
# The launcher ended the run at a resource limit (sandbox_launcher/limits.py).
_LIMIT_HITS = {
    "process_limit": "started more processes and threads than a turn may have "
    "(turn_limits.max_processes in the Computer's bootstrap; a fork bomb or a runaway build?)",
    "memory_limit": "used more memory than a turn may have "
    "(turn_limits.memory_mb in the Computer's bootstrap)",
    "shm_full": "filled its /dev/shm (turn_limits.shm_mb in the Computer's bootstrap)",
    "disk_limit": "filled its disk allowance: its directories (work/ and the rest) reached "
    "turn_limits.disk_mb of the Computer's bootstrap; delete what it no longer needs "
    "from work/, or raise the limit",
}


@dataclass(frozen=True)
class RunOutcome:
    """What one engine process left behind, as the launcher reported it."""

    exit_code: int | None
    signal: int | None
    launcher_reason: str | None  # None, "stopped", "output_too_large" or a `_LIMIT_HITS` key
    last_error: EngineEvent | None
    stdout_empty: bool
    stderr_tail: str


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace every occurrence of each secret (paths, tokens) in `text`.

    Each becomes `<redacted>`. Longer secrets go first so a path inside
    another is replaced whole; anything shorter than 4 characters is ignored
    (it would shred ordinary words).
    """
    for secret in sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, "<redacted>")
    return text


def _short(text: str) -> str:
    text = " ".join(_ANSI.sub("", text).split())
    return text if len(text) <= _REASON_LIMIT else text[: _REASON_LIMIT - 1] + "…"


def _last_error_line(stderr: str) -> str:
    """The most telling stderr line: the last `Error:` line, else the last non-empty one."""
    lines = [_ANSI.sub("", x).strip() for x in stderr.splitlines()]
    lines = [x for x in lines if x]
    for line in reversed(lines):
        if line.startswith("Error:") or "level=ERROR" in line:
            return line
    return lines[-1] if lines else ""


def classify(outcome: RunOutcome, secrets: Iterable[str] = ()) -> Failure | None:
    """Classify a finished run; None when it succeeded.

    Order matters: the launcher's own verdicts first, then what OpenCode said
    (its `error` event, then its `--print-logs` stderr), then the bare exit.
    """
    failure = _classify(outcome)
    if failure is None:
        return None
    return Failure(failure.cls, _short(redact(failure.reason, secrets)))


def _classify(o: RunOutcome) -> Failure | None:
    if o.launcher_reason == "stopped":
        return Failure(FailureClass.STOPPED, "the turn was stopped")
    if o.launcher_reason == "output_too_large":
        return Failure(
            FailureClass.OUTPUT_TOO_LARGE,
            "OpenCode printed more than the output limit (8 MiB); the run was ended. "
            "Ask the agent for shorter tool output.",
        )

    if o.launcher_reason in _LIMIT_HITS:
        return Failure(
            FailureClass.RESOURCE_LIMIT,
            f"the turn {_LIMIT_HITS[o.launcher_reason]}, so it was ended; raise the limit if "
            "the agent's work needs more. The messages are kept.",
        )

    if o.exit_code == 0 and o.signal is None and o.last_error is None:
        return None

    if o.stdout_empty and o.signal is None and (setup := _sandbox_setup_line(o.stderr_tail)):
        return Failure(
            FailureClass.SANDBOX,
            f"the sandbox could not start OpenCode ({setup}); check the sandbox in the "
            "Computer's /health, and that the agent's directories were not changed by hand. "
            "The messages are kept.",
        )

    model = _MODEL_NOT_FOUND.search(o.stderr_tail)
    if model:
        name = model.group(1).rstrip(".") or "the configured model"
        return Failure(
            FailureClass.MODEL_UNAVAILABLE,
            f"model not found: {name}. Pick a model from `opencode models` for this agent.",
        )

    if o.last_error is not None:
        return _classify_error_event(o.last_error)

    if o.exit_code == 1 and o.stdout_empty and _SESSION_NOT_FOUND in o.stderr_tail:
        return Failure(
            FailureClass.SESSION_INVALID,
            "the saved OpenCode session no longer exists; a new session is needed",
        )

    if o.signal is not None:
        how = f"was killed by signal {o.signal}"
    else:
        how = f"exited with code {o.exit_code}"
    detail = _last_error_line(o.stderr_tail)
    reason = f"OpenCode {how}" + (f": {detail}" if detail else " with no error message")
    return Failure(FailureClass.PROCESS_CRASHED, reason)


def _sandbox_setup_line(stderr: str) -> str | None:
    """The last line a sandbox tool printed about a run it could not set up, if any."""
    lines = [_ANSI.sub("", x).strip() for x in stderr.splitlines()]
    return next((x for x in reversed(lines) if _SANDBOX_SETUP.match(x)), None)


def model_id_failure(model: str) -> Failure | None:
    """`model_unavailable` for a model id OpenCode cannot take (not `provider/model`); else None.

    Checked before a run: the launcher would refuse it, and the user would read
    a sandbox refusal where they need to pick another model.
    """
    if is_model_id(model):
        return None
    shown = model if len(model) <= 80 else model[:79] + "…"
    return Failure(
        FailureClass.MODEL_UNAVAILABLE,
        _short(
            f"the model {shown!r} is not a model id OpenCode can use: ids are "
            "`provider/model`, e.g. `anthropic/claude-sonnet-4-5`. Pick one of the models "
            "this Computer reported (the model list in the agent's settings, or "
            "`opencode models` on this machine) and set it as the agent's model."
        ),
    )


def _classify_error_event(event: EngineEvent) -> Failure:
    name = str(event.data.get("name") or "Error")
    message = str(event.data.get("message") or "no message")
    status = (event.facts or {}).get("status_code")
    if name == "APIError":
        if status == 401:
            return Failure(
                FailureClass.NOT_LOGGED_IN,
                f"the model provider refused the credentials (HTTP 401: {message}). "
                f"Log in again with `opencode auth login`. {NO_KEY_HINT}",
            )
        if status == 429 or _RATE_LIMIT.search(message):
            return Failure(
                FailureClass.RATE_LIMITED,
                f"the model provider is rate limiting requests ({message}). "
                "The messages are kept and handled at the next wake-up.",
            )
        code = f"HTTP {status}: " if status is not None else ""
        return Failure(FailureClass.ENGINE_ERROR, f"the model call failed ({code}{message})")
    return Failure(FailureClass.ENGINE_ERROR, f"OpenCode reported {name}: {message}")


# --- what a failure means for the messages of the turn -----------------------

# The surroundings failed: the same messages will do once they are back.
ENVIRONMENT_CLASSES = frozenset(
    {
        FailureClass.NOT_LOGGED_IN,
        FailureClass.RATE_LIMITED,
        FailureClass.MODEL_UNAVAILABLE,
        FailureClass.SANDBOX,
    }
)
# Something about these messages may make every turn fail: isolate, then set aside.
CONTENT_CLASSES = frozenset(
    {
        FailureClass.ENGINE_ERROR,
        FailureClass.PROCESS_CRASHED,
        FailureClass.OUTPUT_TOO_LARGE,
        FailureClass.RESOURCE_LIMIT,
        FailureClass.REPLY_REFUSED,
    }
)
# The closing clause of a reason that says the messages wait for the next turn: not
# true of messages set aside, so the set-aside notice leaves it out.
_KEPT = re.compile(r"[.;]?\s*the messages are kept[^.;]*[.;]?\s*$", re.IGNORECASE)
_CREW_REPLY = re.compile(r"(?:^|[\s;&|(`]|/)crew\s+reply(?=\s|$)([^\n]*)")
_SHELL_STOP = re.compile(r"[<>;&|`)]")


def blames_environment(failure: Failure) -> bool:
    """True when the failure is the surroundings' (retry as is), False when maybe the content's.

    `stopped` and `session_invalid` are neither: the caller does not retry them by itself.
    """
    return failure.environment or failure.cls in ENVIRONMENT_CLASSES


def blames_content(failure: Failure) -> bool:
    """True when the messages themselves may be why the turn failed."""
    return not failure.environment and failure.cls in CONTENT_CLASSES


def set_aside_reason(failure: Failure) -> str:
    """Why messages were set aside, for the notice in their room: class and reason, without
    the clause that says they are kept (they are not: nobody will answer them)."""
    reason = _KEPT.sub("", failure.reason).rstrip(" .;") or failure.reason
    return f"{failure.cls.value}: {reason}"[:500]


def _reply_room(arguments: str) -> str:
    """The room id of one `crew reply` command line ("" when it cannot be told)."""
    words = _SHELL_STOP.split(arguments, maxsplit=1)[0].split()
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == "--thread":
            skip = True
        elif not word.startswith("-"):
            return word.strip("'\"")
    return ""


class ReplyAttempts:
    """Whether the agent's `crew reply` calls in one turn ended refused. Pure; fed event by event.

    A bash call whose command runs `crew reply` and which failed (non-zero exit,
    or a tool error) is a refusal for its room: an expired token, the server
    down. A later `crew reply` to the same room that exits 0 clears it. A HELD
    answer (`Not sent: new messages arrived…`, exit 1) is no refusal: the agent
    was shown the news and told it may do nothing, so a turn whose last reply
    in a room was HELD succeeds (issue 20). A turn that never ran `crew reply`
    is not refused: staying silent is the agent's choice.
    """

    def __init__(self) -> None:
        self.refusals: dict[str, str] = {}  # room id → the first line the refusal printed
        self.answered: set[str] = set()  # rooms a `crew reply` got through to
        self.held: set[str] = set()  # rooms whose last `crew reply` was HELD

    def answered_all(self, rooms: set[str]) -> bool:
        """Whether every one of `rooms` got a reply through and none ended refused."""
        return bool(rooms) and not self.refusals and rooms <= self.answered

    def see(self, event: EngineEvent) -> None:
        """Take one engine event of the turn into account."""
        if event.type != "tool_use" or event.data.get("tool") != "bash":
            return
        command = event.data.get("input", {}).get("command")
        if not isinstance(command, str):
            return
        rooms = [_reply_room(m.group(1)) for m in _CREW_REPLY.finditer(command)]
        if not rooms:
            return
        exit_code = (event.facts or {}).get("exit")
        if event.data.get("failed") or (isinstance(exit_code, int) and exit_code != 0):
            output = str(event.data.get("output") or "")
            first = next((line.strip() for line in output.splitlines() if line.strip()), "")
            for room in rooms:
                if first == HELD_FIRST:
                    self.refusals.pop(room, None)
                    self.held.add(room)
                else:
                    self.refusals[room] = first or "no output"
                    self.held.discard(room)
        else:
            for room in rooms:
                self.refusals.pop(room, None)
                self.held.discard(room)
                self.answered.add(room)

    def failure(self) -> Failure | None:
        """The `reply_refused` failure, when a room's last `crew reply` of the turn was refused."""
        if not self.refusals:
            return None
        refusal = next(iter(self.refusals.values()))
        return Failure(
            FailureClass.REPLY_REFUSED,
            _short(
                f"the agent's crew reply was refused and never got through ({refusal}); "
                "the messages are kept"
            ),
        )
