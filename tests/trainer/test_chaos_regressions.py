"""What the manager chaos test (tests/chaos/test_manager_chaos.py) found, one test each."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from prorl_async.client import RolloutClient, ServiceUnavailableError
from prorl_async.scripted_llm import ScriptedLLM
from prorl_async.trainer import RolloutManager, RolloutStalled, poller
from prorl_async.trainer.dispatch import Dispatcher, Settings
from prorl_async.trainer.registry import GroupState
from prorl_async.trainer.retry import Backoff, classify_result
from prorl_async.trainer.servers import QUARANTINE_AFTER, ServerPool, ServerState
from prorl_async.trainer.staleness import Staleness
from prorl_async.trainer.watchdog import cancel_on_servers
from tests.helpers import eventually, forwarding_proxy, server_process
from tests.trainer.checks import check_accounting, check_group
from tests.trainer.flaky import flaky_proxy
from tests.trainer.harness import planted, rig


async def test_a_server_quarantined_by_its_submissions_is_probed_again(tmp_path: Path) -> None:
    # Every request but /healthz is answered 503 from the start: the submissions fail and
    # quarantine the server while nothing is acknowledged there, so its poll loop idles.
    # It used to idle on: the server was never probed again, and the batch stalled.
    prompts = [planted("random", seed=i, run_s=0.01) for i in range(100)]
    async with rig(tmp_path, servers=1) as r, flaky_proxy(r.urls[0], 0.0, 0.0) as proxy:
        async with RolloutClient(r.urls[0]) as client:
            await client.add_llm_server(r.llm.address, weight_version=0)
        async with RolloutManager(
            servers=[proxy.url],
            prompts=prompts,
            group_size=2,
            batch_groups=2,
            group_filter=None,
            max_infra_retries=1000,
            stall_timeout_s=15.0,
            progress=False,
        ) as m:
            proxy.error_rate = 1.0  # before the feed loop's first pass
            batch = asyncio.ensure_future(m.next_batch())
            await eventually(lambda: m.metrics()["servers"][proxy.url]["quarantined"])
            proxy.error_rate = 0.0
            for group in await asyncio.wait_for(batch, 30):
                check_group(group, 2, filtered=False)
            check_accounting(m.metrics())
    assert proxy.injected["503"] >= QUARANTINE_AFTER


async def test_a_dead_engine_in_the_weights_keeps_a_recovering_server_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A server back from quarantine gets the current weights again. One engine of them
    # is dead: the server refuses them (422). That used to end its poll loop and break
    # the manager for good (every next_batch() raised it); now the server stays
    # quarantined and is pushed the weights again until it takes them.
    prompts = [planted("random", seed=i, run_s=0.01) for i in range(400)]
    async with rig(tmp_path, servers=1) as r, ScriptedLLM(policy="finish") as spare:
        async with RolloutManager(
            servers=r.urls,
            prompts=prompts,
            group_size=2,
            batch_groups=2,
            group_filter=None,
            stall_timeout_s=20.0,
            progress=False,
        ) as m:
            await m.set_weights(version=0, backends=[r.llm.address, spare.address])
            await m.next_batch()
            await spare.kill()
            assert m._dispatcher is not None
            server = m._dispatcher.pool.servers[r.urls[0]]
            for _ in range(QUARANTINE_AFTER):  # as when it went away for a while
                m._dispatcher.server_failed(server, ConnectionError("gone"))
            assert server.quarantined
            await eventually(lambda: "refused the weights" in caplog.text)
            assert server.quarantined
            await spare.revive()
            await eventually(lambda: not server.quarantined, timeout=15)
            for _ in range(3):  # and it serves again
                for group in await asyncio.wait_for(m.next_batch(), 30):
                    check_group(group, 2, filtered=False)
            check_accounting(m.metrics())


@asynccontextmanager
async def losing_proxy(target: str, path: str, lose: int) -> AsyncIterator[str]:
    """TEST DOUBLE network: forwards to ``target``, but the answer to its ``lose``-th
    request to ``path`` is lost (the server did the work; the connection is cut)."""
    count = 0

    def seen(request: web.Request) -> None:
        nonlocal count
        if request.path == path:
            count += 1
            if count == lose and request.transport is not None:
                request.transport.abort()

    async with forwarding_proxy(target, seen) as url:
        yield url


async def test_a_result_read_while_its_submission_waits_to_be_resent_is_kept(
    tmp_path: Path,
) -> None:
    # p0 runs long and p1 briefly (one call); p1's result lets p2 in, whose submission's
    # answer is lost: p2 waits to be sent again under the same id, pinned to the server,
    # which already runs it. Its result passes the cursor (read for p0) before it is
    # resent; it used to be ignored then, and never came again: the batch stalled.
    prompts = [
        planted("right", seed=0, run_s=3.0),
        planted("right", seed=1, run_s=0.01),
        planted("right", seed=2, run_s=0.01),
    ]
    async with rig(tmp_path, servers=1) as r, losing_proxy(r.urls[0], "/process/batch", 2) as url:
        async with RolloutManager(
            servers=[url],
            prompts=prompts,
            group_size=1,
            batch_groups=3,
            max_inflight_groups=2,
            group_filter=None,
            stall_timeout_s=15.0,
            progress=False,
        ) as m:
            await m.set_weights(version=0, backends=[r.llm.address])
            assert m._dispatcher is not None
            m._dispatcher.backoff = Backoff(base_s=2.0)  # resent well after p2's result
            batch = await asyncio.wait_for(m.next_batch(), 30)
            assert sorted(g.prompt_uid for g in batch) == ["p0", "p1", "p2"]
            metrics = m.metrics()
            check_accounting(metrics)
    assert metrics["retries"] == {"submit_connection": 1}


async def test_a_server_that_missed_a_weight_swap_is_out_until_it_has_it(tmp_path: Path) -> None:
    # The answer to the second /clear_llm_server is lost: the server dropped its engines,
    # and the manager cannot know whether the swap went through. It used to keep the
    # server in rotation with no dispatcher, its new samples waiting for one forever (a
    # stall). Now it is quarantined and given the current weights before it serves.
    prompts = [planted("random", seed=i, run_s=0.01) for i in range(400)]
    async with (
        rig(tmp_path, servers=1) as r,
        losing_proxy(r.urls[0], "/clear_llm_server", 2) as url,
        RolloutManager(
            servers=[url],
            prompts=prompts,
            group_size=2,
            batch_groups=2,
            group_filter=None,
            stall_timeout_s=15.0,
            progress=False,
        ) as m,
    ):
        await m.set_weights(version=0, backends=[r.llm.address])
        await m.next_batch()
        await m.set_weights(version=1, backends=[r.llm.address])
        for _ in range(3):
            for group in await asyncio.wait_for(m.next_batch(), 30):
                check_group(group, 2, filtered=False)
        metrics = m.metrics()
        check_accounting(metrics)
    assert metrics["servers"][url]["quarantines"] == 1


async def test_a_server_restarted_while_idle_is_given_the_weights_again(tmp_path: Path) -> None:
    # With on_batch_full="cancel" the server idles between batches. It is restarted then
    # (same state dir): it comes back with no LLM dispatcher, and the manager, which sent it
    # nothing meanwhile, never saw it go. Its new samples used to wait for an engine
    # forever (a stall); now the manager finds it has none and gives it the weights.
    prompts = [planted("random", seed=i, run_s=0.01) for i in range(400)]
    state = tmp_path / "server"
    async with (
        ScriptedLLM(policy="finish") as llm,
        server_process(state, {}, "--run-workers", "8") as (proc, url),
        flaky_proxy(url, 0.0, 0.0) as proxy,
        RolloutManager(
            servers=[proxy.url],
            prompts=prompts,
            group_size=2,
            batch_groups=2,
            group_filter=None,
            on_batch_full="cancel",
            stall_timeout_s=15.0,
            progress=False,
        ) as m,
    ):
        await m.set_weights(version=0, backends=[llm.address])
        await m.next_batch()
        proc.kill()
        await proc.wait()
        async with server_process(state, {}, "--run-workers", "8") as (_, again):
            proxy.target = again
            for _ in range(2):
                for group in await asyncio.wait_for(m.next_batch(), 30):
                    check_group(group, 2, filtered=False)
            metrics = m.metrics()
            check_accounting(metrics)
    assert metrics["servers"][proxy.url]["quarantines"] == 1


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ({"stage": "init", "type": "PlantedInfraError"}, "infra"),
        ({"stage": "run", "type": "BackendError"}, "infra"),
        ({"stage": "run", "type": "EngineUnavailable"}, "infra"),
        ({"stage": "run", "type": "ValueError"}, "task"),
        ({"stage": "eval", "type": "AssertionError"}, "task"),
    ],
)
def test_an_llm_engine_that_failed_is_infrastructure(error: dict[str, str], kind: str) -> None:
    assert classify_result({"status": "failed", "error": error}) == kind
    timed_out = {"status": "timed_out", "error": error | {"type": "TimeoutError"}}
    assert classify_result(timed_out) == "task"  # the policy's own result, as before


async def test_samples_whose_llm_engine_failed_are_never_returned(tmp_path: Path) -> None:
    # Every LLM call is answered 503: each sample fails in RUN with BackendError. That
    # used to be the policy's result: groups of reward-None samples went to the trainer
    # (with a filter, next_batch() spun on them forever, results coming all the time). It
    # is the machinery's failure: retried, never returned, and with nothing else coming
    # next_batch() ends with RolloutStalled.
    prompts = [planted("random", seed=i, run_s=0.01) for i in range(1000)]
    async with rig(tmp_path, servers=1) as r:
        r.llm.set_faults(error_rate=1.0)
        async with RolloutManager(
            servers=r.urls,
            prompts=prompts,
            group_size=2,
            batch_groups=2,
            group_filter=None,
            stall_timeout_s=5.0,
            progress=False,
        ) as m:
            await m.set_weights(version=0, backends=[r.llm.address])
            with pytest.raises(RolloutStalled):
                await asyncio.wait_for(m.next_batch(), 30)
            metrics = m.metrics()
            check_accounting(metrics)
    assert metrics["groups"]["returned"] == metrics["groups"]["kept"] == 0
    assert metrics["retries"]["result_failed"] > 0


# -- jobs the manager gave up on are never forgotten while they may run ------------------------


async def test_a_dropped_group_orphans_its_sample_waiting_to_be_resent() -> None:
    # Sample 0's submission lost its answer (the server may run it): it waits, pinned, to
    # be sent again. Sample 1 then fails in INIT past max_infra_retries: the group is
    # dropped. Sample 0's job used to be forgotten (it was in no server's in-flight map).
    server = ServerState("http://a", None, 4)  # type: ignore[arg-type]
    settings = Settings(
        group_size=2,
        batch_groups=1,
        max_inflight_groups=1,
        group_filter=lambda group: True,
        max_infra_retries=0,
    )
    dispatcher = Dispatcher(settings, iter([]), ServerPool([server]), Staleness(None, 1), "r")
    dispatcher.reg.add_group(GroupState("p0", {"task": "t", "instance": {}}, 2))
    first, second = dispatcher.reg.pending
    server.add(first)
    server.add(second)
    dispatcher._submit_failed(server, [first], ConnectionError("answer lost"), "connection")
    assert first.pin == server.url and first.job_id not in server.inflight
    second.submitted_at = 1.0
    infra = {"job_id": second.job_id, "status": "failed", "error": {"stage": "init"}}
    dispatcher.on_done(server, infra)
    assert dispatcher.metrics.failed_by == {"failed": 1}
    assert server.orphans == {first.job_id}


async def test_a_sample_resent_after_a_lost_answer_and_refused_is_orphaned() -> None:
    # The answer to its submission is lost (the server took it); sent again under the same
    # id, it is refused (503): it goes elsewhere under a new id. The first one, running
    # where the answer was lost, used to be forgotten.
    server, other = ServerState("http://a", None, 4), ServerState("http://b", None, 4)  # type: ignore[arg-type]
    settings = Settings(
        group_size=1,
        batch_groups=1,
        max_inflight_groups=1,
        group_filter=lambda group: True,
        max_infra_retries=3,
    )
    dispatcher = Dispatcher(
        settings, iter([]), ServerPool([server, other]), Staleness(None, 1), "r"
    )
    dispatcher.reg.add_group(GroupState("p0", {"task": "t", "instance": {}}, 1))
    (sample,) = dispatcher.reg.pending
    server.add(sample)
    dispatcher._submit_failed(server, [sample], ConnectionError("answer lost"), "connection")
    server.add(sample)  # sent again
    refused = ServiceUnavailableError(503, "busy", retry_after=0.0)
    dispatcher._submit_failed(server, [sample], refused, "http_503")
    assert server.orphans == {"r-p0-0-0"}
    assert [
        s.job_id for s in dispatcher.reg.pending if dispatcher.reg.by_job.get(s.job_id) is s
    ] == ["r-p0-0-1"]


class _Unreachable:
    """A client whose every call fails as a server that is down (or answers 503) does."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def cancel(self, job_ids: list[str]) -> dict[str, list[str]]:
        raise self.exc

    async def poll(self, job_ids: list[str], wait: float = 0.0) -> dict[str, list[str]]:
        raise self.exc


