"""A prepared agent + a cold OpenCodeEngine wired to a launcher (stand-in or real), for engine tests."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from computer_service.engine.base import (
    EngineEvent,
    SessionPlan,
    TurnRequest,
    TurnResult,
)
from computer_service.engine.cold_run import ColdRun, Launcher
from computer_service.engine.pipeline import OpenCodeEngine
from computer_service.engine.preparation import Preparation
from computer_service.engine.user_opencode import UserOpenCode
from computer_service.home import AgentHome
from computer_service.run_dir import RunDirectory
from crew_common.layout import AgentPaths
from crew_testkit.computer_proc import FAKE_OPENCODE as FAKE_OPENCODE_PATH

FAKE_OPENCODE = str(FAKE_OPENCODE_PATH)
AGENT_TOKEN = "agent-token-0123456789abcdef"
AUTH = {"local": {"type": "api", "key": "sk-user-secret-key-42"}}
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class Agent:
    id: str
    handle: str
    name: str
    persona: str


@contextmanager
def short_dir() -> Iterator[Path]:
    """A short directory for Unix sockets (paths are limited to ~108 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="eng-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@dataclass
class Rig:
    crew_home: Path
    run: RunDirectory
    home: AgentHome
    user: UserOpenCode
    engine: OpenCodeEngine | None = None
    events: list[EngineEvent] = field(default_factory=list)

    @property
    def paths(self) -> AgentPaths:
        return self.home.paths

    def use(self, launcher: Launcher, **kw: Any) -> OpenCodeEngine:
        """The cold engine on `launcher`; `kw` are `Preparation`'s (`stdout_limit`, `environ`)."""
        preparation = Preparation(
            crew_home=self.crew_home,
            run_id=self.run.run_id,
            server_url="http://127.0.0.1:9",
            bin_dir=self.run.bin_dir,
            interpreter_dirs=self.run.interpreter_dirs(),
            user=self.user,
            base_path=BASE_PATH,
            lang="C.UTF-8",
            **kw,
        )
        self.engine = OpenCodeEngine(preparation, ColdRun(launcher, end_grace_s=2.0))
        return self.engine

    def plan(self, model: str = "local/scripted") -> SessionPlan:
        assert self.engine is not None
        return self.engine.plan_session(self.paths.agent_id, model, self.home.agents_md)

    async def turn(
        self,
        text: str = "hello",
        *,
        model: str = "local/scripted",
        plan: SessionPlan | None = None,
        stop: anyio.Event | None = None,
        render: Callable[[bool], str] | None = None,
        **kw: Any,
    ) -> TurnResult:
        assert self.engine is not None
        self.events = []

        async def sink(event: EngineEvent) -> None:
            self.events.append(event)

        request = TurnRequest(
            agent_id=self.paths.agent_id,
            model=model,
            plan=plan if plan is not None else self.plan(model),
            render_input=render or (lambda new: ("NEW SESSION\n" if new else "") + text),
            **kw,
        )
        return await self.engine.run_turn(request, sink, stop or anyio.Event())

    def dumps(self) -> list[dict[str, Any]]:
        """What the fake opencode recorded, one entry per process, in order."""
        d = self.paths.work_dir / ".fake-opencode"
        if not d.exists():
            return []
        return [json.loads(p.read_text()) for p in sorted(d.iterdir())]

    def forget_sessions(self) -> None:
        shutil.rmtree(self.paths.data_dir / "fake-opencode" / "sessions", ignore_errors=True)


def make_rig(tmp_path: Path, write_auth: bool = True, crew_home: Path | None = None) -> Rig:
    crew_home = crew_home or tmp_path / "crew"
    run = RunDirectory(crew_home, "run-1")
    run.prepare()
    agent = Agent("agent-0001", "alice", "Alice", "Helpful.")
    home = AgentHome(AgentPaths(crew_home, "run-1", agent.id), agent)
    home.prepare(AGENT_TOKEN)
    user_home = Path(os.environ["HOME"])
    user = UserOpenCode.from_env({"HOME": str(user_home)})
    if write_auth:
        user.auth_file.parent.mkdir(parents=True, exist_ok=True)
        user.auth_file.write_text(json.dumps(AUTH))
    return Rig(crew_home, run, home, user)


@asynccontextmanager
async def standin_launcher(opencode_path: str = FAKE_OPENCODE) -> AsyncIterator[Any]:
    """(client, state) of an in-process stand-in launcher (no sandbox)."""
    from computer_service.launcher_client import LauncherClient
    from tests.computer_unit.launcher_standin import StandinState, serve_standin

    with short_dir() as d:
        state = StandinState(secret="test-secret", opencode_path=opencode_path)
        async with (
            serve_standin(d / "l.sock", state),
            LauncherClient(d / "l.sock", state.secret) as c,
        ):
            yield c, state


@asynccontextmanager
async def sandboxed_rig(tmp_path: Path, opencode_path: str = FAKE_OPENCODE) -> AsyncIterator[Rig]:
    """A prepared agent and an engine wired to the REAL `sandbox_launcher` (bwrap).

    Skips locally (fails in CI) when the launcher or bwrap is missing or the
    sandbox self-test fails.
    """
    import importlib.util

    from computer_service.launcher_process import LauncherProcess, launcher_argv
    from tests.support.ci import required_in_ci

    if importlib.util.find_spec("sandbox_launcher.__main__") is None:
        required_in_ci("sandbox_launcher (its serve command)")
    if shutil.which("bwrap") is None and not Path("/usr/bin/bwrap").exists():
        required_in_ci("bwrap (Debian package bubblewrap)")
    # A short crew home: the launcher socket path must fit in ~108 bytes.
    crew_home = Path(tempfile.mkdtemp(prefix="crew-", dir="/tmp"))
    try:
        rig = make_rig(tmp_path, crew_home=crew_home)
        sock = crew_home / "sockets" / f"launcher-{rig.run.run_id}.sock"
        sock.parent.mkdir(mode=0o700, exist_ok=True)
        argv = launcher_argv(crew_home, rig.run.run_id, sock, opencode_path=opencode_path)
        proc = LauncherProcess(argv, sock)
        await proc.start(ready_timeout_s=60)
        try:
            async with proc.client() as client:
                health = await client.health()
                if not health.sandbox.ok:
                    required_in_ci(f"a usable sandbox ({health.sandbox.reason})")
                rig.use(client)
                yield rig
        finally:
            await proc.stop()
    finally:
        shutil.rmtree(crew_home, ignore_errors=True)
