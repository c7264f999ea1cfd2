"""Run request validation: every unsafe or malformed request is refused with a clear reason."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from crew_common.launcher_wire import RunRequest
from sandbox_launcher.launcher import RequestRefused
from tests.launcher.helpers import CrewLayout
from tests.launcher.inprocess import SECRET, inprocess_app, inprocess_launcher

Body = dict[str, Any]


@pytest.fixture
def alice(layout: CrewLayout) -> CrewLayout:
    layout.add_agent("alice")
    layout.add_agent("bob")
    return layout


def _set(key: str, value: Any) -> Callable[[Body, CrewLayout], None]:
    def mutate(body: Body, layout: CrewLayout) -> None:
        body[key] = value(layout) if callable(value) else value

    return mutate


def _env(key: str, value: str) -> Callable[[Body, CrewLayout], None]:
    def mutate(body: Body, layout: CrewLayout) -> None:
        body["env"][key] = value

    return mutate


def _symlink(
    relative: str, target: Callable[[CrewLayout], Path]
) -> Callable[[Body, CrewLayout], None]:
    """Replace a directory of alice's with a symlink (an agent could plant one)."""

    def mutate(body: Body, layout: CrewLayout) -> None:
        path = layout.crew_home / relative.replace("RUN", layout.run_id)
        os.rename(path, path.with_name(path.name + ".moved"))
        os.symlink(target(layout), path)

    return mutate


def _interp(value: Callable[[CrewLayout], str]) -> Callable[[Body, CrewLayout], None]:
    def mutate(body: Body, layout: CrewLayout) -> None:
        body["interpreter_dirs"] = [value(layout)]

    return mutate


def _ssh(layout: CrewLayout) -> Path:
    (layout.home / ".ssh").mkdir(exist_ok=True)
    return layout.home / ".ssh"


REFUSALS: list[tuple[str, Callable[[Body, CrewLayout], None], str]] = [
    ("env key off the list", _env("LD_PRELOAD", "/x.so"), "LD_PRELOAD"),
    ("env of the Computer", _env("CREW_COMPUTER_TOKEN", "t"), "not allowed"),
    ("NUL in env value", _env("LANG", "C\x00"), "NUL"),
    ("env value over 128 KiB", _env("OPENCODE_CONFIG_CONTENT", "x" * 130_000), "over"),
    ("NUL in stdin", _set("stdin", "a\x00b"), "NUL"),
    ("model without provider", _set("model", "scripted"), "model"),
    ("model like an option", _set("model", "-x/y"), "model"),
    ("model with a space", _set("model", "a/b c"), "model"),
    ("no model at all", _set("model", None), "model is required"),
    ("bad session id", _set("session_id", "--session"), "session_id"),
    ("two different models", _set("engine_args", {"model": "other/m"}), "disagree"),
    ("title like an option", _set("engine_args", {"title": "--dir"}), "title"),
    ("unknown field (a free argv)", _set("argv", ["sh", "-c", "id"]), "argv"),
    ("stdout limit 0", _set("stdout_limit", 0), "stdout_limit"),
    ("bad agent id", _set("agent_id", "../bob"), "agent_id"),
    ("agent dir outside the crew home", _set("agent_dir", "/etc"), "agent_dir"),
    ("another agent's dir", _set("agent_dir", lambda lay: str(lay.agent_dir("bob"))), "agent_dir"),
    (
        "another agent's runtime dir",
        _set("runtime_dir", lambda lay: str(lay.runtime_dir("bob"))),
        "runtime_dir",
    ),
    ("relative path", _set("bin_dir", "runtime/bin"), "bin_dir"),
    (
        "path with ..",
        _set("agent_dir", lambda lay: f"{lay.agent_dir('bob')}/../alice"),
        "agent_dir",
    ),
    ("NUL in a path", _set("agent_dir", lambda lay: f"{lay.agent_dir('alice')}\x00"), "agent_dir"),
    ("NUL in an interpreter dir", _interp(lambda lay: f"{lay.home}\x00x"), "NUL"),
    (
        "work dir outside the agent dir",
        _set("engine_args", lambda lay: {"dir": str(lay.agent_dir("bob") / "work")}),
        "inside",
    ),
    ("agent dir is a symlink", _symlink("agents/alice", _ssh), "symbolic link"),
    ("work dir is a symlink", _symlink("agents/alice/work", _ssh), "symbolic link"),
    ("tmp dir is a symlink", _symlink("runtime/RUN/agents/alice/tmp", _ssh), "symbolic link"),
    ("interpreter dir is $HOME", _interp(lambda lay: str(lay.home)), "contains $HOME"),
    ("interpreter dir is ~/.ssh", _interp(lambda lay: str(_ssh(lay))), "secret place"),
    ("interpreter dir contains ~/.ssh", _interp(lambda lay: str(lay.home)), "$HOME"),
    ("interpreter dir in the crew home", _interp(lambda lay: str(lay.bin_dir.parent)), "crew home"),
    ("interpreter dir missing", _interp(lambda lay: str(lay.home / "nope")), "does not exist"),
    ("interpreter dir relative", _interp(lambda lay: "lib/python"), "absolute"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("case", "mutate", "expected"), REFUSALS, ids=[r[0] for r in REFUSALS])
async def test_unsafe_requests_are_refused_with_a_reason(
    case: str,
    mutate: Callable[[Body, CrewLayout], None],
    expected: str,
    alice: CrewLayout,
    fake_opencode: Path,
) -> None:
    launcher = inprocess_launcher(alice, fake_opencode)
    body = alice.run_request("alice", {"scenario": "echo"})
    mutate(body, alice)
    async with _client(launcher) as client:
        answer = await client.post("/runs", json=body)
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]["message"]
    assert expected in message
    assert launcher.runs == {}


