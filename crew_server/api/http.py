"""HTTP plumbing every handler shares: who is calling, the JSON body, query parameters,
JSON answers and the error answers.

A handler is `async def handler(ctx: Context, request: Request) -> Response`; the
`Context` carries what handlers work with (store, clock, hub, scheduler) explicitly.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from crew_server.api.sign_in import SignInCodes
from crew_server.api.stream import EventHub
from crew_server.clock import Clock
from crew_server.errors import (
    ApiError,
    BadJson,
    BadRequest,
    Invalid,
    NotFound,
    TooLarge,
    Unauthorized,
)
from crew_server.scheduler import ReminderScheduler
from crew_server.store import USER, Actor, AgentIdentity, Store
from crew_server.store.turn_binding import HEADER as TURN_HEADER

MAX_BODY = 1024 * 1024
M = TypeVar("M", bound=BaseModel)


EPOCH_HEADER = "Crew-Epoch"


@dataclass(frozen=True)
class Connection:
    """A Computer and the connection epoch its request acts for."""

    computer_id: str
    epoch: int


@dataclass(frozen=True)
class Context:
    """What the handlers work with; `dev` turns the clock hook on (user auth stays on)."""

    store: Store
    clock: Clock
    hub: EventHub
    scheduler: ReminderScheduler
    dev: bool
    ping_seconds: float
    # The web app's one-time sign-in links (minted by the user API, spent by /login).
    sign_in_codes: SignInCodes = field(default_factory=SignInCodes)
    # The URL the server is reached at (crew-server --public-url); None: the request's.
    public_url: str | None = None

    def user(self, request: Request) -> Actor:
        """The user, when the request carries the user token (with --dev too: an agent
        could otherwise act as the user over loopback)."""
        if not self.store.check_user_token(bearer(request)):
            raise Unauthorized("the user token is not valid; use the token printed at first start")
        return USER

    def computer(self, request: Request) -> str:
        """The id of the Computer whose token the request carries (any connection)."""
        return self.store.computer_by_token(bearer(request))

    def connection(self, request: Request) -> Connection:
        """The Computer and the connection epoch (`Crew-Epoch`) a request comes from.

        Every Computer request but `connect` names its connection: one that a newer
        connection with the same token replaced gets 409 `superseded`.
        """
        computer_id = self.computer(request)
        raw = request.headers.get(EPOCH_HEADER)
        if raw is None:
            raise BadRequest(
                f"missing the {EPOCH_HEADER} header; send the epoch POST /computer/connect answered"
            )
        raw = raw.strip()
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 15):
            raise BadRequest(f"the {EPOCH_HEADER} header must be the epoch connect answered")
        epoch = int(raw)
        self.store.check_epoch(computer_id, epoch)
        return Connection(computer_id, epoch)

    def agent(self, request: Request) -> AgentIdentity:
        """The agent whose token the request carries, bound to the turn its `Crew-Turn`
        header names (else to its latest turn: `store.turn_binding`)."""
        return self.store.agent_by_token(bearer(request), request.headers.get(TURN_HEADER))


Endpoint = Callable[[Context, Request], Awaitable[Response]]


def agent_actor(identity: AgentIdentity) -> Actor:
    """The agent as the actor of a task or message change."""
    return Actor("agent", identity.agent_id, identity.handle, identity.turn_id)


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """An orjson-encoded JSON answer."""
    return Response(
        orjson.dumps(data), status_code=status, media_type="application/json", headers=headers
    )


def no_content() -> Response:
    """204."""
    return Response(status_code=204)


async def read_body(request: Request, model: type[M]) -> M:
    """The request's JSON body validated by `model`; 413 over 1 MiB, 400/422 when bad."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadJson("the Content-Length header is not a number")
        if int(declared) > MAX_BODY:
            raise TooLarge("the request body is over 1 MiB; send less")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise TooLarge("the request body is over 1 MiB; send less")
    try:
        return model.model_validate_json(bytes(raw) if raw.strip() else b"{}")
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        if any(err["type"] == "json_invalid" for err in errors):
            raise BadJson(
                f"the request body is not valid JSON ({errors[0]['msg']}); send a JSON object"
            ) from exc
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in errors[:5]
        )
        raise Invalid(f"the request body is invalid: {problems}") from exc


def bearer(request: Request) -> str:
    """The bearer token of the request; Unauthorized when there is none."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing bearer token; send Authorization: Bearer <token>")
    return token.strip()


def int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    """An integer query parameter within [low, high]; 422 otherwise."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise Invalid(f"query parameter {name} must be an integer") from exc
    if not low <= value <= high:
        raise Invalid(f"query parameter {name} must be between {low} and {high}")
    return value


_UUID_RE = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)


def uuid_param(request: Request, name: str) -> str | None:
    """An optional UUID query parameter; 422 when present but not a UUID."""
    raw = request.query_params.get(name)
    if raw is None:
        return None
    if not _UUID_RE.match(raw):
        raise Invalid(f"query parameter {name} must be a UUID")
    return raw


def task_number(request: Request) -> int:
    """The `{number}` path parameter: 422 when not a number, 404 when out of range."""
    raw = request.path_params["number"]
    if not (raw.isascii() and raw.isdigit()):
        raise Invalid("the task number must be a positive integer, like 3")
    number = int(raw)
    if not 1 <= number < 2**53:
        raise NotFound(f"no task #{raw}")
    return number


# ------------------------------------------------------------ error answers


async def api_error(request: Request, exc: Exception) -> Response:
    """A typed error (`crew_server.errors`) as its JSON answer."""
    assert isinstance(exc, ApiError)
    # 503 is for a state that passes (a full disk): say when to come back.
    headers = {"Retry-After": "5"} if exc.status == 503 else None
    return json_response(exc.body(), exc.status, headers=headers)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 (no such route or method) in our error shape."""
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "bad_request")
    message = {
        404: f"no such endpoint {request.url.path}; see openapi/upstream.yaml",
        405: f"{request.method} is not allowed on {request.url.path}",
    }.get(exc.status_code, str(exc.detail))
    body = {"error": {"code": code, "message": message}}
    return json_response(body, exc.status_code, headers=dict(exc.headers or {}))


async def server_error(request: Request, exc: Exception) -> Response:
    """A bug: a 500 in our error shape."""
    # Starlette logs the exception and re-raises it after this answer is sent.
    body = {
        "error": {
            "code": "internal",
            "message": f"the server failed on {request.method} {request.url.path}; "
            "this is a bug of the server, its log has the details",
        }
    }
    return json_response(body, 500)
