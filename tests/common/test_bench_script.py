"""`scripts/bench --help` lists every benchmark, one line each, without setting anything up."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py"))

pytestmark = pytest.mark.timeout(60)


def bench(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "scripts" / "bench"), *argv], capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_each_benchmark_on_its_own_line(flag: str) -> None:
    done = bench(flag)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  ")}
    assert list(lines) == BENCHMARKS
    assert "CPU per engine event" in lines["engine_events"]  # the docstring's first line


@pytest.mark.parametrize("argv", [[], ["no_such_benchmark"]])
def test_no_or_an_unknown_benchmark_is_a_usage_error(argv: list[str]) -> None:
    done = bench(*argv)
    assert done.returncode == 2
    assert done.stdout == "" and "usage: scripts/bench" in done.stderr