UNREACHABLE = [
    aiohttp.ClientConnectionError("down"),
    ServiceUnavailableError(503, "stopped", retry_after=1.0),
]


@pytest.mark.parametrize("exc", UNREACHABLE, ids=["connection", "503"])
async def test_orphans_whose_cancel_failed_are_kept(exc: Exception) -> None:
    # A server that does not answer has not dropped them: a restart requeues them (the
    # durable store), a 503 left them running. They used to be forgotten.
    server = ServerState("http://a", _Unreachable(exc), 4)  # type: ignore[arg-type]
    server.orphans = {"j1", "j2"}
    await poller._cancel_orphans(server)
    assert server.orphans == {"j1", "j2"}


@pytest.mark.parametrize("exc", UNREACHABLE, ids=["connection", "503"])
async def test_jobs_whose_cancel_failed_become_orphans(exc: Exception) -> None:
    # on_batch_full="cancel" (and close) cancel the unfinished groups on their servers.
    server = ServerState("http://a", _Unreachable(exc), 4)  # type: ignore[arg-type]
    assert await cancel_on_servers(ServerPool([server]), {"j1": server.url}) == []
    assert server.orphans == {"j1"}


class _Held:
    """A client whose cancel call is held until the test lets it go."""

    def __init__(self) -> None:
        self.called = asyncio.Event()

    async def cancel(self, job_ids: list[str]) -> dict[str, list[str]]:
        self.called.set()
        await asyncio.Event().wait()  # the call is in flight until it is cancelled
        raise AssertionError("unreachable")


async def test_orphans_whose_cancel_was_cut_short_by_close_are_kept() -> None:
    # Seed 3 of the chaos test: a group passed its deadline, its poll loop was cancelling
    # its two jobs when the manager closed. Closing cancels the poll loop, and the ids,
    # already taken from the orphans, were in neither place: close never cancelled them
    # and they ran on.
    client = _Held()
    server = ServerState("http://a", client, 4)  # type: ignore[arg-type]
    server.orphans = {"j1", "j2"}
    call = asyncio.ensure_future(poller._cancel_orphans(server))
    await asyncio.wait_for(client.called.wait(), 10)
    assert server.orphans == set()
    call.cancel()
    await asyncio.wait({call})
    assert call.cancelled()
    assert server.orphans == {"j1", "j2"}


async def test_jobs_whose_cancel_was_cut_short_become_orphans() -> None:
    client = _Held()
    server = ServerState("http://a", client, 4)  # type: ignore[arg-type]
    call = asyncio.ensure_future(cancel_on_servers(ServerPool([server]), {"j1": server.url}))
    await asyncio.wait_for(client.called.wait(), 10)
    call.cancel()
    await asyncio.wait({call})
    assert call.cancelled()
    assert server.orphans == {"j1"}
