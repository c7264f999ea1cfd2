"""`Op`, one row of the route table: an operation of the upstream API.

Each surface module (`computer`, `agent`, `user`) lists its operations next to
their handlers; `routes.OPS` joins them into the one table that both the app
(`crew_server.app`) and the OpenAPI document (`crew_server.openapi`) are built from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from crew_server.api.http import Endpoint

# One object for every UUID parameter: the YAML writer anchors its repeats (`&id001`).
UUID = {"type": "string", "format": "uuid"}
SEQ = {"type": "integer", "minimum": 0, "maximum": 2**53}


@dataclass(frozen=True)
class Op:
    """One operation: who calls it, what it takes, what it answers, which handler serves it."""

    method: str
    path: str
    op_id: str
    summary: str
    auth: str  # "user" | "computer" | "agent" | "none"
    body: type[BaseModel] | None = None
    status: int = 200
    answer: type[BaseModel] | None = None
    many: bool = False
    query: tuple[tuple[str, dict[str, Any]], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    handler: Endpoint = field(kw_only=True)
    # An agent write done once per `Idempotency-Key` (crew_server.api.idempotency).
    idempotent: bool = field(default=False, kw_only=True)
