"""Delivery under a storm with faults (issue 10): nothing lost, repeats only where allowed.

A real crew-server and a real crew-computer (real launcher and sandbox, the fake
engine) take a storm of user messages across K agents' DMs while faults strike
on a schedule drawn from the seed: kill -9 of the launcher, a server restart,
a disk-full window under the server's database (root only), and, when asked,
kill -9 of the Computer itself. Each reply names the messages it answers, so
the accounting per message is exact (crew_testkit/storm.py).

Printed: messages stored, answered, lost, answered twice (blamed on the fault
between the two answers), set aside, faults per kind, wall time. Exits 1 when
any message was lost. Only a kill -9 of the Computer may repeat an answer.

Usage: scripts/bench storm [--messages N --agents K --seed S
                            --faults launcher,server,disk[,computer]]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crew_testkit.storm import FAULT_KINDS, StormPlan, StormResult, run_storm


def share(part: int, whole: int) -> str:
    return f"{part / whole:7.1%}" if whole else "      -"


def report(result: StormResult) -> None:
    """The table, with each count as a share of the messages stored."""
    plan = result.plan
    stored = result.stored
    twice = result.answered_twice
    print(
        f"storm: {plan.messages} messages to {plan.agents} agents at {plan.rate:g}/s, "
        f"seed {plan.seed}, faults {','.join(plan.faults) or 'none'}"
    )
    for note in result.notes:
        print(f"  note: {note}")
    print(f"  messages stored          {stored:6d}   (posts confirmed {result.posted}, "
          f"refused or unanswered {result.post_refusals})")  # fmt: skip
    print(f"  answered                 {result.answered:6d}  {share(result.answered, stored)}")
    print(f"  lost                     {len(result.lost):6d}  {share(len(result.lost), stored)}"
          "   (target 0)")  # fmt: skip
    blamed = ", ".join(f"{k} {n}" for k, n in sorted(result.repeats_by_fault().items()))
    print(f"  answered twice or more   {len(twice):6d}  {share(len(twice), stored)}"
          f"   {f'(after: {blamed})' if blamed else ''}")  # fmt: skip
    print(f"  set aside (notice)       {result.set_aside:6d}  {share(result.set_aside, stored)}")
    kinds = result.faults_by_kind()
    print("  faults injected          " + ", ".join(f"{k} {kinds[k]}" for k in plan.faults))
    turns = ", ".join(f"{k} {n}" for k, n in sorted(result.turns.items()))
    print(f"  turns                    {sum(result.turns.values()):6d}   ({turns})")
    print(f"  wall time                {result.wall_s:6.1f} s  (first post → every message "
          f"answered or set aside{'' if result.quiet else ': NOT REACHED, timed out'})")  # fmt: skip
    if result.drain_s is not None:
        print(f"  last post → quiet        {result.drain_s:6.1f} s")
    print(f"  crew-computer exit       {result.computer_exit}")
    allowed = sum(n for k, n in result.repeats_by_fault().items() if k == "computer")
    verdict = "met" if not result.lost and allowed == len(twice) else "NOT met"
    print(f"  target: 0 lost, repeats only after a kill -9 of the Computer: {verdict}")
    if result.kept:
        print(f"  logs kept in {result.kept}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", default="launcher,server,disk",
                        help=f"comma-separated, of {','.join(FAULT_KINDS)}; empty for none")  # fmt: skip
    parser.add_argument("--rate", type=float, default=8.0, help="user messages per second")
    parser.add_argument("--every", type=float, default=8.0, help="mean seconds between faults")
    parser.add_argument("--think", type=float, default=0.5, help="engine seconds before replying")
    parser.add_argument("--linger", type=float, default=0.5, help="engine seconds after replying")
    parser.add_argument("--keep", type=Path, default=Path("/tmp/storm-logs"),
                        help="where the logs of a storm that lost messages are copied")  # fmt: skip
    args = parser.parse_args()
    faults = tuple(k for k in args.faults.split(",") if k)
    plan = StormPlan(
        messages=args.messages, agents=args.agents, seed=args.seed, faults=faults,
        rate=args.rate, fault_every_s=args.every, think_s=args.think, linger_s=args.linger,
    )  # fmt: skip
    result = run_storm(plan, keep_on_loss=args.keep)
    report(result)
    sys.exit(1 if result.lost else 0)


if __name__ == "__main__":
    main()
