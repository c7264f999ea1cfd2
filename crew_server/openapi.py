"""Build `openapi/upstream.yaml` (OpenAPI 3.1) from the pydantic models in `crew_server.models`.

`python -m crew_server.openapi > openapi/upstream.yaml` regenerates it; a test
checks the committed file is what this module builds, and schemathesis checks
the app against it. The operations come from the route table the app serves
(`crew_server.api.routes.OPS`), so the document cannot list a route the app lacks.
"""

from __future__ import annotations

import sys
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from crew_server import models as m
from crew_server.api.operation import UUID
from crew_server.api.routes import OPS

_ERRORS = {
    "400": "The body is not JSON.",
    "401": "Missing or invalid bearer token.",
    "403": "Not allowed (e.g. not a member of that room).",
    "404": "No such object (or not visible to this caller).",
    "409": "Refused (`refused`), a stale fence (`stale_turn`), a connection replaced by a "
    "newer one with the same Computer token (`superseded`), a conflict.",
    "413": "The body is over 1 MiB.",
    "422": "The body or a parameter is invalid.",
    "503": "The server's disk is full (`storage_full`); nothing was written. Retry later.",
}

# Every Computer call but `connect` names its connection (contracts: delivery at the edges).
_EPOCH_PARAM = {
    "name": "Crew-Epoch",
    "in": "header",
    "required": True,
    "description": "The epoch `POST /computer/connect` answered. A connection replaced by a "
    "newer one with the same token gets 409 `superseded`.",
    "schema": {"type": "integer", "minimum": 1, "maximum": 10**15 - 1},
}

# Agent writes are done once per key (contracts: idempotent agent writes).
_IDEMPOTENCY_PARAM = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "Done once per key, per agent and turn, kept 48 h: the same key and "
    "request again get the first answer (header `Idempotent-Replayed: true`); the same key "
    "with another request is refused (409 `idempotency_key_reused`); a key whose write was "
    "done but whose answer was lost in a server stop gets 409 `already_done`.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[!-~]+$"},
}

# Every agent call may name the turn it belongs to (contracts: the turn binding).
_TURN_PARAM = {
    "name": "Crew-Turn",
    "in": "header",
    "required": False,
    "description": "The turn identity (`turn_secret` of `POST /computer/agents/{agent_id}/turns`) "
    "of the turn this call belongs to; without it, the agent's latest turn. A write counts for "
    "that turn even when it lands after the turn ended; a write of a turn that is over once a "
    "newer turn claimed the agent's messages is refused (409 `turn_over`). An identity of no "
    "turn of this agent, or of one that ended over 48 h ago: 403 `wrong_turn`.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 200},
}

_PATH_PARAMS: dict[str, dict[str, Any]] = {
    "agent_id": UUID,
    "turn_id": UUID,
    "room_id": UUID,
    "reminder_id": UUID,
    "approval_id": UUID,
    "computer_id": UUID,
    "number": {"type": "integer", "minimum": 1},
}
# The repository grants no license yet; the documents say so rather than stay silent.
LICENSE = {
    "name": "No license granted (all rights reserved)",
    "identifier": "LicenseRef-all-rights-reserved",
}
_SECURITY = {"user": "userToken", "computer": "computerToken", "agent": "agentToken"}


