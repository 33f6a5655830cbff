"""``POST /workers`` resizes stage pools at run time; shrinking never cancels a job."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

import pytest

from prorl_async.client import BadRequestError
from prorl_async.core.job import Stage
from prorl_async.stages import StageQueue
from tests.blocking import BlockingHandler
from tests.capacity.test_budget import scrape
from tests.helpers import ServerFactory, eventually

T = TypeVar("T")


def _in_run(blocking: BlockingHandler, ids: list[str]) -> set[str]:
    """Jobs that entered RUN (blocked there until released)."""
    return {j for j in ids if blocking.event(j, "run").is_set()}


async def test_resize_up_and_down_under_load_never_cancels(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    async with make_server(run_workers=2) as srv:
        svc = srv.service
        ids = await srv.client.submit_batch(
            [{"task": "blocking", "instance": {"block": ["run"]}}] * 12
        )
        await eventually(lambda: svc.pipeline.active[Stage.RUN] == 2)
        assert len(_in_run(blocking, ids)) == 2

        status = await srv.client.set_workers(run=6)
        assert status["workers"]["run"] == 6 and status["pools"]["run"]["configured"] == 6
        # Observed concurrency follows: six jobs are inside RUN at once now.
        await eventually(lambda: svc.pipeline.active[Stage.RUN] == 6)
        assert len(_in_run(blocking, ids)) == 6

        status = await srv.client.set_workers(run=1)
        pool = status["pools"]["run"]
        # Nobody was cancelled: the six busy workers stay until their job ends.
        assert pool == {"configured": 1, "live": 6, "busy": 6}
        assert svc.pipeline.active[Stage.RUN] == 6 and not blocking.released
        running = sorted(_in_run(blocking, ids))
        for job_id in running:
            blocking.release(job_id)
        await eventually(lambda: svc.pipeline.pools[Stage.RUN].live == 1)
        # From now on one job at a time: release whoever enters RUN until all are done.
        seen_at_once = 0
        while len(running) < len(ids):
            await eventually(lambda: bool(_in_run(blocking, ids) - set(running)))
            seen_at_once = max(seen_at_once, svc.pipeline.active[Stage.RUN])
            (job_id,) = _in_run(blocking, ids) - set(running)
            blocking.release(job_id)
            running.append(job_id)
        assert seen_at_once == 1
        results = [await srv.client.result(j, wait=10) for j in ids]
        assert [r["status"] for r in results if r] == ["done"] * len(ids)

        text = await scrape(srv.url)
        assert 'prorl_stage_workers{stage="run",state="configured"} 1.0' in text
        assert 'prorl_stage_workers{stage="init",state="configured"} 8.0' in text
        assert 'prorl_stage_workers{stage="run",state="busy"} 0.0' in text


@pytest.mark.parametrize(
    ("body", "needle"),
    [({"run": 0}, "run"), ({"bogus": 1}, "bogus"), ({"eval": "x"}, "eval")],
)
async def test_bad_resize_names_the_field(
    make_server: ServerFactory, body: dict[str, object], needle: str
) -> None:
    import aiohttp

    async with make_server() as srv, aiohttp.ClientSession() as session:
        async with session.post(srv.url + "/workers", json=body) as resp:
            assert resp.status == 400
            assert needle in (await resp.json())["detail"]
        assert (await srv.client.status())["workers"] == {"init": 8, "run": 64, "eval": 16}


async def test_client_rejects_zero(make_server: ServerFactory) -> None:
    async with make_server() as srv:
        with pytest.raises(BadRequestError):
            await srv.client.set_workers(init=0)


# -- StageQueue: the queue a pool drains (asyncio.Queue's semantics for get and put) --------


def _waiting(q: StageQueue[T], n: int) -> Callable[[], bool]:
    return lambda: len(q._getters) == n


async def test_stage_queue_is_fifo_and_wakes_getters_in_order() -> None:
    q: StageQueue[int] = StageQueue()
    got: list[tuple[str, int]] = []

    async def getter(name: str) -> None:
        got.append((name, await q.get()))

    tasks = [asyncio.create_task(getter(n)) for n in ("a", "b")]
    await eventually(_waiting(q, 2), interval=0)  # both are waiting (nothing queued)
    for i in (1, 2, 3):
        q.put_nowait(i)
    await asyncio.gather(*tasks)
    assert got == [("a", 1), ("b", 2)]
    assert q.qsize() == 1 and q.get_nowait() == 3 and q.empty()
    with pytest.raises(asyncio.QueueEmpty):
        q.get_nowait()


async def test_cancelled_get_leaves_the_item_and_passes_the_wake_on() -> None:
    q: StageQueue[str] = StageQueue()
    first = asyncio.create_task(q.get())
    second = asyncio.create_task(q.get())
    await eventually(_waiting(q, 2), interval=0)  # both wait, first in line
    q.put_nowait("job")  # wakes the first getter ...
    first.cancel()  # ... which is cancelled before it takes the item
    assert await asyncio.wait_for(second, 10) == "job"  # the wake went on to the next getter
    with pytest.raises(asyncio.CancelledError):
        await first
    # A getter cancelled while waiting takes nothing and leaves no waiter behind.
    third = asyncio.create_task(q.get())
    await eventually(_waiting(q, 1), interval=0)
    third.cancel()
    with pytest.raises(asyncio.CancelledError):
        await third
    assert not q._getters
    q.put_nowait("next")
    assert q.qsize() == 1 and await q.get() == "next"
