"""An agent's settings the user API checks: its model against what its Computer reported
(422 `unknown_model` with the nearest ones), and its own turn time limit."""

from __future__ import annotations

from typing import Any

import pytest

from crew_server import rules
from tests.server.world import Computer, World

pytestmark = pytest.mark.anyio

MODELS = ["anthropic/claude-sonnet-4-5", "anthropic/claude-opus-4-1", "openai/gpt-4o", "local/x"]


async def reported(world: World, box: Computer, models: list[str]) -> None:
    answer = await world.client.put(
        "/computer/models", json={"models": models}, headers=box.headers
    )
    assert answer.status_code == 204


def agent_body(handle: str, model: str, box: Computer | None, **more: Any) -> dict[str, Any]:
    return {
        "handle": handle,
        "name": handle.title(),
        "model": model,
        "computer_id": box.id if box else None,
        **more,
    }


async def test_a_model_the_computer_did_not_report_is_refused_with_the_nearest(
    world: World,
) -> None:
    box = await world.computer()
    await reported(world, box, MODELS)
    refused = await world.client.post(
        "/api/agents", json=agent_body("alice", "anthropic/claude-sonet-4-5", box)
    )
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["code"] == "unknown_model"
    assert error["nearest"][0] == "anthropic/claude-sonnet-4-5"
    assert "openai/gpt-4o" not in error["nearest"]
    assert "did not report the model 'anthropic/claude-sonet-4-5'" in error["message"]
    assert "GET /api/computers" in error["message"]
    assert await world.ok("GET", "/api/agents") == []  # nothing was created

    made = await world.ok(
        "POST", "/api/agents", json=agent_body("alice", "openai/gpt-4o", box), status=201
    )
    assert made["model"] == "openai/gpt-4o" and made["warnings"] == []


async def test_a_model_without_provider_is_refused_with_how_to_pick_one(world: World) -> None:
    box = await world.computer()
    await reported(world, box, MODELS)
    refused = await world.client.post("/api/agents", json=agent_body("bob", "gpt-4o", box))
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["code"] == "unknown_model" and error["nearest"] == ["openai/gpt-4o"]
    assert "`provider/model`" in error["message"] and "opencode models" in error["message"]
    # Refused also where no list could be compared: no id OpenCode cannot take is stored.
    bare = await world.client.post("/api/agents", json=agent_body("bob", "gpt-4o", None))
    assert bare.status_code == 422 and bare.json()["error"]["nearest"] == []


async def test_with_no_models_reported_yet_the_model_is_accepted_and_the_answer_says_so(
    world: World,
) -> None:
    """Agents are usually made before their Computer first connects: refusing every model
    then would force an order on the user. The answer says what was not checked."""
    box = await world.computer(connect=False)
    made = await world.ok(
        "POST", "/api/agents", json=agent_body("carol", "someone/new", box), status=201
    )
    [warning] = made["warnings"]
    assert "not checked" in warning and "has not reported its models yet" in warning
    alone = await world.ok(
        "POST", "/api/agents", json=agent_body("dave", "someone/new", None), status=201
    )
    assert alone["warnings"] == ["the model was not checked: the agent has no Computer yet"]
    [listed, _] = await world.ok("GET", "/api/agents")
    assert "warnings" not in listed  # only the answer of the change carries them


async def test_an_edit_checks_a_new_model_and_a_new_computer_but_not_a_rename(
    world: World,
) -> None:
    box, other = await world.computer("box"), await world.computer("other")
    await reported(world, box, MODELS)
    await reported(world, other, ["local/y"])
    agent = await world.ok(
        "POST", "/api/agents", json=agent_body("erin", "local/x", box), status=201
    )
    path = f"/api/agents/{agent['id']}"
    bad_model = await world.client.patch(path, json={"model": "local/xx"})
    assert bad_model.status_code == 422 and bad_model.json()["error"]["nearest"] == ["local/x"]
    # Moving it to a Computer that cannot run its model is refused the same way.
    moved = await world.client.patch(path, json={"computer_id": other.id})
    assert moved.status_code == 422
    assert "Computer 'other' did not report the model 'local/x'" in moved.json()["error"]["message"]
    assert (await world.ok("PATCH", path, json={"computer_id": other.id, "model": "local/y"}))[
        "warnings"
    ] == []
    # Its Computer stops listing the model: a rename still works (nothing to check).
    await reported(world, other, ["local/z"])
    renamed = await world.ok("PATCH", path, json={"name": "Erin"})
    assert renamed["name"] == "Erin" and renamed["model"] == "local/y"
    assert renamed["warnings"] == []


async def test_an_agent_has_its_own_turn_time_limit_sent_to_its_computer(world: World) -> None:
    box = await world.computer()
    agent = await world.ok(
        "POST",
        "/api/agents",
        json=agent_body("fred", "local/x", box, turn_time_limit_s=7200),
        status=201,
    )
    assert agent["turn_time_limit_s"] == 7200
    [sent] = await world.ok("GET", "/computer/agents", headers=box.headers)
    assert sent["turn_time_limit_s"] == 7200
    path = f"/api/agents/{agent['id']}"
    assert (await world.ok("PATCH", path, json={"name": "F"}))["turn_time_limit_s"] == 7200
    # null takes the agent back to its Computer's bootstrap default.
    assert (await world.ok("PATCH", path, json={"turn_time_limit_s": None}))[
        "turn_time_limit_s"
    ] is None
    plain = await world.ok(
        "POST", "/api/agents", json=agent_body("gina", "local/x", box), status=201
    )
    assert plain["turn_time_limit_s"] is None


@pytest.mark.parametrize("bad", [9, 86_401, 0, -5, "60", 12.5, True])
async def test_a_turn_time_limit_outside_10_s_to_24_h_is_refused(world: World, bad: Any) -> None:
    answer = await world.client.post(
        "/api/agents", json=agent_body("hank", "local/x", None, turn_time_limit_s=bad)
    )
    assert answer.status_code == 422
    assert "turn_time_limit_s" in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    ("model", "nearest"),
    [
        ("gpt-4o", ["openai/gpt-4o"]),
        ("openai/gpt4o", ["openai/gpt-4o"]),
        ("claude-sonnet", ["anthropic/claude-sonnet-4-5"]),
        ("mistral/large", []),
    ],
)
def test_nearest_models(model: str, nearest: list[str]) -> None:
    assert rules.nearest_models(model, MODELS)[: len(nearest) or None] == nearest


def test_the_nearest_models_are_at_most_five_best_first() -> None:
    many = [f"p/model-{i}" for i in range(20)]
    assert rules.nearest_models("p/model-1", many)[:1] == ["p/model-1"]
    assert len(rules.nearest_models("p/model-1", many)) == rules.NEAREST_MODELS
