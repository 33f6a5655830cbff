"""Long-poll (job ids + POST /poll) vs a blocking submit-and-wait style, 2,000 jobs in flight.

The blocking style is emulated the way such services work: one HTTP request per job,
held open until that job ends (here: submit, then GET /jobs/{id}?wait=<long>).
Each style runs against a fresh server process; printed side by side: the server's
open TCP connections, RSS and file descriptors while all jobs are in flight.

    python bench/held_connections.py [--jobs 2000] [--run-s 20]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._server import open_fds, rss_mib, server, tcp_connections  # noqa: E402
from prorl_async.client import RolloutClient  # noqa: E402


async def _settle(url: str, want_waiters: int) -> None:
    async with RolloutClient(url) as c, asyncio.timeout(60):
        waiters = (await c.status())["poll_waiters"]
        while waiters < want_waiters:  # server-side state with no event to await
            await asyncio.sleep(0.1)
            waiters = (await c.status())["poll_waiters"]


def _measure(pid: int, url: str) -> dict[str, float]:
    port = urlsplit(url).port or 0
    return {"conns": tcp_connections(pid, port), "rss": rss_mib(pid), "fds": open_fds(pid)}


async def blocking_style(n: int, run_s: float) -> dict[str, float]:
    async with server("--run-workers", str(n)) as (pid, url):
        base = _measure(pid, url)
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as s:
            job = {"task": "sleep", "instance": {"run_s": run_s}}

            async def one() -> None:
                async with s.post(f"{url}/process", json=job) as r:
                    job_id = (await r.json())["job_id"]
                async with s.get(f"{url}/jobs/{job_id}?wait={run_s * 10}") as r:
                    await r.read()

            t0 = time.perf_counter()
            tasks = [asyncio.create_task(one()) for _ in range(n)]
            await _settle(url, n)
            held = _measure(pid, url)
            await asyncio.gather(*tasks)
            held["wall"] = time.perf_counter() - t0
        return {**held, "base_rss": base["rss"]}


async def longpoll_style(n: int, run_s: float) -> dict[str, float]:
    async with server("--run-workers", str(n)) as (pid, url), RolloutClient(url) as c:
        base = _measure(pid, url)
        t0 = time.perf_counter()
        ids = await c.submit_batch([{"task": "sleep", "instance": {"run_s": run_s}}] * n)
        poll = asyncio.create_task(c.poll(ids, wait=run_s * 10))
        await _settle(url, 1)
        held = _measure(pid, url)
        pending = ids
        while pending:
            out = await poll
            pending = out["pending"]
            if pending:
                poll = asyncio.create_task(c.poll(pending, wait=run_s * 10))
        held["wall"] = time.perf_counter() - t0
        return {**held, "base_rss": base["rss"]}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--run-s", type=float, default=20.0)
    args = ap.parse_args()
    blocking = await blocking_style(args.jobs, args.run_s)
    longpoll = await longpoll_style(args.jobs, args.run_s)
    rows = [
        ("server TCP connections held", "conns", "{:.0f}"),
        ("server open file descriptors", "fds", "{:.0f}"),
        ("server RSS (MiB)", "rss", "{:.1f}"),
        ("server RSS before the jobs (MiB)", "base_rss", "{:.1f}"),
        ("wall time for all jobs (s)", "wall", "{:.1f}"),
    ]
    print(f"{args.jobs:,} jobs in flight (sleep run_s={args.run_s:g})")
    print(f"{'':34}{'blocking wait':>16}{'long-poll':>12}{'ratio':>8}")
    for label, key, fmt in rows:
        b, lp = blocking[key], longpoll[key]
        ratio = f"{b / lp:.1f}x" if lp else "-"
        print(f"{label:34}{fmt.format(b):>16}{fmt.format(lp):>12}{ratio:>8}")


if __name__ == "__main__":
    uvloop.run(main())
