"""`Idempotency-Key` on agent writes: the same key again gets the first answer.

`crew` sends a key derived from the command and its request (crew_shim/client.py), so a
retry, a request a paused server takes late, or the agent running the same command again
in the same turn is done once. The server scopes a key to the agent and the turn the write
is bound to (the `Crew-Turn` identity, else its latest turn: `store.turn_binding`) and
keeps it 48 h (`store.writes.KEEP`).
"""

from __future__ import annotations

import hashlib

from starlette.requests import Request
from starlette.responses import Response

from crew_server.api.http import MAX_BODY, Context, Endpoint
from crew_server.errors import BadRequest, Conflict, TooLarge
from crew_server.store.writes import PENDING, DuplicateWrite, EarlierWrite, PendingWrite

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY = 200


class KeyReused(Conflict):
    """The key was used before with another request."""

    code = "idempotency_key_reused"


class AlreadyDone(Conflict):
    """The key's write was done but its answer is not stored (yet)."""

    code = "already_done"


def idempotent(handler: Endpoint) -> Endpoint:
    """`handler` done once per `Idempotency-Key` (a request without the header as before)."""

    async def endpoint(ctx: Context, request: Request) -> Response:
        key = request.headers.get(HEADER)
        if key is None:
            return await handler(ctx, request)
        key = check_key(key)
        identity = ctx.agent(request)
        agent_id, turn_id = identity.agent_id, identity.turn_id or ""
        print_ = fingerprint(request.method, request.url.path, await _body(request))
        earlier = ctx.store.earlier_write(agent_id, turn_id, key)
        if earlier is not None:
            return replay(earlier, print_)
        # Done before: replayed above. Not yet, but its turn is over and a newer one has
        # its messages: refused (the reply checks again inside its own transaction).
        ctx.store.refuse_late_write(identity.turn_id)
        token = PENDING.set(PendingWrite(agent_id, turn_id, key, print_))
        try:
            response = await handler(ctx, request)
        except DuplicateWrite:
            # Another request with this key committed between our look and our write.
            earlier = ctx.store.earlier_write(agent_id, turn_id, key)
            assert earlier is not None
            return replay(earlier, print_)
        finally:
            PENDING.reset(token)
        if 200 <= response.status_code < 300:
            ctx.store.keep_write_answer(
                agent_id, turn_id, key, response.status_code, bytes(response.body).decode()
            )
        return response

    return endpoint


def check_key(raw: str) -> str:
    """The key as sent: 1 to 200 visible ASCII characters (no spaces)."""
    key = raw.strip()
    if not key or len(key) > MAX_KEY or not all("!" <= c <= "~" for c in key):
        raise BadRequest(
            f"the {HEADER} header must be 1 to {MAX_KEY} visible ASCII characters; "
            "send the key crew derives, or leave the header out"
        )
    return key


def fingerprint(method: str, path: str, body: bytes) -> str:
    """What a key stands for: the method, the path and the exact body."""
    return hashlib.sha256(b"%s %s\n%s" % (method.encode(), path.encode(), body)).hexdigest()


def replay(earlier: EarlierWrite, print_: str) -> Response:
    """The first answer of the key's write; refused when the key meant another request."""
    if earlier.fingerprint != print_:
        raise KeyReused(
            f"this {HEADER} was used before for a different request, so nothing was done. "
            "Send a new key for a new request (crew derives one per command and body)"
        )
    if earlier.status is None or earlier.answer is None:
        raise AlreadyDone(
            "this request was already received and done (its first answer was not kept: "
            "the server stopped in between); nothing was done again, do not send it again"
        )
    return Response(
        earlier.answer.encode(),
        status_code=earlier.status,
        media_type="application/json",
        headers={REPLAYED_HEADER: "true"},
    )


async def _body(request: Request) -> bytes:
    """The raw body (kept by Starlette for the handler's own read); 413 over 1 MiB."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise TooLarge("the request body is over 1 MiB; send less")
    return await request.body()
