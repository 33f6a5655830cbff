"""a dead server never blocks the event loop; no set_weights cadence starves admission."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from prorl_async.client import RolloutClient
from prorl_async.trainer import RolloutManager
from prorl_async.trainer.retry import Backoff
from tests.trainer.checks import check_accounting, check_group
from tests.trainer.harness import planted, rig
from tests.trainer.loopwatch import loop_watch

N, B = 4, 4


async def test_a_dead_server_never_blocks_the_event_loop(tmp_path: Path) -> None:
    # The server the next samples go to dies just after a batch is handed over. Their
    # submission fails and they stay pinned to it (same ids: the answer may be lost)
    # until it is quarantined; moving them elsewhere must not spin the feed loop.
    prompts = [planted("random", seed=i, run_s=0.05, sigma=1.0) for i in range(600)]
    async with (
        rig(tmp_path, run_workers=32) as r,
        loop_watch() as beat,
        RolloutManager(
            servers=r.urls,
            prompts=prompts,
            group_size=N,
            batch_groups=B,
            on_batch_full="carry",
            group_filter=None,
            max_version_lag=None,
            progress=False,
        ) as m,
    ):
        await m.set_weights(version=0, backends=[r.llm.address])
        assert m._dispatcher is not None
        # pinned samples wait longer than the poller takes to quarantine the dead server
        m._dispatcher.backoff = Backoff(base_s=0.5)
        await m.next_batch()
        # the server the feed loop picks next (fewest in flight, room on both) dies before
        # the loop runs again: no await between the batch and its death
        inflight = m.metrics()["servers"]
        victim = min(r.urls, key=lambda u: inflight[u]["inflight"])
        proc = r.procs[r.urls.index(victim)]
        proc.kill()
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # noqa: ASYNC222 (dead, not reaped)
        ticks = beat.ticks
        for _ in range(3):
            batch = await asyncio.wait_for(m.next_batch(), 90)
            for group in batch:
                check_group(group, N, filtered=False)
        metrics = m.metrics()
        check_accounting(metrics)
        assert beat.ticks > ticks  # the heartbeat kept ticking while the batches filled
    assert metrics["servers"][victim]["quarantined"]
    assert metrics["retries"]["submit_connection"] > 0  # samples were pinned to it
    assert metrics["groups"]["returned"] == 4 * B
    lag = metrics["loop_lag_ms"]
    assert set(lag) == {"max", "recent"} and lag["max"] >= lag["recent"] >= 0


@pytest.mark.parametrize("first_sync", ["before the first batch", "before the fourth batch"])
async def test_weights_synced_late_still_admit_groups(tmp_path: Path, first_sync: str) -> None:
    # three batches at version 0 with no set_weights after them, then a jump to version 3
    prompts = [planted("random", seed=i, run_s=0.01) for i in range(400)]
    async with (
        rig(tmp_path) as r,
        RolloutManager(
            servers=r.urls,
            prompts=prompts,
            group_size=N,
            batch_groups=B,
            max_version_lag=1,
            stall_timeout_s=20.0,
            progress=False,
        ) as m,
    ):
        if first_sync == "before the first batch":
            await m.set_weights(version=0, backends=[r.llm.address])
        else:  # the servers serve version 0; the manager hears of versions only later
            for url in r.urls:
                async with RolloutClient(url) as client:
                    await client.add_llm_server(r.llm.address, weight_version=0)
        for _ in range(3):
            for group in await m.next_batch():
                assert group.min_weight_version == 0
        for version in (3, 4, 6):  # then a sync after a batch, and one after two steps
            await m.set_weights(version=version, backends=[r.llm.address])
            for group in await m.next_batch():
                check_group(group, N)
                assert group.min_weight_version is not None
                assert version - group.min_weight_version <= 1
        metrics = m.metrics()
        check_accounting(metrics)
    assert metrics["groups"]["returned"] == 6 * B
    assert set(metrics["version_lag"]) <= {0, 1}
