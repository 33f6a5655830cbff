"""The RolloutManager reads results by cursor (``GET /results``), not by per-id polls."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from prorl_async.trainer import RolloutManager, poller
from tests.helpers import ServerFactory, eventually, forwarding_proxy


def _sleeps(n: int, run_s: float) -> list[dict[str, object]]:
    return [{"task": "sleep", "instance": {"run_s": run_s}} for _ in range(n)]


@asynccontextmanager
async def counting_proxy(target: str) -> AsyncIterator[tuple[str, Counter[str]]]:
    """A proxy that forwards everything and counts requests by method and path."""
    counts: Counter[str] = Counter()

    def seen(request: web.Request) -> None:
        counts[f"{request.method} {request.path}"] += 1

    async with forwarding_proxy(target, seen) as url:
        yield url, counts


async def test_results_come_by_cursor_with_no_per_id_poll(make_server: ServerFactory) -> None:
    async with make_server() as srv, counting_proxy(srv.url) as (url, counts):
        async with RolloutManager(
            servers=[url],
            prompts=_sleeps(100, 0.01),
            group_size=4,
            batch_groups=4,
            group_filter=None,
            max_version_lag=None,
            progress=False,
        ) as m:
            for _ in range(3):
                assert len(await m.next_batch()) == 4
            results = m.metrics()["samples"]["results"]
            reads = counts.copy()  # (closing cancels what runs, then reads those back)
    assert reads["GET /results"] >= 1 and reads["POST /poll"] == 0
    # one read answers for many jobs: far fewer reads than results
    assert reads["GET /results"] < results


async def test_a_job_the_server_forgot_is_found_by_a_sweep_and_run_again(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(poller, "SWEEP_S", 0.2)
    async with make_server() as srv:
        async with RolloutManager(
            servers=[srv.url],
            prompts=_sleeps(1, 0.3),
            group_size=2,
            batch_groups=1,
            group_filter=None,
            max_version_lag=None,
            progress=False,
        ) as m:
            assert m._dispatcher is not None
            server = m._dispatcher.pool.servers[srv.url]
            await eventually(lambda: len(server.submitted()) > 0)
            forgotten = server.submitted()[0]
            await srv.client.delete(forgotten)  # cancelled and forgotten: no result ever
            (group,) = await m.next_batch()  # its one group needs the forgotten sample
            assert [r["status"] for r in group.results] == ["done", "done"]
            assert m.metrics()["retries"].get("lost", 0) >= 1