def build() -> dict[str, Any]:
    """The OpenAPI document as a dict."""
    wanted: list[tuple[type[BaseModel], Any]] = []
    for op in OPS:
        if op.body is not None:
            wanted.append((op.body, "validation"))
        if op.answer is not None:
            wanted.append((op.answer, "serialization"))
    wanted += [(m.ErrorAnswer, "serialization"), (m.HeldAnswer, "serialization")]
    # A request's policy is read by crew_common.permissions and documented as this model.
    wanted += [(m.Permission, "validation")]
    # Capabilities in a request are read by crew_common.capabilities, documented so.
    wanted += [(m.Capabilities, "validation")]
    refs, defs = models_json_schema(
        list(dict.fromkeys(wanted)), ref_template="#/components/schemas/{model}"
    )
    schemas = defs.get("$defs", {})

    def ref(model: type[BaseModel], mode: str) -> dict[str, Any]:
        return dict(refs[(model, mode)])  # type: ignore[index]

    error = {"application/json": {"schema": ref(m.ErrorAnswer, "serialization")}}
    paths: dict[str, dict[str, Any]] = {}
    for op in OPS:
        item: dict[str, Any] = {"operationId": op.op_id, "summary": op.summary}
        params = [
            {"name": name, "in": "path", "required": True, "schema": _PATH_PARAMS[name]}
            for name in _path_names(op.path)
        ]
        params += [{"name": n, "in": "query", "required": False, "schema": s} for n, s in op.query]
        if op.auth == "computer" and op.op_id != "connect":
            params.append(_EPOCH_PARAM)
        if op.auth == "agent":
            params.append(_TURN_PARAM)
        if op.idempotent:
            params.append(_IDEMPOTENCY_PARAM)
        if params:
            item["parameters"] = params
        # An operation without auth says so: `security: []`, not silence.
        item["security"] = [{_SECURITY[op.auth]: []}] if op.auth != "none" else []
        if op.body is not None:
            # a body whose fields are all optional may be left out
            needed = any(f.is_required() for f in op.body.model_fields.values())
            item["requestBody"] = {
                "required": needed,
                "content": {"application/json": {"schema": ref(op.body, "validation")}},
            }
        responses: dict[str, Any] = {}
        if op.op_id == "computerEvents":
            responses["200"] = {
                "description": "An endless event stream.",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            }
        elif op.status == 204:
            responses["204"] = {"description": "Done."}
        else:
            assert op.answer is not None, op.op_id
            schema = ref(op.answer, "serialization")
            if op.many:
                schema = {"type": "array", "items": schema}
            responses[str(op.status)] = {
                "description": "Done.",
                "content": {"application/json": {"schema": schema}},
            }
        for status, model in op.extra.items():
            responses[status] = {
                "description": "Done (it existed).",
                "content": {"application/json": {"schema": ref(model, "serialization")}},
            }
        # Without auth, only a bad query parameter is refused (422).
        for status in _ERRORS if op.auth != "none" else ["422"]:
            responses[status] = {"$ref": f"#/components/responses/Error{status}"}
        if op.op_id == "reply":
            responses["409"] = {
                "description": "Held (`held: true` with the unseen messages), or refused.",
                "content": {
                    "application/json": {
                        "schema": {
                            "anyOf": [
                                ref(m.HeldAnswer, "serialization"),
                                ref(m.ErrorAnswer, "serialization"),
                            ]
                        }
                    }
                },
            }
        paths.setdefault(op.path, {})[op.method] = item | {"responses": responses}
    bearer = {"type": "http", "scheme": "bearer"}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Crew server (upstream) API",
            "version": "0.1.0",
            "license": LICENSE,
            "description": (
                "The contract between the Computer, `crew` and the crew server "
                "(spec: upstream.md). Generated by `python -m crew_server.openapi`; do not edit "
                'by hand. Errors are `{"error": {"code", "message"}}`; refusals a user '
                "should read carry `code: refused` (409)."
            ),
        },
        "servers": [{"url": "http://127.0.0.1:8765"}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "responses": {
                f"Error{status}": {"description": text, "content": error}
                for status, text in _ERRORS.items()
            },
            "securitySchemes": {
                "userToken": bearer
                | {
                    "description": "printed once at first start (or written to "
                    "--user-token-file); every /api/ call needs it, with --dev too"
                },
                "computerToken": bearer | {"description": "from POST /api/computers"},
                "agentToken": bearer | {"description": "from POST /computer/agents/{id}/token"},
            },
        },
    }


def _path_names(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]


def render() -> str:
    """The document as YAML text (stable key order)."""
    import yaml  # a test/dev dependency: only generating the document needs it

    return str(yaml.safe_dump(build(), sort_keys=False, allow_unicode=True, width=100))


if __name__ == "__main__":
    sys.stdout.write(render())