@pytest.mark.anyio
async def test_garbage_bodies_are_400(alice: CrewLayout, fake_opencode: Path) -> None:
    launcher = inprocess_launcher(alice, fake_opencode)
    async with _client(launcher) as client:
        for raw in (b"", b"not json", b"[]", b'{"run_id": 5}', b"\xff\xfe"):
            answer = await client.post("/runs", content=raw)
            assert answer.status_code == 400, raw
            assert answer.json()["error"]["code"] == "invalid_request"


@pytest.mark.anyio
async def test_secrets_in_env_are_never_echoed(alice: CrewLayout, fake_opencode: Path) -> None:
    body = alice.run_request("alice", {"scenario": "echo"})
    body["env"]["OPENCODE_AUTH_CONTENT"] = "sk-very-secret" + "x" * 130_000
    async with _client(inprocess_launcher(alice, fake_opencode)) as client:
        answer = await client.post("/runs", json=body)
    assert answer.status_code == 400 and "sk-very-secret" not in answer.text


@pytest.mark.anyio
async def test_unusable_sandbox_answers_503_with_the_reason(
    alice: CrewLayout, fake_opencode: Path
) -> None:
    launcher = inprocess_launcher(alice, fake_opencode, ok=False)
    async with _client(launcher) as client:
        answer = await client.post("/runs", json=alice.run_request("alice", {}))
        health = (await client.get("/health")).json()
    assert answer.status_code == 503
    assert answer.json()["error"]["message"] == "bwrap not found (test)"
    assert health["sandbox"] == {
        "ok": False,
        "backend": "bwrap",
        "mode": "hybrid",
        "reason": "bwrap not found (test)",
        "not_granted": [],
        "network": None,
    }


@pytest.mark.anyio
async def test_unknown_routes_and_runs(alice: CrewLayout, fake_opencode: Path) -> None:
    async with _client(inprocess_launcher(alice, fake_opencode)) as client:
        assert (await client.post("/runs/nope/stop")).status_code == 404
        assert (await client.get("/nowhere")).json()["error"]["code"] == "not_found"
        assert (await client.delete("/runs")).status_code == 405


