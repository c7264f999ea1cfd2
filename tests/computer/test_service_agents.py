"""The service against a REAL crew-server: agents that cannot run, problems cleared, introspection.

computer.md §1 (sandbox unusable, per-agent preparation failures) and §5 (the
introspection API as the running service answers it). FakeParts stands in
for the launcher; everything else is real, the socket included.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from computer_service.bootstrap import Bootstrap
from computer_service.runner import RunnerState
from computer_service.service import ComputerService
from computer_service.upstream import AgentRecord
from crew_common.version import VERSION
from crew_harness.waiting import wait_until_async
from crew_testkit.scripted import ScriptedEngine, blocking, fail, succeed, wait_for_stop
from tests.computer.fakes import UNUSABLE, USABLE, FakeParts
from tests.support.computer import problem_of
from tests.support.turns import finished_async

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@asynccontextmanager
async def serving(
    server: Any, crew_home: Path, parts: FakeParts, token: str, **settings: Any
) -> AsyncIterator[tuple[ComputerService, httpx.AsyncClient]]:
    boot = Bootstrap(server_url=server.url, token=token, crew_home=crew_home, **settings)
    service = ComputerService(boot, parts, handle_signals=False)
    async with anyio.create_task_group() as tg:
        tg.start_soon(service.serve)
        with anyio.fail_after(20):
            await service.roster.synced.wait()
        transport = httpx.AsyncHTTPTransport(uds=str(crew_home / "sockets" / "computer.sock"))
        async with httpx.AsyncClient(transport=transport, base_url="http://computer") as local:
            yield service, local
        service.request_stop()


async def test_sandbox_unusable_no_runner_and_every_agent_told_also_later_ones(
    crew_server: Any, tmp_path: Path
) -> None:
    comp = crew_server.create_computer()
    early = crew_server.create_agent("early2", computer_id=comp["computer_id"])
    room = crew_server.create_room("dm", [early["id"]])
    crew_server.post(room["id"], "will you run?")
    crew_home = tmp_path / "crew"
    parts = FakeParts(crew_home, ScriptedEngine(), status=UNUSABLE)
    async with serving(crew_server, crew_home, parts, comp["token"]) as (service, local):
        reason = await wait_until_async("the problem", lambda: problem_of(crew_server, early["id"]))
        assert reason == "sandbox unavailable: bwrap not found (looked in /usr/bin)"
        # An agent that appears later is told too (an `agents` event, then a sync).
        later = crew_server.create_agent("later2", computer_id=comp["computer_id"])
        assert await wait_until_async(
            "the later problem", lambda: problem_of(crew_server, later["id"])
        )
        assert service.roster.runners == {}
        rows = (await local.get("/agents")).json()
        assert [(r["handle"], r["state"], r["problem"]) for r in rows] == [
            ("early2", "problem", reason),
            ("later2", "problem", reason),
        ]
        health = (await local.get("/health")).json()
        assert health["connected"] is True and health["agents"] == 2
        assert health["sandbox"] == {
            "ok": False,
            "backend": None,
            "reason": UNUSABLE.reason,
            "not_granted": [],
            "network": None,
        }
        refused = await local.post(f"/agents/{early['id']}/wake")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "conflict"
        assert crew_server.turns(early["id"]) == []
        assert not (crew_home / "agents" / early["id"]).exists()  # nothing prepared


async def test_a_failed_preparation_is_that_agents_problem_until_a_wake_prepares_it_again(
    crew_server: Any, tmp_path: Path
) -> None:
    comp = crew_server.create_computer()
    broken = crew_server.create_agent("broken2", computer_id=comp["computer_id"])
    linked = crew_server.create_agent("linked2", computer_id=comp["computer_id"])
    crew_home = tmp_path / "crew"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # Planted by the agents in an earlier run: a file where `work/` belongs, and a link.
    agent_dir = crew_home / "agents" / broken["id"]
    agent_dir.mkdir(parents=True)
    (agent_dir / "work").write_text("notes the agent may still want")
    linked_dir = crew_home / "agents" / linked["id"]
    linked_dir.mkdir(parents=True)
    (linked_dir / "work").symlink_to(elsewhere)
    parts = FakeParts(crew_home, ScriptedEngine())
    async with serving(crew_server, crew_home, parts, comp["token"]) as (service, local):
        reason = await wait_until_async(
            "the problem", lambda: problem_of(crew_server, broken["id"])
        )
        assert "work is a file" in reason and "move it away" in reason
        assert str(crew_home) not in reason
        # The link held no data: removed (never followed) and the directory made again.
        assert linked["id"] in service.roster.runners and (linked_dir / "work").is_dir()
        assert list(elsewhere.iterdir()) == []
        assert broken["id"] not in service.roster.runners
        # The runner that was created got its token file and AGENTS.md.
        runtime = crew_home / "runtime" / "testrun" / "agents" / linked["id"]
        assert (runtime / "token").read_text().strip()
        assert "@linked2" in (linked_dir / "AGENTS.md").read_text()
        detail = (await local.get(f"/agents/{broken['id']}")).json()
        assert detail["state"] == "problem" and detail["problem"] == reason

        # A wake-up while it is still broken: tried again, still refused with the reason.
        refused = await local.post(f"/agents/{broken['id']}/wake")
        assert refused.status_code == 409
        assert (agent_dir / "work").read_text() == "notes the agent may still want"

        # Fixed as the reason says, then woken from the socket: prepared and running.
        (agent_dir / "work").rename(agent_dir / "work.saved")
        woken = await local.post(f"/agents/{broken['id']}/wake")
        assert woken.status_code == 202, woken.text
        assert broken["id"] in service.roster.runners
        # The service forgets the problem once the server has cleared it.
        await wait_until_async(
            "the problem cleared",
            lambda: (
                problem_of(crew_server, broken["id"]) is None
                and broken["id"] not in service.roster.problems
            ),
        )


async def test_an_agent_that_breaks_its_home_mid_run_is_repaired_or_told_and_healed_on_a_wake(
    crew_server: Any, tmp_path: Path
) -> None:
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("rmrf2", computer_id=comp["computer_id"])
    room = crew_server.create_room("dm", [agent["id"]])
    crew_home = tmp_path / "crew"
    engine = ScriptedEngine()
    parts = FakeParts(crew_home, engine)
    async with serving(crew_server, crew_home, parts, comp["token"]) as (service, local):
        home = crew_home / "agents" / agent["id"]
        tmp = crew_home / "runtime" / "testrun" / "agents" / agent["id"] / "tmp"
        # What `rm -rf ~/work $TMPDIR; ln -s / $TMPDIR` inside the sandbox leaves.
        shutil.rmtree(home / "work")
        shutil.rmtree(tmp)
        tmp.symlink_to("/")
        crew_server.post(room["id"], "first")
        [first] = await finished_async(crew_server, agent["id"], 1)
        assert first["status"] == "succeeded"
        assert (home / "work").is_dir() and tmp.is_dir() and not tmp.is_symlink()
        # The first message's wake-ups (the connect's and the post's) have all been taken:
        # a turn they still start would claim "second" before its home is broken.
        runner = service.roster.runners[agent["id"]]
        await wait_until_async(
            "the runner at rest",
            lambda: runner.state is RunnerState.IDLE and not runner.pending_wake,
        )

        # A file where a directory belongs cannot be repaired: the agent's problem, nothing claimed.
        shutil.rmtree(home / "work")
        (home / "work").write_text("the agent's data")
        crew_server.post(room["id"], "second")
        reason = await wait_until_async("the problem", lambda: problem_of(crew_server, agent["id"]))
        assert "work is a file" in reason and str(crew_home) not in reason
        rows = (await local.get("/agents")).json()
        assert [(r["state"], r["problem"]) for r in rows] == [("problem", reason)]
        assert len(crew_server.turns(agent["id"])) == 1

        # Fixed; the next message's wake-up (from the server) prepares it again and runs.
        (home / "work").unlink()
        crew_server.post(room["id"], "third")
        turns = await finished_async(crew_server, agent["id"], 2)
        assert turns[-1]["status"] == "succeeded"
        assert "second" in engine.inputs[-1] and "third" in engine.inputs[-1]
        await wait_until_async(
            "the problem cleared",
            lambda: (
                problem_of(crew_server, agent["id"]) is None
                and agent["id"] not in service.roster.problems
            ),
        )


async def test_an_unusable_replacement_launcher_is_every_agents_problem_until_one_is_usable(
    crew_server: Any, tmp_path: Path
) -> None:
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("relaunch2", computer_id=comp["computer_id"])
    room = crew_server.create_room("dm", [agent["id"]])
    crew_home = tmp_path / "crew"
    engine = ScriptedEngine()
    parts = FakeParts(crew_home, engine)
    async with serving(crew_server, crew_home, parts, comp["token"]) as (service, local):
        assert agent["id"] in service.roster.runners
        parts.status = UNUSABLE
        parts.kill_launcher()
        reason = await wait_until_async("the problem", lambda: problem_of(crew_server, agent["id"]))
        assert reason == f"sandbox unavailable: {UNUSABLE.reason}"
        assert service.roster.runners == {}
        rows = (await local.get("/agents")).json()
        assert [(r["state"], r["problem"]) for r in rows] == [("problem", reason)]
        assert (await local.get("/health")).json()["sandbox"]["ok"] is False
        # Messages wait meanwhile: nothing is claimed only to fail.
        crew_server.post(room["id"], "are you there?")
        starts = parts.launcher_starts
        await wait_until_async("another attempt", lambda: parts.launcher_starts > starts)
        assert crew_server.turns(agent["id"]) == []

        parts.status = USABLE
        [turn] = await finished_async(crew_server, agent["id"], 1)
        assert turn["status"] == "succeeded" and "are you there?" in engine.inputs[-1]
        assert problem_of(crew_server, agent["id"]) is None
        assert (await local.get("/health")).json()["sandbox"]["ok"] is True


async def test_a_settings_change_mid_turn_stops_the_old_runner_and_the_new_one_takes_over(
    crew_server: Any, tmp_path: Path
) -> None:
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("swap2", computer_id=comp["computer_id"])
    room = crew_server.create_room("dm", [agent["id"]])
    crew_home = tmp_path / "crew"
    engine = ScriptedEngine(script=[wait_for_stop])
    parts = FakeParts(crew_home, engine)
    async with serving(crew_server, crew_home, parts, comp["token"]) as (service, _local):
        old = service.roster.runners[agent["id"]]
        crew_server.post(room["id"], "a long job")
        with anyio.fail_after(20):
            await engine.started.wait()
        crew_server.client().patch(
            f"/api/agents/{agent['id']}", json={"name": "Renamed"}
        ).raise_for_status()

        first, newest = await finished_async(crew_server, agent["id"], 2)
        assert first["status"] == "cancelled"  # the old runner's turn was stopped
        assert old.finished.is_set() and service.roster.runners[agent["id"]] is not old
        assert service.roster.runners[agent["id"]].agent.name == "Renamed"
        # Not acked: the new runner, woken as new, handles the same message again.
        assert newest["status"] == "succeeded"
        assert "a long job" in engine.inputs[1]
        agents_md = (crew_home / "agents" / agent["id"] / "AGENTS.md").read_text()
        assert "Renamed" in agents_md


async def test_introspection_of_the_running_service(crew_server: Any, tmp_path: Path) -> None:
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("intro2", computer_id=comp["computer_id"])
    room = crew_server.create_room("dm", [agent["id"]])
    crew_home = tmp_path / "crew"
    engine = ScriptedEngine(script=[succeed, fail, wait_for_stop])
    parts = FakeParts(crew_home, engine)
    async with serving(crew_server, crew_home, parts, comp["token"]) as (service, local):
        health = (await local.get("/health")).json()
        # The fields of computer.md §5, what `crew-computer status` shows, the warm servers.
        assert set(health) == {
            "version",
            "server_url",
            "connected_since",
            "ready",
            "connected",
            "sandbox",
            "engine",
            "agents",
            "running_turns",
            "queued",
            "warm",
        }
        assert health["warm"] is None  # a scripted engine, not the warm one
        assert set(health["sandbox"]) == {"ok", "backend", "reason", "not_granted", "network"}
        assert health["engine"] == {"found": True, "version": "test", "reason": None}
        assert (health["ready"], health["agents"], health["queued"]) == (True, 1, 0)
        assert health["server_url"] == crew_server.url and health["version"] == VERSION

        crew_server.post(room["id"], "first")
        await wait_until_async("one turn", lambda: service.metrics.turns["succeeded"] == 1)
        row = (await local.get("/agents")).json()[0]
        assert row["session_id"] == f"ses-{agent['id'][:8]}" and row["last_result"] == "succeeded"
        crew_server.post(room["id"], "second")
        await wait_until_async("two turns", lambda: service.metrics.turns["failed"] == 1)
        server_turns = [t["id"] for t in crew_server.turns(agent["id"])]  # newest first
        detail = (await local.get(f"/agents/{agent['id']}")).json()
        recent = detail["recent_turns"]
        assert [t["id"] for t in recent] == server_turns
        assert [t["status"] for t in recent] == ["failed", "succeeded"]
        assert recent[0]["failure_class"] == "engine_error"
        assert recent[0]["reason"] == "the model said boom"
        ok = recent[1]
        assert (ok["input_tokens"], ok["output_tokens"], ok["cost"]) == (10, 5, 0.01)
        assert ok["failure_class"] is None and ok["duration_ms"] >= 0
        assert detail["last_result"] == "failed" and detail["last_reason"] == "the model said boom"
        assert detail["state"] == "idle" and detail["turn_id"] is None

        # Control: stop with nothing running, unknown agents, wrong methods.
        idle_stop = await local.post(f"/agents/{agent['id']}/stop")
        assert idle_stop.status_code == 200
        assert idle_stop.json() == {"id": agent["id"], "accepted": False}
        for method, path in (
            ("GET", "/agents/nobody"),
            ("POST", "/agents/nobody/wake"),
            ("POST", "/agents/nobody/stop"),
        ):
            missing = await local.request(method, path)
            assert missing.status_code == 404
            assert missing.headers["content-type"] == "application/json"
            assert missing.json()["error"]["code"] == "not_found"
            assert "nobody" in missing.json()["error"]["message"]

        # The desktop app's buttons on a running turn: wake merges, stop cancels.
        crew_server.post(room["id"], "third")
        with anyio.fail_after(20):
            await engine.started.wait()
        running = (await local.get(f"/agents/{agent['id']}")).json()
        assert running["state"] == "running" and running["turn_id"]
        assert (await local.get("/health")).json()["running_turns"] == 1
        woken = await local.post(f"/agents/{agent['id']}/wake")
        assert woken.status_code == 202 and woken.json() == {"id": agent["id"], "accepted": True}
        assert (await local.get(f"/agents/{agent['id']}")).json()["pending_wake"] is True
        stopped = await local.post(f"/agents/{agent['id']}/stop")
        assert stopped.status_code == 202 and stopped.json()["accepted"] is True
        await wait_until_async("cancelled", lambda: service.metrics.turns["cancelled"] == 1)
        after = (await local.get(f"/agents/{agent['id']}")).json()
        [cancelled] = [t for t in after["recent_turns"] if t["id"] == running["turn_id"]]
        assert (cancelled["status"], cancelled["failure_class"]) == ("cancelled", "stopped")
        assert crew_server.turn(running["turn_id"])["status"] == "cancelled"
        # The merged wake-up runs once more: the stopped turn's messages were not acked.
        # After "second" failed, turns take the oldest message alone until it succeeds
        # (a message that keeps failing is isolated, then set aside): "second", then "third".
        await wait_until_async("the next turns", lambda: service.metrics.turns["succeeded"] == 3)
        assert "second" in engine.inputs[3] and "third" not in engine.inputs[3]
        assert "third" in engine.inputs[4]

        text = (await local.get("/metrics")).text
        families = parse_prometheus(text)
        assert families["crew_turns_total"].samples == {
            ("result", "succeeded"): 3,
            ("result", "failed"): 1,
            ("result", "cancelled"): 1,
        }
        assert families["crew_turn_duration_seconds"].samples[("le", "+Inf")] == 5
        assert families["crew_report_batches_total"].samples[("outcome", "sent")] >= 2


async def test_an_agents_own_turn_time_limit_reaches_its_turns_and_a_change_keeps_the_turn(
    crew_server: Any, tmp_path: Path
) -> None:
    comp = crew_server.create_computer()
    timed = crew_server.create_agent(
        "timed2", computer_id=comp["computer_id"], turn_time_limit_s=60
    )
    plain = crew_server.create_agent("plain2", computer_id=comp["computer_id"])
    timed_dm = crew_server.create_room("dm", [timed["id"]])
    plain_dm = crew_server.create_room("dm", [plain["id"]])
    release = anyio.Event()
    engine = ScriptedEngine(script=[blocking(release)])
    crew_home = tmp_path / "crew"
    parts = FakeParts(crew_home, engine)
    async with serving(crew_server, crew_home, parts, comp["token"], turn_time_limit_s=3600) as (
        service,
        _,
    ):
        turns = service.metrics.turns
        runner = service.roster.runners[timed["id"]]
        crew_server.post(timed_dm["id"], "a long build")
        with anyio.fail_after(20):
            await engine.started.wait()
        assert engine.limits == [60]
        # Raised while the build runs: the runner stays (replacing it would end the build).
        crew_server.client().patch(
            f"/api/agents/{timed['id']}", json={"turn_time_limit_s": 7200}
        ).raise_for_status()
        await wait_until_async("the new limit", lambda: runner.wall_clock_limit_s == 7200)
        assert service.roster.runners[timed["id"]] is runner
        release.set()
        await wait_until_async("the build", lambda: turns["succeeded"] == 1)
        assert turns["cancelled"] == 0
        crew_server.post(timed_dm["id"], "another build")
        await wait_until_async("the second turn", lambda: turns["succeeded"] == 2)
        crew_server.post(plain_dm["id"], "and you?")
        await wait_until_async("the plain agent's turn", lambda: turns["succeeded"] == 3)
        # null: back to the Computer's bootstrap default.
        crew_server.client().patch(
            f"/api/agents/{timed['id']}", json={"turn_time_limit_s": None}
        ).raise_for_status()
        await wait_until_async("the default again", lambda: runner.wall_clock_limit_s == 3600)
        crew_server.post(timed_dm["id"], "a short one")
        await wait_until_async("the last turn", lambda: turns["succeeded"] == 4)
        assert engine.limits == [60, 7200, 3600, 3600]
        assert engine.agents == [timed["id"], timed["id"], plain["id"], timed["id"]]


@pytest.mark.parametrize("field", ["name", "handle", "persona", "engine", "model"])
def test_each_setting_that_replaces_a_runner(field: str) -> None:
    base = {
        "id": "a",
        "handle": "h",
        "name": "N",
        "persona": "p",
        "engine": "opencode",
        "model": "x/y",
    }
    before = AgentRecord.model_validate(base)
    after = AgentRecord.model_validate({**base, field: base[field] + "2"})
    assert before.settings() != after.settings()
    unrelated = AgentRecord.model_validate(
        {**base, "status": "replying", "problem": "x", "turn_time_limit_s": 60}
    )
    assert before.settings() == unrelated.settings()


# --- a small Prometheus text-format (0.0.4) parser ---------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{(.*)\}})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.)*)"')


class Family:
    def __init__(self, name: str, kind: str) -> None:
        self.name = name
        self.kind = kind
        self.help = ""
        # One label pair (or ()) → value; histograms keep their series apart below.
        self.samples: dict[tuple[str, str] | tuple[()], float] = {}
        self.buckets: list[tuple[float, float]] = []
        self.sum: float | None = None
        self.count: float | None = None


def parse_prometheus(text: str) -> dict[str, Family]:
    """Parse and check the exposition format: HELP/TYPE before samples, valid names and
    labels, float values, and for histograms cumulative buckets ending in `+Inf` = `_count`."""
    assert text.endswith("\n")
    families: dict[str, Family] = {}
    helps: dict[str, str] = {}
    for line in text.splitlines():
        assert line == line.strip() and line, f"stray whitespace or blank line: {line!r}"
        if line.startswith("# HELP "):
            name, _, doc = line[7:].partition(" ")
            assert re.fullmatch(_NAME, name) and doc and name not in helps, line
            helps[name] = doc
            continue
        if line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped"), line
            assert name not in families, f"TYPE given twice: {line}"
            assert name in helps, f"TYPE before HELP: {line}"
            families[name] = Family(name, kind)
            families[name].help = helps[name]
            continue
        assert not line.startswith("#"), line
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        sample, labels_text, value_text = match.groups()
        value = float(value_text)
        labels = _LABEL.findall(labels_text or "")
        if labels_text:
            assert ",".join(f'{k}="{v}"' for k, v in labels) == labels_text, line
        family = next(
            (
                f
                for name, f in families.items()
                if sample == name
                or (
                    f.kind == "histogram"
                    and sample in (f"{name}_bucket", f"{name}_sum", f"{name}_count")
                )
            ),
            None,
        )
        assert family is not None, f"sample before its TYPE: {line}"
        if family.kind == "histogram":
            if sample.endswith("_bucket"):
                [(key, bound)] = labels
                assert key == "le", line
                family.buckets.append((float(bound), value))
                family.samples[("le", bound)] = value
            elif sample.endswith("_sum"):
                family.sum = value
            else:
                family.count = value
        else:
            key_value: tuple[str, str] | tuple[()] = labels[0] if labels else ()
            assert key_value not in family.samples, f"sample repeated: {line}"
            family.samples[key_value] = value
        if family.kind == "counter":
            assert value >= 0, line
    for family in families.values():
        if family.kind != "histogram":
            assert family.samples, f"{family.name}: no samples"
            continue
        bounds = [b for b, _ in family.buckets]
        counts = [c for _, c in family.buckets]
        assert bounds == sorted(bounds) and bounds[-1] == float("inf"), family.name
        assert counts == sorted(counts), f"{family.name}: buckets not cumulative"
        assert family.count is not None and family.sum is not None, family.name
        assert counts[-1] == family.count, f"{family.name}: +Inf bucket != _count"
    return families


def test_metrics_are_valid_prometheus_text_with_cumulative_buckets() -> None:
    from computer_service.engine.base import Usage
    from computer_service.metrics import Metrics

    metrics = Metrics()
    metrics.queue_length = lambda: 3
    for status, seconds in (
        ("succeeded", 0.05),
        ("succeeded", 0.7),
        ("failed", 42.0),
        ("cancelled", 4000.0),  # past the last bound: only in +Inf
    ):
        metrics.turn_finished(status, seconds)
    metrics.batches_sent, metrics.batches_dropped = 5, 2
    assert "crew_agent_cost_total" not in metrics.render()  # no family without samples
    metrics.usage_reported("a1", 'we"ird', Usage(input_tokens=10, output_tokens=2, cost=0.5))
    metrics.usage_reported("a1", 'we"ird', Usage(input_tokens=1, cache_read=7, cost=0.25))
    metrics.usage_reported("a2", "bob", Usage(output_tokens=3))
    families = parse_prometheus(metrics.render())
    assert families["crew_agent_input_tokens_total"].samples == {
        ("agent_id", "a1"): 11,
        ("agent_id", "a2"): 0,
    }
    assert families["crew_agent_cache_read_tokens_total"].samples[("agent_id", "a1")] == 7
    assert families["crew_agent_cost_total"].samples[("agent_id", "a1")] == 0.75
    assert families["crew_agent_turns_total"].kind == "counter"
    assert 'handle="we\\"ird"' in metrics.render()
    assert families["crew_computer_build_info"].samples == {("version", VERSION): 1}
    assert set(families) >= {
        "crew_turns_total",
        "crew_turn_duration_seconds",
        "crew_report_batches_total",
        "crew_turn_queue_length",
    }
    assert families["crew_turns_total"].kind == "counter"
    assert families["crew_turns_total"].samples == {
        ("result", "cancelled"): 1,
        ("result", "failed"): 1,
        ("result", "succeeded"): 2,
    }
    duration = families["crew_turn_duration_seconds"]
    assert duration.kind == "histogram"
    assert duration.samples[("le", "0.1")] == 1
    assert duration.samples[("le", "1")] == 2
    assert duration.samples[("le", "60")] == 3
    assert duration.samples[("le", "1800")] == 3
    assert duration.samples[("le", "+Inf")] == 4 == duration.count
    assert duration.sum == pytest.approx(4042.75)
    assert families["crew_report_batches_total"].samples == {
        ("outcome", "sent"): 5,
        ("outcome", "dropped"): 2,
    }
    assert families["crew_turn_queue_length"].kind == "gauge"
    assert families["crew_turn_queue_length"].samples == {(): 3}


def test_the_parser_refuses_broken_text() -> None:
    good = "# HELP x_total X.\n# TYPE x_total counter\nx_total 1\n"
    parse_prometheus(good)
    for broken in (
        "x_total 1\n",  # no TYPE
        "# TYPE x_total counter\nx_total 1\n",  # no HELP
        good.replace("x_total 1", "x_total one"),
        good.replace("\n", "", 1)[:-1],
        "# HELP h H.\n# TYPE h histogram\n"
        'h_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n',  # not cumulative
        "# HELP h H.\n# TYPE h histogram\n"
        'h_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_sum 1\nh_count 3\n',  # +Inf != count
        '# HELP h H.\n# TYPE h histogram\nh_bucket{le="1"} 1\nh_sum 1\nh_count 1\n',  # no +Inf
    ):
        with pytest.raises((AssertionError, ValueError)):
            parse_prometheus(broken)
