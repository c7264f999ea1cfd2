"""Reference server throughput: `scripts/bench server [--messages N] [--clients C] [--db postgres --processes N]`.

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

With `--db postgres` the same run continues on a private PostgreSQL cluster
(crew_testkit.postgres; synchronous_commit=off, like SQLite's WAL + NORMAL) with
1, 2, … `--processes` server processes on one database, the clients spread over
them: posts/s, the unread-claim latency (each request to the next process), and
the wake latency across processes (a post through the first process until the
`wake` arrives on a stream held by the last one). The SQLite figures come first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crew_testkit.crew_server_proc import CrewServer, start_crew_server
from crew_testkit.postgres import BENCH_SETTINGS, PostgresCluster

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
    servers: list[CrewServer], clients: int, total: int, request: Any
) -> tuple[float, list[float]]:
    """`total` calls of `request(client, i)` spread over `clients` connections (as the user),
    client k on server k mod len(servers) → (seconds, latencies)."""
    latencies: list[float] = []
    counter = iter(range(total))

    async def worker(server: CrewServer) -> None:
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
    await asyncio.gather(*(worker(servers[k % len(servers)]) for k in range(clients)))
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


class WakeWatcher:
    """A Computer's event stream on one server, read in a thread: wakes by agent id."""

    def __init__(self, server: CrewServer, headers: dict[str, str]) -> None:
        self.wakes: queue.Queue[tuple[str, float]] = queue.Queue()
        self._client = httpx.Client(base_url=server.url, timeout=httpx.Timeout(10, read=None))
        self._headers = headers
        self._open = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        if not self._open.wait(10):
            raise RuntimeError("the event stream did not open")

    def _read(self) -> None:
        with (
            contextlib.suppress(httpx.HTTPError),
            self._client.stream("GET", "/computer/events", headers=self._headers) as answer,
        ):
            self._open.set()
            event = ""
            for line in answer.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "wake":
                    agent = line.split('"agent_id":"', 1)[1].split('"', 1)[0]
                    self.wakes.put((agent, time.perf_counter()))

    def close(self) -> None:
        self._client.close()
        self._thread.join(timeout=5)


def wake_latencies(
    servers: list[CrewServer], headers: dict[str, str], agent: dict[str, Any], room: str, count: int
) -> list[float]:
    """A post through the first server until its `wake` arrives on the last one's stream."""
    watcher = WakeWatcher(servers[-1], headers)
    client = servers[0].client()
    latencies = []
    try:
        for i in range(count):
            start = time.perf_counter()
            client.post(
                f"/api/rooms/{room}/messages", json={"body": f"wake {i}"}
            ).raise_for_status()
            while True:
                woken, at = watcher.wakes.get(timeout=10)
                if woken == agent["id"]:
                    latencies.append(at - start)
                    break
    finally:
        watcher.close()
    return latencies


