"""`openapi/launcher.yaml` matches the pydantic models, and a schema fuzz finds no crash."""

from __future__ import annotations

import atexit
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


def test_document_is_openapi_3_1_with_every_route() -> None:
    assert SPEC["openapi"].startswith("3.1")
    routes = {(p, m) for p, ops in SPEC["paths"].items() for m in ops}
    assert routes == {
        ("/health", "get"),
        ("/runs", "post"),
        ("/runs", "get"),
        ("/runs/{run_id}/stop", "post"),
        ("/models", "post"),
        ("/servers", "post"),
        ("/servers", "get"),
        ("/servers/{agent_id}/sweep", "post"),
        ("/servers/{agent_id}/stop", "post"),
        ("/servers/{agent_id}/limit", "get"),
    }


@pytest.mark.parametrize("name", sorted(MODELS))
def test_component_matches_model(name: str) -> None:
    model_schema = MODELS[name].model_json_schema()
    doc = COMPONENTS[name]
    assert set(doc["properties"]) == set(model_schema["properties"])
    assert set(doc.get("required", [])) == set(model_schema.get("required", [])) - {"t"} | (
        {"t"} & set(doc.get("required", []))
    )
    for prop, spec in model_schema["properties"].items():
        if "pattern" in spec:
            assert doc["properties"][prop]["pattern"] == spec["pattern"], prop
        for variant in spec.get("anyOf", []):
            if "pattern" in variant:
                assert doc["properties"][prop]["pattern"] == variant["pattern"], prop


def test_env_key_pattern_is_the_allowlist() -> None:
    pattern = COMPONENTS["RunRequest"]["properties"]["env"]["propertyNames"]["pattern"]
    for key in models.ALLOWED_ENV_KEYS:
        assert f"|{key}|" in pattern.replace("^(", "|").replace(")$", "|")


def test_models_env_key_pattern_is_the_allowlist() -> None:
    pattern = COMPONENTS["ModelsRequest"]["properties"]["env"]["propertyNames"]["pattern"]
    documented = set(pattern.removeprefix("^(").removesuffix(")$").split("|"))
    assert documented == models.MODELS_ENV_KEYS


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
