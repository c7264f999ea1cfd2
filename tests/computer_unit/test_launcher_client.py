"""LauncherClient against the in-test stand-in; the frames and answers it reads."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from computer_service.launcher_client import (
    LauncherClient,
    LauncherError,
    LauncherRefused,
    LauncherUnavailable,
    frame_of,
    split_lines,
)
from crew_common.launcher_wire import (
    EngineArgs,
    ExitFrame,
    Health,
    LineFrame,
    ModelsRequest,
    RunRequest,
    StartedFrame,
)
from crew_testkit.computer_proc import FAKE_OPENCODE
from tests.computer_unit.launcher_standin import StandinState, serve_standin

pytestmark = pytest.mark.anyio

FAKE = str(FAKE_OPENCODE)


@pytest.fixture
def sock() -> Iterator[Path]:
    """A short Unix socket path (they are limited to ~108 bytes), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="lc-", dir="/tmp"))
    try:
        yield d / "l.sock"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_request(tmp_path: Path, stdin: str, limit: int = 8 << 20) -> RunRequest:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "PWD": str(work), "XDG_DATA_HOME": str(tmp_path / "data")}
    return RunRequest(
        run_id="r1", agent_id="a1", agent_dir=str(tmp_path), runtime_dir=str(tmp_path / "rt"),
        bin_dir=str(tmp_path / "bin"), model="local/m", env=env, stdin=stdin, stdout_limit=limit,
        engine_args=EngineArgs(model="local/m", title="t", dir=str(work)),
    )  # fmt: skip


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for p in parts:
        yield p


async def test_split_lines_across_chunks_and_long_lines() -> None:
    long = b"x" * 200_000
    got = [
        x
        async for x in split_lines(
            chunks(b"a\nb", b"c\n" + long[:100], long[100:] + b"\nend"), 1 << 20
        )
    ]
    assert got == [b"a", b"bc", long, b"end"]
    with pytest.raises(LauncherError, match="over 10 bytes"):
        _ = [x async for x in split_lines(chunks(b"y" * 11), 10)]


def test_frame_of() -> None:
    assert frame_of(b'{"t":"started","pid":5}') == StartedFrame(t="started", pid=5)
    assert frame_of(b'{"t":"line","data":"{}"}') == LineFrame(t="line", data="{}")
    exit_frame = frame_of(b'{"t":"exit","code":0,"signal":null,"stderr_tail":"","reason":null}')
    assert isinstance(exit_frame, ExitFrame) and exit_frame.code == 0
    for bad in (b"nope", b'{"t":"what"}', b'{"t":"line"}', b"[1]"):
        with pytest.raises(LauncherError):
            frame_of(bad)


def test_frames_are_read_with_the_launchers_models() -> None:
    """What the launcher's own models refuse, the client refuses: one schema, both ends."""
    for bad in (
        b'{"t":"started"}',  # no pid
        b'{"t":"started","pid":"five"}',
        b'{"t":"exit","code":0}',  # no stderr_tail
        b'{"t":"log"}',
    ):
        with pytest.raises(LauncherError, match="malformed"):
            frame_of(bad)


def test_the_client_reads_what_a_newer_launcher_may_add() -> None:
    """Deliberately loose: a launcher started from newer files (an upgrade in place) may
    add a field to any answer, or a new reason to the exit frame; neither loses a run."""
    started = frame_of(b'{"t":"started","pid":5,"cgroup":"/crew/r1"}')
    assert started == StartedFrame(t="started", pid=5)
    ended = frame_of(b'{"t":"exit","code":1,"signal":null,"stderr_tail":"","reason":"quota"}')
    assert isinstance(ended, ExitFrame) and ended.reason == "quota" and ended.code == 1
    health = Health.model_validate(
        {"sandbox": {"ok": True, "backend": "bwrap", "gpu": "none"}, "engine": None, "extra": 1}
    )
    assert health.sandbox.ok
    # Not loose where the document is closed: an unknown backend is no sandbox it knows.
    with pytest.raises(ValidationError):
        Health.model_validate({"sandbox": {"ok": True, "backend": "chroot"}, "engine": None})


async def test_client_against_standin(tmp_path: Path, sock: Path) -> None:
    state = StandinState(secret="s3cret", opencode_path=FAKE)
    async with serve_standin(sock, state), LauncherClient(sock, "s3cret") as client:
        health = await client.health()
        assert health.sandbox.ok and health.engine is not None
        listing = ModelsRequest(env={"OPENCODE_DISABLE_MODELS_FETCH": "1"}, price_table="{}")
        assert await client.models(listing) == ["local/scripted", "local/other"]
        assert state.models_requests == [listing.model_dump()]
        assert await client.runs() == []
        await client.stop("no-such-run")  # 404 is fine
        frames = [f async for f in client.run(run_request(tmp_path, "FAKE:LONGLINE"))]
        assert isinstance(frames[0], StartedFrame)
        assert isinstance(frames[-1], ExitFrame) and frames[-1].code == 0
        lines = [f for f in frames if isinstance(f, LineFrame)]
        assert max(len(f.data) for f in lines) > 100_000  # no 64 KiB line limit
        sent = state.requests[0]
        assert sent["engine_args"] == {
            "session_id": None,
            "model": "local/m",
            "title": "t",
            "dir": str(tmp_path / "work"),
        }
        assert sent["run_id"] == "r1" and sent["stdout_limit"] == 8 << 20
        async with LauncherClient(sock, "wrong") as bad:
            with pytest.raises(LauncherRefused) as info:
                await bad.health()
            assert info.value.status == 401 and info.value.code == "unauthorized"


async def test_refused_run_carries_the_reason(tmp_path: Path, sock: Path) -> None:
    state = StandinState(secret="s", opencode_path=FAKE)
    state.health["sandbox"] = {"ok": False, "backend": "bwrap", "reason": "bwrap not found"}
    async with serve_standin(sock, state), LauncherClient(sock, "s") as client:
        with pytest.raises(LauncherRefused, match="bwrap not found") as info:
            _ = [f async for f in client.run(run_request(tmp_path, "hi"))]
        assert info.value.status == 503


async def test_unreachable_launcher(tmp_path: Path) -> None:
    async with LauncherClient(tmp_path / "missing.sock", "s") as client:
        with pytest.raises(LauncherUnavailable, match="cannot reach"):
            await client.health()
        with pytest.raises(LauncherUnavailable):
            _ = [f async for f in client.run(run_request(tmp_path, "hi"))]


def test_request_models_forbid_extra_keys(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        EngineArgs.model_validate({"model": "m", "title": "t", "dir": "/", "argv": ["rm"]})
    body = orjson.loads(orjson.dumps(run_request(tmp_path, "in").model_dump(mode="json")))
    assert set(body) == {
        "run_id", "agent_id", "agent_dir", "runtime_dir", "bin_dir", "interpreter_dirs", "model",
        "session_id", "env", "stdin", "stdout_limit", "engine_args", "loopback_ports",
        "publish_port", "egress",
    }  # fmt: skip