def measure(servers: list[CrewServer], args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of one configuration (one or several processes on one database)."""
    first = servers[0]
    computer, agents, groups = setup(first)
    headers = first.connection(computer)
    dm = first.create_room("dm", [agents[-1]["id"]])

    async def post(client: httpx.AsyncClient, i: int) -> httpx.Response:
        room = groups[i % GROUPS]["id"]
        return await client.post(f"/api/rooms/{room}/messages", json={"body": f"message {i}"})

    async def health(client: httpx.AsyncClient, i: int) -> httpx.Response:
        return await client.get("/health")

    figures: dict[str, Any] = {}
    pids = [s.process.pid for s in servers]
    cpu0 = [cpu_seconds(pid) for pid in pids]
    floor_s, floor_lat = asyncio.run(hammer(servers, args.clients, args.messages, health))
    cpu1 = [cpu_seconds(pid) for pid in pids]
    post_s, post_lat = asyncio.run(hammer(servers, args.clients, args.messages, post))
    cpu2 = [cpu_seconds(pid) for pid in pids]
    figures["posts_per_s"] = args.messages / post_s
    figures["post_ms"] = statistics.median(post_lat) * 1000
    figures["floor_per_s"] = args.messages / floor_s
    figures["floor_ms"] = statistics.median(floor_lat) * 1000
    if None not in cpu0 + cpu1 + cpu2:
        figures["post_cpu_us"] = (
            sum(b - a for a, b in zip(cpu1, cpu2, strict=True)) / args.messages * 1e6
        )
        figures["health_cpu_us"] = (
            sum(b - a for a, b in zip(cpu0, cpu1, strict=True)) / args.messages * 1e6
        )

    clients = [s.client() for s in servers]
    # First claim: an agent with all of its group's messages unread; then the rest.
    first_claim, first_count, more = claim_and_ack(clients[0], headers, agents[0]["id"])
    drain_start = time.perf_counter()
    drained, drain_claims = first_count, 1
    while more:
        _, count, more = claim_and_ack(clients[0], headers, agents[0]["id"])
        drained, drain_claims = drained + count, drain_claims + 1
    figures["first_claim"] = (first_count, first_claim * 1000)
    figures["drain"] = (
        drained,
        drain_claims,
        (first_claim + time.perf_counter() - drain_start) * 1000,
    )
    # Steady state: one new message (posted through one process), one claim (timed,
    # through the next one), then ack.
    claims: list[float] = []
    pings: list[float] = []
    for i in range(args.claims):
        agent = agents[PER_GROUP * (i % GROUPS) + 1]
        poster, claimer = clients[i % len(clients)], clients[(i + 1) % len(clients)]
        if i < GROUPS:
            while claim_and_ack(claimer, headers, agent["id"])[2]:  # drain the backlog first
                pass
        group = groups[i % GROUPS]["id"]
        poster.post(f"/api/rooms/{group}/messages", json={"body": f"ping {i}"})
        elapsed, count, _ = claim_and_ack(claimer, headers, agent["id"])
        assert count == 1, f"claim {i} returned {count} messages"
        claims.append(elapsed)
        start = time.perf_counter()
        claimer.get("/health").raise_for_status()
        pings.append(time.perf_counter() - start)
    figures["claim_ms"] = statistics.median(claims) * 1000
    figures["ping_ms"] = statistics.median(pings) * 1000
    wakes = sorted(wake_latencies(servers, headers, agents[-1], dm["id"], args.wakes))
    figures["wake_ms"] = statistics.median(wakes) * 1000
    figures["wake_p95_ms"] = wakes[int(len(wakes) * 0.95) - 1] * 1000
    return figures


def report_sqlite(f: dict[str, Any], args: argparse.Namespace) -> None:
    """The single-process SQLite figures, as this benchmark always printed them."""
    print(
        f"crew-server benchmark: {GROUPS * PER_GROUP} agents in {GROUPS} groups, "
        f"{args.messages} messages, {args.clients} concurrent clients, file db (WAL)"
    )
    print(
        f"  posts:            {f['posts_per_s']:8.0f} /s   (median {f['post_ms']:.2f} ms)"
        f"   target >= 1000 /s"
    )
    print(f"  GET /health:      {f['floor_per_s']:8.0f} /s   (median {f['floor_ms']:.2f} ms)")
    print(f"  ratio posts / health throughput: {f['posts_per_s'] / f['floor_per_s']:.2f}")
    print(f"  unread claim (1 new message), median: {f['claim_ms']:.2f} ms   target <= 5 ms")
    print(f"  GET /health (same client), median:    {f['ping_ms']:.2f} ms")
    print(f"  ratio claim / health latency: {f['claim_ms'] / f['ping_ms']:.2f}")
    count, first_ms = f["first_claim"]
    print(f"  first claim with {count} unread messages: {first_ms:.1f} ms")
    drained, claims, drain_ms = f["drain"]
    print(
        f"  drain of {drained} unread messages in {claims} bounded claims "
        f"(each with its turn and ack): {drain_ms:.1f} ms"
    )
    print(f"  wake latency (post → wake on the stream), median: {f['wake_ms']:.2f} ms")
    if "post_cpu_us" in f:
        post_cpu, health_cpu = f["post_cpu_us"], f["health_cpu_us"]
        print(
            f"  server CPU per post: {post_cpu:.0f} us (one core: ~{1e6 / post_cpu:.0f} posts/s); "
            f"per GET /health: {health_cpu:.0f} us; ratio {post_cpu / health_cpu:.2f}"
        )
        print(
            "  (the httpx clients share the same cores: on a loaded machine they, not the "
            "server, set the posts/s)"
        )
    ok = f["posts_per_s"] >= 1000 and f["claim_ms"] <= 5
    print("  targets met" if ok else "  targets NOT met")


def report_postgres(rows: list[tuple[int, dict[str, Any]]], sqlite: dict[str, Any]) -> None:
    """PostgreSQL with 1..N processes beside the SQLite figures of the same run."""
    print()
    print("PostgreSQL (one database; clients spread over the processes; claims and wakes")
    print("cross processes when there are several):")
    print(
        f"  {'backend':<22}{'posts/s':>9}{'post ms':>9}{'claim ms':>10}"
        f"{'wake ms':>9}{'wake p95':>10}{'CPU/post us':>13}"
    )
    for label, f in [("sqlite, 1 process", sqlite)] + [
        (f"postgres, {n} process{'es' if n > 1 else ''}", f) for n, f in rows
    ]:
        print(
            f"  {label:<22}{f['posts_per_s']:9.0f}{f['post_ms']:9.2f}{f['claim_ms']:10.2f}"
            f"{f['wake_ms']:9.2f}{f['wake_p95_ms']:10.2f}{f.get('post_cpu_us', 0):13.0f}"
        )
    print(
        "  (CPU/post: all server processes together, PostgreSQL's own not counted; the "
        "clients and PostgreSQL share the same cores)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--wakes", type=int, default=200)
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument(
        "--processes", type=int, default=3, help="with --db postgres: measure 1..N processes"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, start_crew_server(Path(tmp)) as server:
        sqlite = measure([server], args)
    report_sqlite(sqlite, args)
    if args.db == "sqlite":
        return 0
    cluster = PostgresCluster.start(BENCH_SETTINGS)
    rows: list[tuple[int, dict[str, Any]]] = []
    try:
        for n in range(1, args.processes + 1):
            url = cluster.new_database()
            with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
                servers = [
                    stack.enter_context(start_crew_server(Path(tmp), db=url)) for _ in range(n)
                ]
                rows.append((n, measure(servers, args)))
    finally:
        cluster.stop()
    report_postgres(rows, sqlite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
