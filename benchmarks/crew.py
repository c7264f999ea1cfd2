"""`scripts/bench crew`: how fast the `crew` command starts and completes a reply.

Measured side by side in one run (interleaved, so machine load hits all alike):
- `python -c pass` with the same interpreter: the floor every command pays;
- `crew --help`: start-up with no request;
- `crew reply` round trip (process start to exit) against a local reference
  server, both as the console script and as the Computer's wrapper runs it
  (`bin/crew`: `python -I -S`, the shim loaded by location; and the former
  `python -I -m crew_shim`, which paid for `site` and the venv's finder);
- for the record, what importing httpx or http.client would add.

Prints absolute medians and ratios to `python -c pass`. Target (quality.md):
the reply round trip ≤ 2.5×.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from computer_service.run_dir import crew_wrapper_script  # noqa: E402
from crew_testkit.crew_server_proc import CrewServer, start_crew_server  # noqa: E402

PYTHON = sys.executable
CREW = str(Path(PYTHON).with_name("crew"))
TARGET = 2.5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="runs per case (medians of these)")
    options = parser.parse_args()
    if options.runs < 20:
        parser.error("use at least 20 runs")

    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        server = start_crew_server(tmp)
        try:
            env, room = _agent_in_a_dm(server, tmp)
            wrapper_file = tmp / "crew-wrapper"
            wrapper_file.write_text(crew_wrapper_script(PYTHON))
            wrapper_file.chmod(0o700)
            body = b'Benchmark reply: `code`, $(not run) and "quotes".\n'

            def run(argv: list[str], stdin: bytes = b"") -> Callable[[], None]:
                def once() -> None:
                    done = subprocess.run(
                        argv, input=stdin, capture_output=True, env=env, check=False
                    )
                    if done.returncode != 0:
                        raise SystemExit(f"{argv} failed: {done.stderr.decode()}")

                return once

            cases: dict[str, Callable[[], None]] = {
                "python -c pass": run([PYTHON, "-c", "pass"]),
                "python -c 'import http.client'": run([PYTHON, "-c", "import http.client"]),
                "python -c 'import httpx'": run([PYTHON, "-c", "import httpx"]),
                "crew --help": run([CREW, "--help"]),
                "crew reply (round trip)": run([CREW, "reply", room], body),
                "python -I -m crew_shim reply (round trip)": run(
                    [PYTHON, "-I", "-m", "crew_shim", "reply", room], body
                ),
                "bin/crew wrapper reply (round trip)": run(
                    [str(wrapper_file), "reply", room], body
                ),
            }
            for once in cases.values():  # warm the page cache and .pyc files
                once()
            times: dict[str, list[float]] = {name: [] for name in cases}
            for _ in range(options.runs):
                for name, once in cases.items():
                    started = time.perf_counter()
                    once()
                    times[name].append(time.perf_counter() - started)
        finally:
            server.stop()

    floor = statistics.median(times["python -c pass"])
    print(f"crew start-up and reply round trip, medians of {options.runs} interleaved runs")
    print(f"{'case':45} {'median':>9} {'ratio':>7}")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:45} {median * 1000:7.1f}ms {median / floor:6.2f}×")
    ratio = statistics.median(times["crew reply (round trip)"]) / floor
    wrapper = statistics.median(times["bin/crew wrapper reply (round trip)"]) / floor
    verdict = "met" if max(ratio, wrapper) <= TARGET else "NOT met"
    print(
        f"target: reply round trip ≤ {TARGET}× python -c pass — {verdict} "
        f"(console script {ratio:.2f}×, wrapper {wrapper:.2f}×)"
    )
    return 0


def _agent_in_a_dm(server: CrewServer, tmp: Path) -> tuple[dict[str, str], str]:
    """An agent with a token file and a dm it can reply in; the env `crew` runs with."""
    computer = server.create_computer()
    agent = server.create_agent("bench", computer_id=computer["computer_id"])
    room = server.create_room("dm", [agent["id"]])
    answer = httpx.post(
        f"{server.url}/computer/agents/{agent['id']}/token",
        headers=server.connection(computer),
        timeout=10,
    )
    answer.raise_for_status()
    token_file = tmp / "token"
    token_file.write_text(answer.json()["token"])
    env = {
        "CREW_SERVER_URL": server.url,
        "CREW_TOKEN_FILE": str(token_file),
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
    }
    return env, room["id"]


if __name__ == "__main__":
    sys.exit(main())
