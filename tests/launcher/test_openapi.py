"""`openapi/launcher.yaml` matches the pydantic models, and a schema fuzz finds no crash."""

from __future__ import annotations

import atexit
import copy
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, settings
from pydantic import BaseModel
from schemathesis.checks import positive_data_acceptance

from crew_common import launcher_wire as models
from tests.launcher.helpers import CrewLayout, write_fake_opencode
from tests.launcher.inprocess import SECRET, inprocess_app, inprocess_launcher

SPEC_PATH = Path(__file__).parents[2] / "openapi" / "launcher.yaml"
SPEC: dict[str, Any] = yaml.safe_load(SPEC_PATH.read_text())
COMPONENTS = SPEC["components"]["schemas"]

MODELS: dict[str, type[BaseModel]] = {
    "RunRequest": models.RunRequest,
    "EngineArgs": models.EngineArgs,
    "StartedFrame": models.StartedFrame,
    "LineFrame": models.LineFrame,
    "LogFrame": models.LogFrame,
    "DeniedFrame": models.DeniedFrame,
    "Denials": models.Denials,
    "Egress": models.EgressWire,
    "EgressRule": models.EgressRuleWire,
    "ExitFrame": models.ExitFrame,
    "SandboxHealth": models.SandboxHealth,
    "EngineHealth": models.EngineHealth,
    "Health": models.Health,
    "RunInfo": models.RunInfo,
    "RunList": models.RunList,
    "StopResult": models.StopResult,
    "ModelsRequest": models.ModelsRequest,
    "ModelList": models.ModelList,
    "Error": models.ErrorResponse,
    "ServerRequest": models.ServerRequest,
    "ServerInfo": models.ServerInfo,
    "ServerList": models.ServerList,
    "SweepResult": models.SweepResult,
    "ServerStopped": models.ServerStopped,
    "ServerLimitHit": models.ServerLimitHit,
}
# What the launcher receives is described as it is read; the rest as it is written.
REQUESTS = {"RunRequest", "EngineArgs", "ModelsRequest", "ServerRequest", "Egress", "EgressRule"}
# What a field validator enforces: the document states it, the models' own schema cannot.
# Each is checked against the code below (`test_validated_rules_are_the_code`).
VALIDATED: dict[tuple[str, str], tuple[str, ...]] = {
    ("RunRequest", "env"): ("propertyNames", "additionalProperties.maxLength"),
    ("ServerRequest", "env"): ("propertyNames", "additionalProperties.maxLength"),
    ("ModelsRequest", "env"): (
        "propertyNames",
        "additionalProperties.maxLength",
        "additionalProperties.pattern",
    ),
    ("ModelsRequest", "price_table"): ("pattern",),
}
PROSE = {"description", "title", "default", "summary"}
NO_NUL = "^[^\\u0000]*$"


