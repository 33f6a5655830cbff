"""How a client learns that a job ended: ``POST /poll``, the cursor (``GET /results``), SSE.

For each way a fresh server process (``--store``, durable SQLite by default) runs sleep
jobs submitted at ``--rate`` jobs/s for ``--seconds``; one reader learns of every result.
Printed side by side: HTTP requests per result, and the time from a job's end (its
``timing.ended_at``, server wall clock, same machine) to the reader holding the news,
p50/p99/max. ``/poll`` answers from memory as soon as a job ends; the cursor and SSE
read the result log, which holds a result once it is committed (with SQLite, after
the group commit's fsync), so they never show a result a crash could take back.

- poll: the ids in flight, long-polled with ``POST /poll`` (``wait=5``), as the manager did.
- cursor: ``GET /results?after=...&wait=5&limit=1000``, as the manager does now.
- sse: one ``GET /events`` stream read from a plain socket (an event has the id, status
  and reward, not the document: a client that wants it fetches it, one request more).

Then ``--streams`` idle SSE clients on one server: its fds and RSS, and a burst of
``--burst`` results delivered to every one of them.

    python bench/events.py [--rate 1000] [--seconds 10] [--run-s 0.5] [--store sqlite]
                           [--streams 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._server import open_fds, rss_mib, server  # noqa: E402
from prorl_async.client import RolloutClient  # noqa: E402


class Run:
    """What the submitter and a reader share."""

    def __init__(self) -> None:
        self.submitted: list[str] = []
        self.pending: set[str] = set()
        self.arrived: dict[str, float] = {}
        self.requests = 0
        self.more = asyncio.Event()
        self.done_submitting = False

    def got(self, job_id: str) -> None:
        if job_id not in self.arrived:
            self.arrived[job_id] = time.time()
        self.pending.discard(job_id)

    @property
    def finished(self) -> bool:
        return self.done_submitting and len(self.arrived) >= len(self.submitted)


async def _submit(c: RolloutClient, run: Run, rate: int, seconds: float, run_s: float) -> None:
    tick = 0.05
    per_tick = max(1, round(rate * tick))
    job = {"task": "sleep", "instance": {"run_s": run_s}}
    next_t = time.monotonic()
    end = next_t + seconds
    while next_t < end:
        ids = await c.submit_batch([job] * per_tick)
        run.submitted += ids
        run.pending.update(ids)
        run.more.set()
        next_t += tick
        await asyncio.sleep(max(0.0, next_t - time.monotonic()))  # pacing, not syncing
    run.done_submitting = True
    run.more.set()


async def read_poll(c: RolloutClient, run: Run, url: str, after: int) -> None:
    while not run.finished:
        if not run.pending:
            run.more.clear()
            await run.more.wait()
            continue
        out = await c.poll(list(run.pending), wait=5)
        run.requests += 1
        for doc in out["done"]:
            run.got(doc["job_id"])


async def read_cursor(c: RolloutClient, run: Run, url: str, after: int) -> None:
    cursor = after
    while not run.finished:
        out = await c.results(cursor, limit=1000, wait=5)
        run.requests += 1
        for doc in out["results"]:
            run.got(doc["job_id"])
        cursor = out["next"]


async def read_sse(c: RolloutClient, run: Run, url: str, after: int) -> None:
    # A plain socket reader: the lightest client, so the figure is the server's.
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /events?after={after} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    run.requests += 1
    buf = b""
    try:
        while not run.finished:
            chunk = await reader.read(65536)
            if not chunk:
                raise RuntimeError("event stream ended")
            *lines, buf = (buf + chunk).split(b"\n")
            for line in lines:
                if line.startswith(b"data: "):
                    run.got(msgspec.json.decode(line[6:])["job_id"])
    finally:
        writer.close()


Reader = Callable[[RolloutClient, Run, str, int], Awaitable[None]]


async def _ended_at(c: RolloutClient, after: int, count: int) -> dict[str, float]:
    ended: dict[str, float] = {}
    while len(ended) < count:
        out = await c.results(after, limit=10_000, wait=5)
        ended.update({d["job_id"]: d["timing"]["ended_at"] for d in out["results"]})
        after = out["next"]
    return ended


async def one_way(
    name: str, reader: Reader, rate: int, seconds: float, run_s: float, store: str = "sqlite"
) -> dict[str, Any]:
    workers = str(max(64, int(rate * run_s * 2)))
    async with server("--run-workers", workers, "--store", store) as (_, url):
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as s, RolloutClient(url, session=s) as c:
            start = (await c.status())["last_seq"]
            run = Run()
            t0 = time.monotonic()
            reading = asyncio.ensure_future(reader(c, run, url, start))
            await _submit(c, run, rate, seconds, run_s)
            async with asyncio.timeout(120):
                await reading
            wall = time.monotonic() - t0
            ended = await _ended_at(c, start, len(run.submitted))
    late = sorted((run.arrived[j] - ended[j]) * 1000 for j in run.submitted)
    return {
        "way": name,
        "results": len(late),
        "wall_s": wall,
        "req/result": run.requests / len(late),
        "p50_ms": statistics.median(late),
        "p99_ms": late[int(0.99 * (len(late) - 1))],
        "max_ms": late[-1],
    }


async def _open_stream(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET /events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    await reader.readuntil(b": stream open\n")
    return reader, writer


async def _count(reader: asyncio.StreamReader, n: int) -> float:
    buf = b""
    while buf.count(b"\nevent: job\n") < n:
        chunk = await reader.read(65536)
        if not chunk:
            raise RuntimeError("stream ended")
        buf += chunk
    return time.monotonic()


async def streams(n: int, burst: int) -> dict[str, Any]:
    async with server("--store", "memory") as (pid, url):
        host, port = url.removeprefix("http://").split(":")
        async with RolloutClient(url) as c:
            await c.submit_batch([{"task": "sleep"}] * 10)  # warm every code path
            fds0, rss0 = open_fds(pid), rss_mib(pid)
            conns = await asyncio.gather(*(_open_stream(host, int(port)) for _ in range(n)))
            async with asyncio.timeout(60):
                held = (await c.status())["events"]["streams"]
                while held < n:  # server-side state with no event to await
                    await asyncio.sleep(0.05)
                    held = (await c.status())["events"]["streams"]
            fds1, rss1 = open_fds(pid), rss_mib(pid)
            t0 = time.monotonic()
            await c.submit_batch([{"task": "sleep"}] * burst)
            ends = await asyncio.gather(*(_count(r, burst) for r, _ in conns))
            rss2 = rss_mib(pid)
            for _, w in conns:
                w.close()
    return {
        "streams": n,
        "fds": fds1 - fds0,
        "rss_idle_mib": rss1 - rss0,
        "rss_after_burst_mib": rss2 - rss0,
        "kib_per_stream": (rss2 - rss0) * 1024 / n,
        "burst_to_all_s": max(ends) - t0,
    }


async def main(args: argparse.Namespace) -> None:
    ways: list[tuple[str, Reader]] = [
        ("poll", read_poll),
        ("cursor", read_cursor),
        ("sse", read_sse),
    ]
    rows = [await one_way(n, r, args.rate, args.seconds, args.run_s, args.store) for n, r in ways]
    print(
        f"\n{args.rate} jobs/s for {args.seconds:g} s, sleep {args.run_s:g} s, {args.store} store"
    )
    print(f"{'way':8} {'results':>8} {'req/result':>11} "
          f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")  # fmt: skip  # a table: header over row
    for r in rows:
        print(f"{r['way']:8} {r['results']:8d} {r['req/result']:11.4f} "
              f"{r['p50_ms']:8.1f} {r['p99_ms']:8.1f} {r['max_ms']:8.1f}")  # fmt: skip  # its row
    if args.streams:
        s = await streams(args.streams, args.burst)
        print(
            f"\n{s['streams']} idle SSE streams: +{s['fds']} fds, "
            f"+{s['rss_idle_mib']:.1f} MiB RSS idle, +{s['rss_after_burst_mib']:.1f} MiB "
            f"after {args.burst} events to each ({s['kib_per_stream']:.1f} KiB a stream); "
            f"the burst reached all in {s['burst_to_all_s']:.2f} s"
        )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rate", type=int, default=1000, help="jobs submitted per second")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--run-s", type=float, default=0.5, help="each sleep job's RUN time")
    p.add_argument(
        "--store", default="sqlite", help="sqlite (durable: the log waits for the commit) or memory"
    )
    p.add_argument("--streams", type=int, default=1000, help="idle SSE clients (0: skip)")
    p.add_argument("--burst", type=int, default=100, help="results sent to every stream")
    uvloop.run(main(p.parse_args()))
