"""The result log on a real server process: exactly once, in order, across kill -9."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from prorl_async.client import RolloutClient
from tests.helpers import eventually, server_process

N = 10_000


class Reader:
    """Reads ``GET /results`` from a cursor; keeps (seq, job_id) in the order read."""

    def __init__(self, after: int, limit: int) -> None:
        self.cursor = after
        self.limit = limit
        self.seen: list[tuple[int, str]] = []
        self.restarted = 0  # results of jobs requeued by a restart

    async def read_until(self, client: RolloutClient, count: int) -> None:
        async with asyncio.timeout(120):
            while len(self.seen) < count:
                await self.read_once(client)

    async def read_once(self, client: RolloutClient) -> None:
        out = await client.results(self.cursor, limit=self.limit, wait=5)
        self.seen += [(d["seq"], d["job_id"]) for d in out["results"]]
        self.restarted += sum(d["restarts"] > 0 for d in out["results"])
        self.cursor = out["next"]

    def check(self, expected: set[str]) -> None:
        seqs = [s for s, _ in self.seen]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), "out of order or repeated"
        ids = [i for _, i in self.seen]
        assert len(ids) == len(set(ids)), "a result read twice"
        assert set(ids) == expected


def _sleeps(n: int, **instance: Any) -> list[dict[str, Any]]:
    return [{"task": "sleep", "instance": instance}] * n


async def test_ten_thousand_results_three_readers_each_exactly_once_in_order(
    tmp_path: Path,
) -> None:
    async with server_process(tmp_path, {}) as (_, url), RolloutClient(url) as c:
        first = Reader(0, 1000)  # from the start, before anything is submitted
        reading = asyncio.ensure_future(first.read_until(c, N))
        ids: list[str] = []
        for _ in range(N // 1000):
            ids += await c.submit_batch(_sleeps(1000))
        await eventually(lambda: len(first.seen) >= 3000, timeout=120)
        # two more from cursors taken from what the first has read, while jobs still end
        c1, c2 = first.seen[2999][0], first.seen[1234][0]
        second, third = Reader(c1, 137), Reader(c2, 10_000)
        await asyncio.gather(reading, second.read_until(c, N - 3000), third.read_until(c, N - 1235))
        first.check(set(ids))
        order = [i for _, i in first.seen]
        second.check(set(order[3000:]))
        third.check(set(order[1235:]))
        assert second.seen == first.seen[3000:] and third.seen == first.seen[1235:]


async def test_a_reader_resumes_after_kill9_with_no_gap_and_no_duplicate(tmp_path: Path) -> None:
    reader = Reader(0, 250)
    async with server_process(tmp_path, {}) as (proc, url), RolloutClient(url) as c:
        ids = await c.submit_batch(_sleeps(N, run_s=0.02))
        await reader.read_until(c, 2000)
        st = await c.status()
        assert st["queues"]["init"] + sum(st["active"].values()) > 0  # still running
        proc.kill()
        await proc.wait()
    before = len(reader.seen)
    async with server_process(tmp_path, {}) as (_, url), RolloutClient(url) as c:
        await reader.read_until(c, len(ids))
        assert (await c.status())["epoch"] == (await c.results(0, limit=0))["epoch"]
    reader.check(set(ids))
    assert reader.seen[before][0] > reader.seen[before - 1][0]  # numbering went on
    assert reader.restarted > 0  # the kill cut jobs short; they ran again after the restart