def test_a_valid_request_becomes_the_sandboxed_engine_argv(
    alice: CrewLayout, fake_opencode: Path
) -> None:
    launcher = inprocess_launcher(alice, fake_opencode)
    interp = alice.home / ".pyenv" / "versions" / "3.11.7"
    interp.mkdir(parents=True)
    body = alice.run_request("alice", {"scenario": "echo"}, interpreter_dirs=[str(interp)])
    run = launcher.prepare(RunRequest.model_validate(body))
    argv = run.argv
    assert argv[:3] == ["/usr/bin/env", "--ignore-signal=INT", "/usr/bin/bwrap"]
    helper = argv[argv.index("/x/landlock_exec.py") :]
    assert helper[1:4] == ["--seccomp", "--nproc", "4096"]
    assert ["--deny", str(alice.home)] == helper[4:6]
    assert ["--ro", str(interp)] == helper[helper.index(str(interp)) - 1 :][:2]
    assert ["--ro", str(alice.bin_dir)] == helper[6:8]
    engine = argv[argv.index("--", argv.index("/x/landlock_exec.py")) + 1 :]
    assert engine[0] == os.path.realpath(fake_opencode)
    assert engine[-2:] == ["--model", "local/scripted"]
    assert run.stdin == body["stdin"].encode()
    assert run.env["TMPPREFIX"].endswith("/tmp/zsh")
    launcher.add_run(run)
    with pytest.raises(RequestRefused) as busy:
        launcher.prepare(RunRequest.model_validate({**body, "run_id": "another"}))
    assert busy.value.status == 409


def _client(launcher: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=inprocess_app(launcher)),
        base_url="http://launcher",
        headers={"Authorization": f"Bearer {SECRET}"},
    )


@pytest.mark.anyio
async def test_an_oversized_body_is_413(alice: CrewLayout, fake_opencode: Path) -> None:
    from sandbox_launcher.app import MAX_BODY

    async with _client(inprocess_launcher(alice, fake_opencode)) as client:
        answer = await client.post("/runs", content=b"x" * (MAX_BODY + 1))
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "too_large"


def test_engine_read_paths_cover_installs_in_home(
    isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox_launcher.launcher import engine_read_paths

    crew = isolated_home / ".crew"
    # a single binary (the official installer's layout)
    binary = isolated_home / ".opencode" / "bin" / "opencode"
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"\x7fELF fake")
    assert engine_read_paths(binary, isolated_home, crew) == ((), (binary,))
    # an npm install: the whole node_modules tree, via the .bin symlink
    package = isolated_home / "tools" / "node_modules" / "opencode-ai" / "bin"
    package.mkdir(parents=True)
    (package / "opencode").write_bytes(b"\x7fELF fake")
    dot_bin = isolated_home / "tools" / "node_modules" / ".bin"
    dot_bin.mkdir()
    (dot_bin / "opencode").symlink_to(package / "opencode")
    assert engine_read_paths(dot_bin / "opencode", isolated_home, crew) == (
        (isolated_home / "tools" / "node_modules",),
        (),
    )
    # a script whose interpreter lives in $HOME (node from nvm): its prefix too
    node = isolated_home / ".nvm" / "versions" / "node" / "v20" / "bin" / "node"
    node.parent.mkdir(parents=True)
    node.write_text("#!/bin/sh\n")
    node.chmod(0o755)
    script = isolated_home / "bin" / "opencode"
    script.parent.mkdir()
    script.write_text(f"#!/usr/bin/env -S {node.name} --flag\n")
    monkeypatch.setenv("PATH", f"{node.parent}:{os.environ['PATH']}")
    dirs, files = engine_read_paths(script, isolated_home, crew)
    assert dirs == (node.parent.parent,) and files == (script,)
    # an interpreter straight in $HOME/bin: its prefix would be $HOME, so only the file
    script.write_text(f"#!{isolated_home}/bin/mynode\n")
    (isolated_home / "bin" / "mynode").write_text("")
    assert engine_read_paths(script, isolated_home, crew) == (
        (),
        (script, isolated_home / "bin" / "mynode"),
    )


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("path", "what"),
    [("/runs", "run request"), ("/models", "models request"), ("/servers", "server request")],
)
async def test_every_body_is_read_alike(
    alice: CrewLayout, fake_opencode: Path, path: str, what: str
) -> None:
    """Capped, then validated: the same 413 and the same 400 (naming the request) everywhere."""
    from sandbox_launcher.app import MAX_BODY

    async with _client(inprocess_launcher(alice, fake_opencode)) as client:
        over = await client.post(path, content=b"x" * (MAX_BODY + 1))
        assert over.status_code == 413 and over.json()["error"] == {
            "code": "too_large",
            "message": f"the request body is over {MAX_BODY} bytes",
        }
        bad = await client.post(path, content=b'{"env": {"EVIL": "sekrit-value"}')
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"
        assert bad.json()["error"]["message"].startswith(f"invalid {what}: ")
        assert "sekrit-value" not in bad.text
