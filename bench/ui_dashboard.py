"""What the live dashboards cost the server (issue 43): the server's CPU with and
without 10 open dashboards, side by side in one run, while it completes ~1,000 jobs/s.

A real ``prorl-async serve`` process (memory store, tenants); a load generator submits
``sleep`` jobs (zero durations) in batches at the target rate and reads their results
by cursor, so the server does the whole job path. Phases alternate: no dashboard, then
10 dashboards, each a client logged in through the form polling ``/ui/live`` once a
second exactly as the page's script does (a browser's own CPU is not the server's).
The server's CPU (user + system, from /proc) per phase, per second of wall clock, in
percent of one core; the dashboards' cost is the difference of the medians.

    python -m bench.ui_dashboard [--rate 1000] [--phase-s 15] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from bench._server import cpu_seconds, server

TOKENS = '[tenants.load]\ntoken = "tok-load"\nadmin = true\n'
DASHBOARDS = 10


async def _generate(url: str, rate: float, stop: asyncio.Event, done: list[int]) -> None:
    """Submit ``rate`` jobs/s in batches of rate/10 each 0.1 s; read results by cursor."""
    headers = {"Authorization": "Bearer tok-load"}
    batch = {"jobs": [{"task": "sleep", "instance": {}}] * max(1, int(rate / 10))}
    async with aiohttp.ClientSession(headers=headers) as s:
        reader = asyncio.create_task(_read(s, url, stop, done))
        try:
            tick = time.monotonic()
            while not stop.is_set():
                async with s.post(f"{url}/process/batch", json=batch) as r:
                    await r.read()
                tick += 0.1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, tick - time.monotonic()))
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


async def _read(s: aiohttp.ClientSession, url: str, stop: asyncio.Event, done: list[int]) -> None:
    after = 0
    while not stop.is_set():
        async with s.get(f"{url}/results?after={after}&limit=10000&wait=1") as r:
            body = await r.json()
        after = body["next"]
        done[0] += len(body["results"])


async def _dashboard(url: str, stop: asyncio.Event, polls: list[int]) -> None:
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as s:
        async with s.post(f"{url}/ui/login", data={"token": "tok-load"}) as r:
            assert r.status == 200, r.status
        while not stop.is_set():
            async with s.get(f"{url}/ui/live") as r:
                assert r.status == 200
                await r.read()
            polls[0] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


async def _phase(
    pid: int, url: str, seconds: float, dashboards: int, done: list[int]
) -> dict[str, float]:
    stop = asyncio.Event()
    polls = [0]
    tasks = [asyncio.create_task(_dashboard(url, stop, polls)) for _ in range(dashboards)]
    await asyncio.sleep(1.0)  # logged in and polling before the measurement starts
    cpu0, t0, done0, polls0 = cpu_seconds(pid), time.monotonic(), done[0], polls[0]
    await asyncio.sleep(seconds)
    cpu1, t1, done1, polls1 = cpu_seconds(pid), time.monotonic(), done[0], polls[0]
    stop.set()
    await asyncio.gather(*tasks)
    wall = t1 - t0
    return {
        "cpu_pct": 100 * (cpu1 - cpu0) / wall,
        "jobs_s": (done1 - done0) / wall,
        "polls_s": (polls1 - polls0) / wall,
    }


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tokens = Path(tmp) / "tokens.toml"
        tokens.write_text(TOKENS)
        os.chmod(tokens, 0o600)
        serve = ("--store", "memory", "--tokens-file", str(tokens))
        async with server(*serve) as (pid, url):
            stop, done = asyncio.Event(), [0]
            load = asyncio.create_task(_generate(url, args.rate, stop, done))
            await asyncio.sleep(3.0)  # warm up
            rows: dict[int, list[dict[str, float]]] = {0: [], DASHBOARDS: []}
            for _ in range(args.rounds):
                for n in (0, DASHBOARDS):
                    row = await _phase(pid, url, args.phase_s, n, done)
                    rows[n].append(row)
                    print(
                        f"dashboards {n:2d}: server CPU {row['cpu_pct']:5.1f} % of a core, "
                        f"{row['jobs_s']:6.0f} jobs/s completed, {row['polls_s']:4.1f} polls/s"
                    )
            stop.set()
            await load
    base = statistics.median(r["cpu_pct"] for r in rows[0])
    with_dash = statistics.median(r["cpu_pct"] for r in rows[DASHBOARDS])
    jobs = statistics.median(r["jobs_s"] for r in rows[0] + rows[DASHBOARDS])
    print(
        f"median: {base:.1f} % without, {with_dash:.1f} % with {DASHBOARDS} dashboards "
        f"(difference {with_dash - base:+.1f} % of a core) at {jobs:.0f} jobs/s"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--phase-s", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
