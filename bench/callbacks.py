"""Callbacks never slow the pipeline.

1. Throughput of ``--jobs`` sleep jobs without callbacks: alone; while ``--failing``
   other jobs' callbacks are retried against a receiver that answers 500 forever; and
   against one that is down. Then with every job's callback to a receiver answering
   200 (what delivering costs).
2. A receiver down for ``--down`` seconds, then up: every result arrives, signed.

    python bench/callbacks.py [--jobs 5000] [--failing 1000] [--repeat 3] [--down 60]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import uvloop
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._server import rss_mib, server  # noqa: E402
from prorl_async.client import RolloutClient  # noqa: E402
from prorl_async.notify import SIGNATURE_HEADER, verify  # noqa: E402
from tests.helpers import free_port  # noqa: E402

SECRET = "bench-secret"


class Receiver:
    def __init__(self, status: int) -> None:
        self.status = status
        self.posts = 0
        self.good: set[str] = set()
        self.bad_signatures = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.posts += 1
        if not verify(SECRET.encode(), body, request.headers.get(SIGNATURE_HEADER, "")):
            self.bad_signatures += 1
        if self.status < 300:
            self.good.add(request.headers["X-Prorl-Job-Id"])
        return web.Response(status=self.status)


@asynccontextmanager
async def receiver(port: int, status: int) -> AsyncIterator[Receiver]:
    rec = Receiver(status)
    app = web.Application()
    app.router.add_post("/hook", rec.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, reuse_address=True).start()
    try:
        yield rec
    finally:
        await runner.cleanup()


async def _drain(c: RolloutClient, after: int, n: int) -> None:
    got = 0
    async with asyncio.timeout(600):
        while got < n:
            out = await c.results(after, limit=10_000, wait=5)
            got += len(out["results"])
            after = out["next"]


async def throughput(
    config: str, jobs: int, hook: int | None = None, failing: int = 0, to: int | None = None
) -> dict[str, Any]:
    """Jobs/s of ``jobs`` jobs (with a callback to port ``hook`` if given), after
    ``failing`` jobs whose callbacks go to port ``to`` ended and are being retried."""
    env = {"PRORL_CALLBACK_SECRET": SECRET}
    async with server("--config", config, env=env) as (pid, url), RolloutClient(url) as c:
        if failing:
            hooked = {"task": "sleep", "callback_url": f"http://127.0.0.1:{to}/hook"}
            await c.submit_batch([hooked] * failing)
            await _drain(c, 0, failing)
        job: dict[str, Any] = {"task": "sleep", "instance": {}}
        if hook is not None:
            job["callback_url"] = f"http://127.0.0.1:{hook}/hook"
        start = (await c.status())["last_seq"]
        t0 = time.monotonic()
        for _ in range(jobs // 500):
            await c.submit_batch([job] * 500)
        await _drain(c, start, jobs)
        wall = time.monotonic() - t0
        status = await c.status()
        return {"jobs/s": jobs / wall, "rss": rss_mib(pid), "callbacks": status["callbacks"]}


async def down_then_up(config: str, jobs: int, down_s: float) -> dict[str, Any]:
    port = free_port()
    env = {"PRORL_CALLBACK_SECRET": SECRET}
    job = {"task": "sleep", "instance": {}, "callback_url": f"http://127.0.0.1:{port}/hook"}
    async with server("--config", config, env=env) as (_, url), RolloutClient(url) as c:
        await c.submit_batch([job] * jobs)
        await asyncio.sleep(down_s)  # the receiver is down this long (the scenario)
        up = time.monotonic()
        async with receiver(port, 200) as rec:
            async with asyncio.timeout(600):
                delivered = len(rec.good)
                while delivered < jobs:  # deliveries come on their own backoff schedule
                    await asyncio.sleep(0.2)
                    delivered = len(rec.good)
            last = time.monotonic() - up
            summary = (await c.status())["callbacks"]
    return {"after_up_s": last, "posts": rec.posts, "bad": rec.bad_signatures, **summary}


async def _rows(cfg: str, n: int, k: int) -> list[tuple[str, dict[str, Any]]]:
    rows = [("alone", await throughput(cfg, n))]
    port = free_port()
    async with receiver(port, 500):
        rows.append((f"{k} failing (500)", await throughput(cfg, n, failing=k, to=port)))
    rows.append((f"{k} failing (down)", await throughput(cfg, n, failing=k, to=free_port())))
    async with receiver(port, 200):
        rows.append(("each with a callback", await throughput(cfg, n, hook=port)))
    return rows


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "server.toml"
        config.write_text('[callbacks]\nallow_hosts = ["127.0.0.1"]\n')
        runs = [await _rows(str(config), args.jobs, args.failing) for _ in range(args.repeat)]
    print(
        f"\n{args.jobs} sleep jobs (0 s), in batches of 500, read by cursor; median of "
        f"{args.repeat} runs (jobs/s of each run in brackets)"
    )
    print(f"{'':22} {'jobs/s':>7} {'attempts':>9} {'pending':>8}  runs")
    for i, (name, last) in enumerate(runs[-1]):
        rates = [run[i][1]["jobs/s"] for run in runs]
        cb = last["callbacks"]
        print(
            f"{name:22} {statistics.median(rates):7.0f} {cb['attempts']:9d} "
            f"{cb['pending']:8d}  [{', '.join(f'{r:.0f}' for r in rates)}]"
        )
    if args.down:
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / "server.toml"
            config.write_text('[callbacks]\nallow_hosts = ["127.0.0.1"]\n')
            d = await down_then_up(str(config), args.down_jobs, args.down)
        print(
            f"\n{args.down_jobs} jobs, receiver down {args.down:g} s then up: all "
            f"delivered {d['after_up_s']:.1f} s after it came up; {d['posts']} posts, "
            f"{d['bad']} bad signatures; attempts {d['attempts']}, "
            f"delivered {d['delivered']}"
        )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--failing", type=int, default=1000, help="jobs whose callbacks fail")
    p.add_argument("--repeat", type=int, default=3, help="throughput runs (median printed)")
    p.add_argument("--down", type=float, default=60.0, help="receiver downtime (0: skip)")
    p.add_argument("--down-jobs", type=int, default=1000)
    uvloop.run(main(p.parse_args()))