def wire_shape(node: Any, defs: dict[str, Any]) -> Any:
    """A schema reduced to what it says about the wire, one spelling for each thing.

    No prose and no defaults (compared on their own); references inlined; a
    nullable value is an `anyOf` with `null` whether written `type: [x, "null"]`,
    `oneOf` or pydantic's `anyOf`; a `const` needs no `type`.
    """
    if isinstance(node, list):
        return [wire_shape(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return wire_shape(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
    rest = {k: v for k, v in node.items() if k not in PROSE and k != "$defs"}
    alternatives = rest.pop("anyOf", None) or rest.pop("oneOf", None)
    if alternatives is None and isinstance(rest.get("type"), list):
        types = rest.pop("type")
        alternatives = [{"type": "null"} if t == "null" else {**rest, "type": t} for t in types]
        rest = {}
    if alternatives is not None:
        shapes = [wire_shape(alt, defs) for alt in alternatives]
        return {"anyOf": sorted(shapes, key=canonical), **wire_shape(rest, defs)}
    if "const" in rest:
        rest.pop("type", None)
    shape = {key: wire_shape(value, defs) for key, value in rest.items() if key != "properties"}
    if "required" in shape:
        shape["required"] = sorted(shape["required"])
    if "properties" in rest:  # names, not keywords: a field may be called `title`
        shape["properties"] = {k: wire_shape(v, defs) for k, v in rest["properties"].items()}
    return shape


def canonical(shape: Any) -> str:
    return json.dumps(shape, sort_keys=True)


def model_shape(name: str) -> dict[str, Any]:
    mode = "validation" if name in REQUESTS else "serialization"
    schema = MODELS[name].model_json_schema(mode=mode)
    return wire_shape(schema, schema.get("$defs", {}))


def document_shape(name: str) -> dict[str, Any]:
    doc = copy.deepcopy(COMPONENTS[name])
    for (component, prop), paths in VALIDATED.items():
        if component == name:
            for path in paths:
                *parents, last = path.split(".")
                holder = doc["properties"][prop]
                for parent in parents:
                    holder = holder[parent]
                del holder[last]
    return wire_shape(doc, COMPONENTS)


def test_every_component_has_its_model() -> None:
    assert set(COMPONENTS) == set(MODELS)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_component_matches_model(name: str) -> None:
    """Types, nullability, required fields, closedness, patterns, bounds and enums agree."""
    assert document_shape(name) == model_shape(name)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_documented_defaults_are_the_models(name: str) -> None:
    fields = MODELS[name].model_fields
    for prop, spec in COMPONENTS[name]["properties"].items():
        default = fields[prop].get_default(call_default_factory=True)
        if isinstance(default, BaseModel):  # an object's default, as the document writes it
            default = default.model_dump()
        if "default" in spec:
            assert spec["default"] == default, prop
        else:
            assert default in (None, "", [], {}) or fields[prop].is_required(), prop


def test_validated_rules_are_the_code() -> None:
    for component, prop in VALIDATED:
        spec = COMPONENTS[component]["properties"][prop]
        if prop == "env":
            assert spec["additionalProperties"]["maxLength"] == models.MAX_ENV_VALUE
    assert COMPONENTS["ModelsRequest"]["properties"]["env"]["additionalProperties"]["pattern"] == (
        NO_NUL
    )
    assert COMPONENTS["ModelsRequest"]["properties"]["price_table"]["pattern"] == NO_NUL
    server_keys = documented_keys("ServerRequest")
    assert server_keys == documented_keys("RunRequest") | {models.SERVER_PASSWORD_KEY}


def documented_keys(component: str) -> set[str]:
    pattern = COMPONENTS[component]["properties"]["env"]["propertyNames"]["pattern"]
    return set(pattern.removeprefix("^(").removesuffix(")$").split("|"))


def test_the_comparison_sees_a_difference() -> None:
    """A changed bound, a dropped null or a new field is a difference (the test can fail)."""
    doc = copy.deepcopy(COMPONENTS["ServerInfo"])
    assert wire_shape(doc, COMPONENTS) == model_shape("ServerInfo")
    doc["properties"]["port"]["maximum"] = 65534
    assert wire_shape(doc, COMPONENTS) != model_shape("ServerInfo")
    doc = copy.deepcopy(COMPONENTS["ExitFrame"])
    doc["properties"]["code"] = {"type": "integer"}
    assert wire_shape(doc, COMPONENTS) != model_shape("ExitFrame")
    doc = copy.deepcopy(COMPONENTS["LineFrame"])
    doc["properties"]["extra"] = {"type": "string"}
    assert wire_shape(doc, COMPONENTS) != model_shape("LineFrame")


def test_env_key_pattern_is_the_allowlist() -> None:
    assert documented_keys("RunRequest") == models.ALLOWED_ENV_KEYS | {"XDG_[A-Z]+_HOME"}


def test_models_env_key_pattern_is_the_allowlist() -> None:
    assert documented_keys("ModelsRequest") == models.MODELS_ENV_KEYS


def _fuzz_app() -> Any:
    """An in-process launcher whose crew home does not exist: every run is refused (400)."""
    engine_dir = Path(tempfile.mkdtemp(prefix="crew-fuzz-"))
    atexit.register(shutil.rmtree, engine_dir, True)
    layout = CrewLayout(
        home=Path("/nonexistent-home"), crew_home=Path("/nonexistent-home/.crew"), run_id="r1"
    )
    return inprocess_app(inprocess_launcher(layout, write_fake_opencode(engine_dir)))


fuzz = schemathesis.openapi.from_path(SPEC_PATH)
fuzz.app = _fuzz_app()  # probes and calls both go through the in-process app


@fuzz.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_schema_fuzz(case: Any) -> None:
    headers = {"Authorization": f"Bearer {SECRET}"}
    if case.path in ("/runs", "/servers") and case.method == "POST":
        # A schema-valid run still names paths that do not exist (the schema
        # cannot say "existing"), so 400 is the right answer there.
        case.call_and_validate(headers=headers, excluded_checks=[positive_data_acceptance])
        return
    case.call_and_validate(headers=headers)
