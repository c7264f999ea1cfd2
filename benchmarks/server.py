"""Reference server throughput: `scripts/bench server [--messages N] [--clients C]`.

A real `crew-server --dev` subprocess on loopback with a file database; 100 agents
(on one Computer) in 10 groups of 10. Measured side by side in one run:

- posts/s: N user messages posted by C concurrent httpx clients (each post wakes the
  group's 10 agents), against `GET /health` requests/s with the same clients (the
  HTTP floor of this machine);
- the median latency of an unread claim returning 1 new message (then acked), against
  the median of `GET /health` from the same client;
- the first claim of an agent with everything unread (1/10 of N messages; a claim is
  bounded at 200 messages), and the time to drain that backlog in bounded claims.

Targets (quality.md): ≥ 1,000 posts/s and ≤ 5 ms per claim on the 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crew_testkit.crew_server_proc import CrewServer, start_crew_server

GROUPS = 10
PER_GROUP = 10


def setup(server: CrewServer) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """One Computer (connected), 100 agents, 10 groups of 10."""
    computer = server.create_computer("bench")
    server.connection(computer)
    agents = [
        server.create_agent(f"a{i:03d}", computer_id=computer["computer_id"])
        for i in range(GROUPS * PER_GROUP)
    ]
    groups = [
        server.create_room(
            "group",
            [a["id"] for a in agents[g * PER_GROUP : (g + 1) * PER_GROUP]],
            title=f"group {g}",
        )
        for g in range(GROUPS)
    ]
    return computer, agents, groups


async def hammer(
    server: CrewServer, clients: int, total: int, request: Any
) -> tuple[float, list[float]]:
    """`total` calls of `request(client, i)` spread over `clients` connections (as the user)
    → (seconds, latencies)."""
    latencies: list[float] = []
    counter = iter(range(total))

    async def worker() -> None:
        async with httpx.AsyncClient(
            base_url=server.url, timeout=30, headers=server.user_headers
        ) as client:
            for i in counter:
                start = time.perf_counter()
                response = await request(client, i)
                latencies.append(time.perf_counter() - start)
                if response.status_code >= 300:
                    raise RuntimeError(f"{response.status_code}: {response.text}")

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return time.perf_counter() - start, latencies


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux /proc); None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def claim_and_ack(
    client: httpx.Client, headers: dict[str, str], agent_id: str
) -> tuple[float, int, bool]:
    """Claim unread (timed), then register a turn, ack and finish it (not timed)
    → (seconds, messages, more)."""
    start = time.perf_counter()
    answer = client.post(f"/computer/agents/{agent_id}/unread", headers=headers)
    elapsed = time.perf_counter() - start
    answer.raise_for_status()
    count = sum(len(r["messages"]) for r in answer.json()["rooms"])
    more = bool(answer.json()["more"])
    turn = client.post(
        f"/computer/agents/{agent_id}/turns",
        json={"rooms": [], "input": "bench", "engine": "opencode", "model": "m/x"},
        headers=headers,
    ).json()
    client.post(
        f"/computer/agents/{agent_id}/ack",
        json={"turn_id": turn["turn_id"], "fence": turn["fence"]},
        headers=headers,
    ).raise_for_status()
    client.post(
        f"/computer/turns/{turn['turn_id']}/finish",
        json={"fence": turn["fence"], "status": "succeeded"},
        headers=headers,
    ).raise_for_status()
    return elapsed, count, more


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--claims", type=int, default=300)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, start_crew_server(Path(tmp)) as server:
        computer, agents, groups = setup(server)
        headers = server.connection(computer)

        async def post(client: httpx.AsyncClient, i: int) -> httpx.Response:
            room = groups[i % GROUPS]["id"]
            return await client.post(f"/api/rooms/{room}/messages", json={"body": f"message {i}"})

        async def health(client: httpx.AsyncClient, i: int) -> httpx.Response:
            return await client.get("/health")

        pid = server.process.pid
        cpu0 = cpu_seconds(pid)
        floor_s, floor_lat = asyncio.run(hammer(server, args.clients, args.messages, health))
        cpu1 = cpu_seconds(pid)
        post_s, post_lat = asyncio.run(hammer(server, args.clients, args.messages, post))
        cpu2 = cpu_seconds(pid)

        client = server.client()
        # First claim: an agent with all of its group's messages unread; then the rest.
        first_claim, first_count, more = claim_and_ack(client, headers, agents[0]["id"])
        drain_start = time.perf_counter()
        drained, drain_claims = first_count, 1
        while more:
            _, count, more = claim_and_ack(client, headers, agents[0]["id"])
            drained, drain_claims = drained + count, drain_claims + 1
        drain_s = first_claim + time.perf_counter() - drain_start
        # Steady state: one new message, one claim (timed), then ack.
        claims: list[float] = []
        pings: list[float] = []
        for i in range(args.claims):
            agent = agents[PER_GROUP * (i % GROUPS) + 1]
            if i < GROUPS:
                while claim_and_ack(client, headers, agent["id"])[2]:  # drain the backlog first
                    pass
            group = groups[i % GROUPS]["id"]
            client.post(f"/api/rooms/{group}/messages", json={"body": f"ping {i}"})
            elapsed, count, _ = claim_and_ack(client, headers, agent["id"])
            assert count == 1, f"claim {i} returned {count} messages"
            claims.append(elapsed)
            start = time.perf_counter()
            client.get("/health").raise_for_status()
            pings.append(time.perf_counter() - start)

    posts_per_s = args.messages / post_s
    floor_per_s = args.messages / floor_s
    claim_ms = statistics.median(claims) * 1000
    ping_ms = statistics.median(pings) * 1000
    print(
        f"crew-server benchmark: {GROUPS * PER_GROUP} agents in {GROUPS} groups, "
        f"{args.messages} messages, {args.clients} concurrent clients, file db (WAL)"
    )
    print(
        f"  posts:            {posts_per_s:8.0f} /s   (median {statistics.median(post_lat) * 1000:.2f} ms)"
        f"   target >= 1000 /s"
    )
    print(
        f"  GET /health:      {floor_per_s:8.0f} /s   (median {statistics.median(floor_lat) * 1000:.2f} ms)"
    )
    print(f"  ratio posts / health throughput: {posts_per_s / floor_per_s:.2f}")
    print(f"  unread claim (1 new message), median: {claim_ms:.2f} ms   target <= 5 ms")
    print(f"  GET /health (same client), median:    {ping_ms:.2f} ms")
    print(f"  ratio claim / health latency: {claim_ms / ping_ms:.2f}")
    print(f"  first claim with {first_count} unread messages: {first_claim * 1000:.1f} ms")
    print(
        f"  drain of {drained} unread messages in {drain_claims} bounded claims "
        f"(each with its turn and ack): {drain_s * 1000:.1f} ms"
    )
    if cpu0 is not None and cpu1 is not None and cpu2 is not None:
        post_cpu = (cpu2 - cpu1) / args.messages * 1e6
        health_cpu = (cpu1 - cpu0) / args.messages * 1e6
        print(
            f"  server CPU per post: {post_cpu:.0f} us (one core: ~{1e6 / post_cpu:.0f} posts/s); "
            f"per GET /health: {health_cpu:.0f} us; ratio {post_cpu / health_cpu:.2f}"
        )
        print(
            "  (the httpx clients share the same cores: on a loaded machine they, not the "
            "server, set the posts/s)"
        )
    ok = posts_per_s >= 1000 and claim_ms <= 5
    print("  targets met" if ok else "  targets NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
