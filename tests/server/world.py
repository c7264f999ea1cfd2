"""`World`: a small driver for the in-process reference server used by the server tests."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from pydantic import BaseModel, TypeAdapter

from crew_server import models as m
from crew_server.api.operation import Op
from crew_server.api.routes import OPS
from crew_server.clock import Clock
from crew_server.store import Store

_OPERATIONS = [
    (op.method.upper(), re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", op.path) + "$"), op)
    for op in OPS
]


def _operation(method: str, path: str) -> Op | None:
    return next((op for verb, rx, op in _OPERATIONS if verb == method and rx.match(path)), None)


def _shape(value: Any) -> Any:
    """The key structure of a JSON value (dict keys, recursively), for an exact-fields check."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return None


def _conforms(model: Any, data: Any, what: str) -> None:
    """`data` validates as `model` and carries no field the model does not describe."""
    adapter: TypeAdapter[Any] = TypeAdapter(model)
    parsed = adapter.validate_python(data)
    dumped = adapter.dump_python(parsed, mode="json", by_alias=True, exclude_unset=True)
    assert _shape(dumped) == _shape(data), f"{what}: fields beyond {model}: {data}"


def check_answer(response: httpx.Response) -> None:
    """Every answer of the app matches openapi/upstream.yaml's models, field for field.

    The app builds plain dicts for speed; this holds them to the documented shapes in
    every server test (schemathesis only samples them).
    """
    request = response.request
    what = f"{request.method} {request.url.path} → {response.status_code}"
    if response.status_code == 204:
        assert response.content == b"", what
        return
    assert response.headers["content-type"] == "application/json", what
    body = orjson.loads(response.content)
    if response.status_code >= 400:
        model: Any = m.HeldAnswer if isinstance(body, dict) and body.get("held") else m.ErrorAnswer
        _conforms(model, body, what)
        return
    op = _operation(request.method, request.url.path)
    assert op is not None, f"{what}: not in openapi/upstream.yaml"
    assert op.answer is not None, what
    statuses = {op.status, *(int(s) for s in op.extra)}
    assert response.status_code in statuses, f"{what}: documented {sorted(statuses)}"
    answer: type[BaseModel] = op.answer
    _conforms(list[answer] if op.many else answer, body, what)  # type: ignore[valid-type]


@dataclass
class Computer:
    id: str
    token: str
    epoch: int = 0  # of its latest connect; every other Computer call carries it

    @property
    def headers(self) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.token}"}
        if self.epoch:
            headers["Crew-Epoch"] = str(self.epoch)
        return headers


