"""Long-polling: bounded waits, many at once, disconnects, retention and delete."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import aiohttp

from prorl_async.client import NotFoundError, RolloutClient
from tests.blocking import BlockingHandler
from tests.helpers import ServerFactory, eventually, server_process


async def test_poll_returns_as_soon_as_one_job_ends(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    async with make_server() as srv:
        a = await srv.client.submit("blocking", {"block": ["run"]})
        b = await srv.client.submit("blocking", {"block": ["run"]})
        await blocking.event(a, "run").wait()
        poll = asyncio.create_task(srv.client.poll([a, b, "ghost"], wait=30))
        await eventually(lambda: srv.service.poll_waiters == 1)
        t0 = time.monotonic()
        blocking.release(b)
        out = await poll
        assert time.monotonic() - t0 < 5
        assert [d["job_id"] for d in out["done"]] == [b]
        assert out["pending"] == [a] and out["unknown"] == ["ghost"]
        assert srv.service.poll_waiters == 0
        blocking.release(a)


async def test_wait_zero_and_202_while_pending(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    async with make_server() as srv:
        a = await srv.client.submit("blocking", {"block": ["init"]})
        async with aiohttp.ClientSession() as s, s.get(f"{srv.url}/jobs/{a}") as r:
            assert r.status == 202
            assert (await r.json())["status"] in ("queued_init", "init")
        t0 = time.monotonic()
        assert await srv.client.result(a, wait=0.3) is None
        assert 0.25 <= time.monotonic() - t0 < 3
        blocking.release(a)


async def test_wait_is_capped_by_server_config(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    async with make_server(max_wait_s=0.2) as srv:
        a = await srv.client.submit("blocking", {"block": ["init"]})
        t0 = time.monotonic()
        assert await srv.client.result(a, wait=60) is None
        assert time.monotonic() - t0 < 5
        blocking.release(a)


async def test_thousand_concurrent_long_polls(tmp_path: Path) -> None:
    # The server runs in its own process so the 1,000 client connections do not share
    # its event loop; each poll is timed from the moment its request was sent.
    async with server_process(tmp_path, {}) as (proc, url), RolloutClient(url) as client:
        ids = await client.submit_batch([{"task": "sleep", "instance": {"run_s": 120}}] * 50)
        took: list[float] = []

        async def on_sent(_: object, ctx: SimpleNamespace, __: object) -> None:
            ctx.t0 = time.monotonic()

        async def on_end(_: object, ctx: SimpleNamespace, __: object) -> None:
            took.append(time.monotonic() - ctx.t0)

        trace = aiohttp.TraceConfig()
        trace.on_request_headers_sent.append(on_sent)
        trace.on_request_end.append(on_end)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, trace_configs=[trace]) as s:

            async def one(i: int) -> int:
                async with s.get(f"{url}/jobs/{ids[i % 50]}?wait=2") as r:
                    await r.read()
                    return r.status

            statuses = await asyncio.gather(*(one(i) for i in range(1000)))
        assert statuses == [202] * 1000 and len(took) == 1000
        assert max(took) < 2 + 2.0, sorted(took)[-5:]  # each within its wait plus slack
        assert min(took) >= 1.9
        status = await client.status()
        assert (
            status["poll_waiters"] == 0 and status["queues"]["run"] + status["active"]["run"] == 50
        )


async def test_disconnected_poll_leaves_no_waiter(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    async with make_server() as srv:
        a = await srv.client.submit("blocking", {"block": ["init"]})
        async with aiohttp.ClientSession() as s:
            req = asyncio.create_task(s.get(f"{srv.url}/jobs/{a}?wait=60"))
            poll = asyncio.create_task(s.post(f"{srv.url}/poll", json={"job_ids": [a], "wait": 60}))
            await eventually(lambda: srv.service.poll_waiters == 2)
            req.cancel()
            poll.cancel()
            await asyncio.gather(req, poll, return_exceptions=True)
        await eventually(lambda: srv.service.poll_waiters == 0)
        metrics = await _metrics(srv.url)
        assert "prorl_poll_waiters 0.0" in metrics
        job = srv.service.store.get(a)
        assert job is not None and not job._waiters
        blocking.release(a)


async def _metrics(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        return await r.text()


async def test_retention_drops_old_results(make_server: ServerFactory) -> None:
    async with make_server(retention_s=60) as srv:
        job_id = await srv.client.submit("sleep", {})
        assert (await srv.client.result(job_id, wait=10) or {})["status"] == "done"
        assert srv.service.store.expire(time.monotonic() + 30) == 0
        assert await srv.client.result(job_id) is not None
        assert srv.service.store.expire(time.monotonic() + 61) == 1
        try:
            await srv.client.result(job_id)
            raise AssertionError("expired result still served")
        except NotFoundError:
            pass


async def test_retention_sweeper_runs_by_itself(make_server: ServerFactory) -> None:
    async with make_server(retention_s=0.2) as srv:
        ids = await srv.client.submit_batch([{"task": "sleep", "instance": {}}] * 20)
        out = await srv.client.poll(ids, wait=10)
        while out["pending"]:
            out = await srv.client.poll(out["pending"], wait=10)
        await eventually(lambda: len(srv.service.store) == 0)


async def test_delete_forgets_and_cancels(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    async with make_server() as srv:
        done = await srv.client.submit("sleep", {})
        await srv.client.result(done, wait=10)
        await srv.client.delete(done)
        running = await srv.client.submit("blocking", {"block": ["run"]})
        await blocking.event(running, "run").wait()
        await srv.client.delete(running)
        assert running in blocking.released
        for job_id in (done, running):
            try:
                await srv.client.result(job_id)
                raise AssertionError("deleted job still there")
            except NotFoundError:
                pass
        # a cancelled-then-deleted id is still not resurrected
        await srv.client.submit("sleep", {}, job_id=running)
        assert running not in {j.id for j in srv.service.store.unfinished()}
