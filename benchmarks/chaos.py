"""`scripts/bench chaos`: every message answered exactly once under random faults, counted from the database.

The storm (crew_testkit/storm.py) with every fault of crew_testkit/chaos.py: a
fault every few seconds drawn from `--seed` (kill -9 or SIGSTOP of the Computer,
the launcher, the server, a warm server; the database's disk full), restarts as
a supervisor would, several agents and concurrent posters. At the end
crew_testkit/answer_ledger.py reads the server's database and prints messages,
answered once, answered twice, lost, set aside (with notice) and stuck turns.
Exits 1 unless twice = lost = stuck = 0.

Usage: scripts/bench chaos --seed S [--size small|medium|large]
                           [--faults computer,computer_stop,…] [--messages N]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crew_testkit.chaos import CHAOS_KINDS, DEFAULT_FAULTS, SIZES, chaos_plan, run_chaos
from crew_testkit.storm import StormResult


def report(result: StormResult) -> None:
    plan = result.plan
    print(
        f"chaos: seed {plan.seed}, {plan.messages} messages to {plan.agents} agents from "
        f"{plan.clients} clients at {plan.rate:g}/s, {plan.engine_mode} engine"
    )
    for note in result.notes:
        print(f"  note: {note}")
    kinds = result.faults_by_kind()
    print("  faults: " + ", ".join(f"{k} {kinds[k]}" for k in plan.faults if kinds[k]))
    print(f"  posts confirmed {result.posted}, refused or unanswered {result.post_refusals}")
    turns = ", ".join(f"{k} {n}" for k, n in sorted(result.turns.items()))
    print(f"  turns: {turns}")
    print(f"  wall {result.wall_s:.1f} s{'' if result.quiet else ' (NOT quiet: timed out)'}, "
          f"crew-computer exit {result.computer_exit}")  # fmt: skip
    assert result.ledger is not None
    print("counted from the database:")
    for line in result.ledger.summary().splitlines():
        print(f"  {line}")
    if not result.ledger.ok:
        print(result.ledger.details())
    # A cross-check of the count: the replies name the messages they answer.
    print(f"  (by the tokens the replies name: {len(result.answered_twice)} answered twice, "
          f"{len(result.lost)} never named)")  # fmt: skip
    if result.kept:
        print(f"  logs and database kept in {result.kept}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--size", choices=sorted(SIZES), default="medium")
    parser.add_argument("--faults", default=",".join(DEFAULT_FAULTS),
                        help=f"comma-separated, of {','.join(CHAOS_KINDS)}")  # fmt: skip
    parser.add_argument("--messages", type=int, help="instead of the size's")
    parser.add_argument("--keep", type=Path, default=Path("/tmp/chaos-logs"),
                        help="where the logs of a run that failed are copied")  # fmt: skip
    args = parser.parse_args()
    plan = chaos_plan(args.seed, args.size, tuple(k for k in args.faults.split(",") if k))
    if args.messages:
        plan = dataclasses.replace(plan, messages=args.messages)
    result = run_chaos(plan, keep=args.keep)
    report(result)
    assert result.ledger is not None
    sys.exit(0 if result.ledger.ok else 1)


if __name__ == "__main__":
    main()
