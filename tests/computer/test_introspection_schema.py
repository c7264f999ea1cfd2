"""Schema fuzz (bounded) of the introspection API against openapi/computer.yaml."""

from __future__ import annotations

from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings

from computer_service.introspection import EventBus, create_app
from tests.computer.static_view import StaticView

OPENAPI = Path(__file__).resolve().parents[2] / "openapi" / "computer.yaml"

schema = schemathesis.openapi.from_path(OPENAPI)
schema.app = create_app(StaticView(), EventBus())
# /events never ends by design; it has its own test.
schema = schema.exclude(path="/events")


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_introspection_conforms_to_its_schema(case: schemathesis.Case) -> None:
    case.call_and_validate()
