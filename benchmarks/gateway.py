"""`scripts/bench gateway`: a model call through the model gateway vs straight to the model.

The scripted model (requiring the real key) in a thread, the Computer's
`Gateway` on this process's event loop with one agent routed to it; one
keep-alive client each way, the calls alternating between the two, each a
streamed chat completion of `--chunks` SSE chunks (as OpenCode makes them).
Printed, each way: the median time to the first chunk, to the whole answer,
and between chunks; the added latency per request and per chunk, and the
ratios gateway/direct.

Usage: scripts/bench gateway [--calls N] [--chunks N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import anyio
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from computer_service.gateway.forward import Route
from computer_service.gateway.gateway import Gateway
from computer_service.gateway.logins import KeyLogin
from crew_harness.scripted_model import Reply, Rule, Script, ScriptedModel

KEY = "sk-bench-real-key"


async def one_call(client: httpx.AsyncClient, url: str, key: str) -> tuple[float, float, float]:
    """A streamed call: (time to the first chunk, to the end, between chunks), seconds."""
    body = {
        "model": "scripted",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "bench"}],
    }
    arrivals: list[float] = []
    start = time.perf_counter()
    headers = {"Authorization": f"Bearer {key}"}
    async with client.stream("POST", f"{url}/chat/completions", json=body, headers=headers) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                arrivals.append(time.perf_counter())
    end = time.perf_counter()
    between = (arrivals[-1] - arrivals[0]) / max(len(arrivals) - 1, 1)
    return arrivals[0] - start, end - start, between


async def run(calls: int, chunks: int) -> dict[str, list[tuple[float, float, float]]]:
    text = "x" * (24 * chunks)  # the scripted model streams text 24 characters a chunk
    script = Script(rules=[Rule(reply=Reply(text=text))])
    with ScriptedModel(script, required_key=KEY) as model:
        gateway = Gateway()
        try:
            access = await gateway.access_for("bench")
            gateway.route("bench", "local", Route(model.base_url, KeyLogin(KEY)))
            ways = {
                "direct": (model.base_url, KEY),
                "gateway": (access.base_url("local"), access.placeholder),
            }
            times: dict[str, list[tuple[float, float, float]]] = {w: [] for w in ways}
            async with httpx.AsyncClient(timeout=30) as a, httpx.AsyncClient(timeout=30) as b:
                clients = {"direct": a, "gateway": b}
                for way, (url, key) in ways.items():
                    await one_call(clients[way], url, key)  # connections open and reused
                for _ in range(calls):
                    for way, (url, key) in ways.items():
                        times[way].append(await one_call(clients[way], url, key))
        finally:
            await gateway.aclose()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench gateway")
    parser.add_argument("--calls", type=int, default=200, help="streamed calls each way")
    parser.add_argument("--chunks", type=int, default=50, help="text chunks per answer")
    args = parser.parse_args()
    times = anyio.run(run, args.calls, args.chunks)
    medians = {
        way: [statistics.median(t[i] for t in rows) for i in range(3)]
        for way, rows in times.items()
    }
    print(f"streamed chat completions, {args.calls} calls each way, ~{args.chunks + 3} chunks each")
    print(f"  {'way':<10}{'first chunk':>14}{'whole call':>14}{'per chunk':>14}")
    for way, (first, whole, between) in medians.items():
        print(
            f"  {way:<10}{first * 1000:>11.2f} ms{whole * 1000:>11.2f} ms{between * 1e6:>11.1f} us"
        )
    (df, dw, db), (gf, gw, gb) = medians["direct"], medians["gateway"]
    print(
        f"  added     {(gf - df) * 1000:>11.2f} ms{(gw - dw) * 1000:>11.2f} ms"
        f"{(gb - db) * 1e6:>11.1f} us"
    )
    print(f"  ratio     {gf / df:>12.2f} x{gw / dw:>12.2f} x{gb / db if db else 0:>12.2f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
