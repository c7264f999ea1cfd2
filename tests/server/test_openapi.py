"""The app against openapi/upstream.yaml: the document is current, and a bounded schemathesis fuzz
finds no 5xx and no answer that breaks the schema."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from crew_server.api.routes import OPS
from crew_server.app import create_app
from crew_server.clock import Clock
from crew_server.openapi import render
from crew_server.store import Store

OPENAPI = Path(__file__).resolve().parents[2] / "openapi" / "upstream.yaml"


def test_the_committed_document_is_what_the_models_generate() -> None:
    assert OPENAPI.read_text() == render(), (
        "openapi/upstream.yaml is stale: run .venv/bin/python -m crew_server.openapi > "
        "openapi/upstream.yaml"
    )


def test_every_route_of_the_app_is_documented() -> None:
    app = create_app(Store(":memory:", Clock()), Clock(), dev=True)
    # The web app's pages and streams (crew_server/web) are no part of the upstream API.
    api = ("/api/", "/computer/", "/agent/", "/health")
    routes = {
        (method.lower(), route.path)  # type: ignore[attr-defined]
        for route in app.routes
        if route.path.startswith(api)  # type: ignore[attr-defined]
        for method in (route.methods or ()) - {"HEAD"}  # type: ignore[attr-defined]
    }
    documented = {(op.method, op.path) for op in OPS}
    assert routes == documented


def _world() -> tuple[Store, dict[str, str]]:
    """A store with a user token, a connected Computer, an agent on it, a group and a message."""
    clock = Clock()
    store = Store(":memory:", clock)
    user_token = store.ensure_user_token()
    assert user_token is not None
    computer_id, computer_token = store.create_computer("fuzz")
    store.connect(computer_id, "h", "linux", "1", 2)
    agent = store.create_agent("fuzzy", "Fuzzy", "", "m/x", "opencode", computer_id)
    room, _ = store.create_room("group", "fuzz", [agent["id"]])
    store.user_post(room["id"], "hello @fuzzy", None)
    return store, {
        "user_token": user_token,
        "computer_token": computer_token,
        "computer_id": computer_id,
        "agent_id": agent["id"],
    }


STORE, IDS = _world()
# A body over 1 MiB is refused with 413 before it is read as JSON: a fine way to reject
# (oversized) invalid data too.
CONFIG = SchemathesisConfig.from_dict(
    {
        "checks": {
            "negative_data_rejection": {
                "expected-statuses": [400, 401, 403, 404, 405, 406, 409, 413, 415, 422]
            }
        }
    }
)
schema = schemathesis.openapi.from_path(OPENAPI, config=CONFIG)
# Not --dev, so the dev clock hook answers 404; user auth is on either way.
schema.app = create_app(STORE, STORE.clock, dev=False, run_scheduler=False)
# The event stream never ends by design; tests/server/test_sse.py covers it.
schema = schema.exclude(path="/computer/events")


@schema.parametrize()
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
def test_app_conforms_to_openapi(case: schemathesis.Case) -> None:
    path = case.operation.path
    headers: dict[str, str] = {}
    if path.startswith("/computer/"):
        headers["Authorization"] = f"Bearer {IDS['computer_token']}"
        given = (case.headers or {}).get("Crew-Epoch", "")
        if path != "/computer/connect" and given.isdigit() and 1 <= int(given) < 10**15:
            # a valid epoch becomes the current connection's (a fuzzed connect supersedes
            # older ones); an invalid one stays, to be refused
            headers["Crew-Epoch"] = str(STORE.current_epoch(IDS["computer_id"]))
    elif path.startswith("/agent/"):
        # a fresh token each time: a fuzzed /computer/connect ends the older ones
        token = STORE.issue_agent_token(IDS["computer_id"], IDS["agent_id"])
        headers["Authorization"] = f"Bearer {token}"
    elif path.startswith("/api/"):
        headers["Authorization"] = f"Bearer {IDS['user_token']}"
    response = case.call(headers=headers)
    if (
        _beyond_64_bits(path, response)
        or _unreadable_egress(path, response)
        or _capabilities_beyond_schema(path, response)
    ):
        return
    case.validate_response(response, headers=headers)


def _beyond_64_bits(path: str, response: Any) -> bool:
    """The one refusal of schema-valid data the document states in words (`TurnEvent.data`:
    integers must fit in 64 bits, else 422), which a JSON schema cannot say of any JSON."""
    if path != "/computer/turns/{turn_id}/events" or response.status_code != 422:
        return False
    message = response.json()["error"]["message"]
    return bool(
        re.fullmatch(r"events\.\d+\.data cannot be stored: Integer exceeds 64-bit range", message)
    )


def _unreadable_egress(path: str, response: Any) -> bool:
    """The other: an egress policy whose rules `crew_common.egress` cannot read (or rules
    with a mode other than `allow`) is refused with 422 `invalid_egress`, as the document
    says of `Egress.allow`; a schema cannot state the rules' grammar. So is a permission
    policy `crew_common.permissions` cannot read (422 `invalid_permission`: an unknown
    tool, a pattern that looks like a regular expression)."""
    if path not in ("/api/agents", "/api/agents/{agent_id}") or response.status_code != 422:
        return False
    return bool(response.json()["error"]["code"] in ("invalid_egress", "invalid_permission"))


# What pydantic says of a document that breaks the schema itself: never of schema-valid data.
_SCHEMA_REASONS = (
    "Extra inputs are not permitted",
    "Input should be",
    "String should",
    "List should",
    "is not a valid name:",
)


def _capabilities_beyond_schema(path: str, response: Any) -> bool:
    """And capabilities (issue 27) that break a rule `crew_common.capabilities` states in
    words (unique names, a skill's size in bytes, a name in both the plain and the secret
    map, a url's scheme and host, a file path's form, a "(set)" secret with nothing stored):
    422 `invalid_capabilities`, never for what the schema states itself."""
    paths = ("/api/agents", "/api/agents/{agent_id}", "/api/agents/{agent_id}/capabilities")
    if path not in paths or response.status_code != 422:
        return False
    error = response.json()["error"]
    return error["code"] == "invalid_capabilities" and not any(
        reason in error["message"] for reason in _SCHEMA_REASONS
    )
