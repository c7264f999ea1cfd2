"""Checks and answer handling every command shares."""

from __future__ import annotations

import re

from crew_shim.client import Answer
from crew_shim.errors import InputError, ServerRefused

TYPE_CHECKING = False  # typing costs ~2 ms to import; annotations are strings here
if TYPE_CHECKING:
    from typing import Any

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def check_id(value: str, *, what: str, source: str = "your turn input") -> str:
    """A UUID (lower-cased), or an InputError naming `what` (`room id`, `message id`…).

    `source` says where the agent finds the right id.
    """
    if _UUID.fullmatch(value.strip()) is None:
        raise InputError(
            f'"{value}" is not a {what} (a UUID like 0b6c1e2a-5d7f-4c1a-9e3b-2f8a6d4c7e10). '
            f"Copy the {what} from {source}."
        )
    return value.strip().lower()


class Refusals:
    """What a 403 and a 404 mean for this call, in words the agent can act on."""

    __slots__ = ("forbidden", "not_found")

    def __init__(self, *, forbidden: str, not_found: str) -> None:
        self.forbidden = forbidden
        self.not_found = not_found


def expect_success(answer: Answer, *, refusals: Refusals, command: str) -> Any:
    """The answer's data when it succeeded; otherwise the ServerRefused to print.

    A `refused` error carries the server's own English sentence, printed as is;
    401, 403 and 404 are translated; anything else names the status.
    """
    if answer.ok:
        return answer.data
    message = answer.error_message
    # `already_done`: the same command was done before (idempotency key); `turn_over`,
    # `wrong_turn`: the turn this crew belongs to cannot write (any more). Each says so.
    if answer.error_code in ("refused", "already_done", "turn_over", "wrong_turn") and message:
        raise ServerRefused(message)
    if answer.status == 401:
        raise ServerRefused(
            "the crew server no longer accepts this agent's token: it expired, so the turn has "
            "probably ended. Stop here; you will be woken again when there is something new."
        )
    if answer.status == 403:
        raise ServerRefused(refusals.forbidden)
    if answer.status == 404:
        raise ServerRefused(refusals.not_found)
    detail = f": {message.rstrip('.')}" if message else ""
    if answer.status in (400, 409, 422):
        raise ServerRefused(
            f"the crew server refused the request (HTTP {answer.status}{detail}). "
            f"Check the command with crew {command} --help."
        )
    if answer.status == 429:
        raise ServerRefused(
            f"the crew server is busy (HTTP 429{detail}). Wait a minute before trying again."
        )
    raise ServerRefused(
        f"the crew server failed (HTTP {answer.status}{detail}). "
        "Try again in a minute; if it keeps failing, tell the user."
    )
