"""`scripts/bench engine_events`: Computer CPU per engine event, parser and engine loop.

Measured side by side in one run (interleaved rounds, so machine load hits all alike):
- `orjson.loads` of each line alone: the floor any parser pays;
- `engine_event_of` of each line: the parser (cuts, shapes, timestamps);
- the whole `OpenCodeEngine.run_turn` loop over 50,000 lines from an in-process
  launcher (NDJSON split → frame parse → event → step accounting → sink), i.e. the engine's share of
  the Computer's CPU per event, measured with `time.process_time`.

Lines are the real OpenCode samples (`tests/samples/opencode/*.stdout.jsonl`,
or synthetic sample-shaped lines when absent), repeated. Prints absolute
medians (µs per event) and ratios to the floor. Target (quality.md): the whole
event path ≤ 30 µs of Computer CPU per event — this shows the engine's part.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import orjson  # noqa: E402

from computer_service.engine.base import EngineEvent, SessionPlan, TurnRequest  # noqa: E402
from computer_service.engine.cold_run import ColdRun  # noqa: E402
from computer_service.engine.events import engine_event_of  # noqa: E402
from computer_service.engine.pipeline import OpenCodeEngine  # noqa: E402
from computer_service.engine.preparation import Preparation  # noqa: E402
from computer_service.engine.user_opencode import UserOpenCode  # noqa: E402
from computer_service.launcher_client import FRAME_LIMIT, frame_of, split_lines  # noqa: E402
from crew_common.launcher_wire import Frame, RunRequest  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[1] / "tests" / "samples" / "opencode"
TARGET_US = 30.0


def sample_lines() -> list[str]:
    lines: list[str] = []
    for f in sorted(SAMPLES.glob("*.stdout.jsonl")):
        if f.name.startswith("14"):
            continue  # the endless `unknown` loop: the step guard would end the turn
        # Error lines would fail the turn; every other real line is kept.
        lines += [x for x in f.read_text().splitlines() if x.strip() and '"type":"error"' not in x]
    if lines:
        return lines
    step = {"type": "step_finish", "timestamp": 1796018936035, "sessionID": "ses_x",
            "part": {"reason": "stop", "tokens": {"input": 99, "output": 20, "reasoning": 0,
                     "cache": {"write": 0, "read": 10}}, "cost": 0.000139}}  # fmt: skip
    text = {
        "type": "text",
        "timestamp": 1796018936333,
        "sessionID": "ses_x",
        "part": {"text": "done"},
    }
    return [orjson.dumps(step).decode(), orjson.dumps(text).decode()]


class InProcessLauncher:
    """Streams the lines as NDJSON frames, parsed as `LauncherClient.run` does, with no socket."""

    def __init__(self, lines: list[str]) -> None:
        frames = [{"t": "started", "pid": 1}, *({"t": "line", "data": x} for x in lines)]
        frames.append({"t": "exit", "code": 0, "signal": None, "stderr_tail": "", "reason": None})
        self.body = b"".join(orjson.dumps(f) + b"\n" for f in frames)

    async def run(self, request: RunRequest) -> AsyncGenerator[Frame, None]:
        async def chunks() -> AsyncIterator[bytes]:
            for i in range(0, len(self.body), 65536):
                yield self.body[i : i + 65536]

        async for line in split_lines(chunks(), FRAME_LIMIT):
            yield frame_of(line)

    async def stop(self, run_id: str) -> None:
        return None


def per_event_us(seconds: float, n: int) -> float:
    return seconds / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (medians)")
    parser.add_argument("--events", type=int, default=50_000, help="lines per engine turn")
    options = parser.parse_args()

    base = sample_lines()
    lines = (base * (options.events // len(base) + 1))[: options.events]
    encoded = [x.encode() for x in lines]

    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        auth = tmp / "auth.json"
        auth.write_text('{"local":{"type":"api","key":"k"}}')
        os.environ["HOME"] = str(tmp)
        preparation = Preparation(
            crew_home=tmp / "crew",
            run_id="bench",
            server_url="http://127.0.0.1:9",
            bin_dir=tmp / "bin",
            user=UserOpenCode(auth, (tmp / "none.json",), tmp / "none-models.json"),
            base_path="/usr/bin:/bin",
            lang="C.UTF-8",
        )
        engine = OpenCodeEngine(preparation, ColdRun(InProcessLauncher(lines)))
        request = TurnRequest(
            agent_id="agent", model="local/m", plan=SessionPlan(None),
            render_input=lambda new: "hi", max_steps=10**9,
        )  # fmt: skip

        async def sink(event: EngineEvent) -> None:
            return None

        floor, parser_t, loop_t = [], [], []
        for _ in range(options.rounds):
            t0 = time.process_time()
            for x in encoded:
                orjson.loads(x)
            floor.append(per_event_us(time.process_time() - t0, len(encoded)))

            t0 = time.process_time()
            for x in encoded:
                engine_event_of(x)
            parser_t.append(per_event_us(time.process_time() - t0, len(encoded)))

            t0 = time.process_time()
            result = anyio.run(engine.run_turn, request, sink, anyio.Event())
            loop_t.append(per_event_us(time.process_time() - t0, len(lines)))
            if result.status != "succeeded":
                raise SystemExit(f"the benchmark turn failed: {result.failure}")

    f, p, loop = (statistics.median(x) for x in (floor, parser_t, loop_t))
    print(f"lines: {len(lines)} ({len(base)} distinct sample lines), rounds: {options.rounds}")
    print(f"orjson.loads alone (floor):      {f:7.2f} µs/event")
    print(f"engine_event_of:                 {p:7.2f} µs/event   {p / f:5.2f}× floor")
    print(f"OpenCodeEngine turn loop:        {loop:7.2f} µs/event   {loop / f:5.2f}× floor")
    verdict = "OK" if loop <= TARGET_US else "OVER"
    print(
        f"target: whole event path ≤ {TARGET_US:.0f} µs/event; engine share {loop:.2f} µs → {verdict}"
    )
    return 0 if loop <= TARGET_US else 1


if __name__ == "__main__":
    sys.exit(main())