def turn_registration(rooms: list[dict[str, Any]], model: str = "m/x") -> dict[str, Any]:
    """The body registering a turn for what a claim handed out (the runner's order:
    claim, then register these rooms' ranges)."""
    return {
        "rooms": [
            {
                "room_id": r["room"]["id"],
                "from_seq": r["messages"][0]["seq"],
                "to_seq": r["messages"][-1]["seq"],
            }
            for r in rooms
        ],
        "input": "turn input",
        "engine": "opencode",
        "model": model,
    }


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class World:
    """Users, Computers and agents acting on one app; asserts every call it expects to succeed."""

    def __init__(
        self, client: httpx.AsyncClient, store: Store, clock: Clock, user_token: str
    ) -> None:
        self.client = client
        self.store = store
        self.clock = clock
        self.user_token = user_token

    @classmethod
    @asynccontextmanager
    async def open(cls, app: Any, store: Store, clock: Clock) -> AsyncIterator[World]:
        """A client on `app` that sends the user token (created here) unless a call passes
        its own `Authorization` (a Computer's or an agent's token)."""

        async def checked(response: httpx.Response) -> None:
            await response.aread()
            check_answer(response)

        user_token = store.ensure_user_token()
        assert user_token is not None, "World.open wants a store without a user token yet"
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://crew.test",
            headers=bearer(user_token),
            event_hooks={"response": [checked]},
        ) as client:
            yield cls(client, store, clock, user_token)

    async def ok(self, method: str, path: str, *, status: int | None = None, **kw: Any) -> Any:
        response = await self.client.request(method, path, **kw)
        expected = (status,) if status is not None else (200, 201, 204)
        assert response.status_code in expected, (
            f"{method} {path}: {response.status_code} {response.text}"
        )
        return response.json() if response.content else None

    # ------------------------------------------------------------ set-up

    async def computer(self, name: str = "box", connect: bool = True) -> Computer:
        made = await self.ok("POST", "/api/computers", json={"name": name}, status=201)
        computer = Computer(made["computer_id"], made["token"])
        if connect:
            await self.connect(computer)
        return computer

    async def connect(self, computer: Computer) -> int:
        body = {"hostname": "h", "platform": "linux", "version": "1", "capacity": 2}
        answer = await self.ok("POST", "/computer/connect", json=body, headers=computer.headers)
        computer.epoch = int(answer["epoch"])
        return computer.epoch

    async def agent(self, handle: str, computer: Computer | None) -> dict[str, Any]:
        body = {
            "handle": handle,
            "name": handle.capitalize(),
            "model": "scripted/model",
            "computer_id": computer.id if computer else None,
        }
        return dict(await self.ok("POST", "/api/agents", json=body, status=201))

    async def group(self, title: str, *agents: dict[str, Any]) -> dict[str, Any]:
        body = {"kind": "group", "title": title, "agent_ids": [a["id"] for a in agents]}
        return dict(await self.ok("POST", "/api/rooms", json=body, status=201))

    async def dm(self, agent: dict[str, Any]) -> dict[str, Any]:
        body = {"kind": "dm", "agent_ids": [agent["id"]]}
        return dict(await self.ok("POST", "/api/rooms", json=body, status=201))

    async def token(self, computer: Computer, agent: dict[str, Any]) -> str:
        answer = await self.ok(
            "POST", f"/computer/agents/{agent['id']}/token", headers=computer.headers
        )
        return str(answer["token"])

    # ------------------------------------------------------------ acting

    async def post(self, room_id: str, body: str, thread_of: str | None = None) -> dict[str, Any]:
        payload = {"body": body, "thread_of": thread_of}
        return dict(
            await self.ok("POST", f"/api/rooms/{room_id}/messages", json=payload, status=201)
        )

    async def reply(
        self, token: str, room_id: str, body: str, thread_of: str | None = None
    ) -> httpx.Response:
        payload: dict[str, Any] = {"room_id": room_id, "body": body}
        if thread_of is not None:
            payload["thread_of"] = thread_of
        return await self.client.post("/agent/reply", json=payload, headers=bearer(token))

    async def unread(self, computer: Computer, agent: dict[str, Any]) -> list[dict[str, Any]]:
        answer = await self.ok(
            "POST", f"/computer/agents/{agent['id']}/unread", headers=computer.headers
        )
        return list(answer["rooms"])

    async def register(self, computer: Computer, agent: dict[str, Any]) -> dict[str, Any]:
        body = {"rooms": [], "input": "turn input", "engine": "opencode", "model": "m/x"}
        return dict(
            await self.ok(
                "POST",
                f"/computer/agents/{agent['id']}/turns",
                json=body,
                headers=computer.headers,
                status=201,
            )
        )

    async def positions(self, agent: dict[str, Any]) -> dict[str, tuple[int, int]]:
        rows = await self.ok("GET", f"/api/agents/{agent['id']}/positions")
        return {r["room_id"]: (r["delivered_seq"], r["read_seq"]) for r in rows}

    async def messages(self, room_id: str) -> list[dict[str, Any]]:
        return list(await self.ok("GET", f"/api/rooms/{room_id}/messages"))

    # ------------------------------------------------------------ observing

    def cursor(self) -> int:
        """The newest SSE event id now: pass it to `wakes` to see only what follows."""
        return self.store.last_event_id()

    def events(self, computer: Computer, after: int) -> list[tuple[str, dict[str, Any]]]:
        return [
            (event, orjson.loads(data))
            for _, event, data in self.store.events_after(computer.id, after, limit=10_000)
        ]

    def wakes(self, computer: Computer, after: int) -> list[str]:
        """Agent ids woken on this Computer since `after`, in order."""
        return [d["agent_id"] for e, d in self.events(computer, after) if e == "wake"]
