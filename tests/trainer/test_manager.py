"""RolloutManager against real rollout servers (subprocesses) and a scripted LLM test double."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest

from handlers.planted import PlantedInstance, planted_reward
from prorl_async.client import RolloutClient
from prorl_async.trainer import (
    Group,
    PromptsExhausted,
    RolloutManager,
    RolloutStalled,
    TrainerError,
)
from tests.helpers import eventually
from tests.trainer.checks import check_accounting, check_group
from tests.trainer.flaky import flaky_proxy
from tests.trainer.harness import mixed_prompts, planted, rig

N, B = 4, 4


def collect_samples(batch: list[Group], seen: set[tuple[str, int]], jobs: set[str]) -> None:
    assert len(batch) == B
    for group in batch:
        for sample in check_group(group, N):
            assert sample not in seen, f"sample {sample} returned twice"
            seen.add(sample)
        for result in group.results:
            assert result["job_id"] not in jobs
            jobs.add(result["job_id"])


async def test_ten_batches_with_carry_and_mid_batch_weight_swaps(tmp_path: Path) -> None:
    prompts = mixed_prompts(400, run_s=0.02, sigma=1.0)
    async with (
        rig(tmp_path) as r,
        RolloutManager(
            servers=r.urls,
            prompts=prompts,
            group_size=N,
            batch_groups=B,
            max_version_lag=1,
            progress=False,
        ) as m,
    ):
        await m.set_weights(version=0, backends=[r.llm.address])
        seen: set[tuple[str, int]] = set()
        jobs: set[str] = set()
        version = 0
        for i in range(10):
            pending = asyncio.ensure_future(m.next_batch())
            if i % 2:  # swap the weights while the batch is being filled
                floor = m.metrics()["samples"]["results"] + 2
                await eventually(
                    functools.partial(lambda f: m.metrics()["samples"]["results"] > f, floor)
                )
                version += 1
                await m.set_weights(version=version, backends=[r.llm.address])
            batch = await pending
            collect_samples(batch, seen, jobs)
            for group in batch:
                # the swap may land while the batch is handed over: lag is judged at return
                assert group.min_weight_version is not None
                assert version - group.min_weight_version <= 2
            version += 1
            await m.set_weights(version=version, backends=[r.llm.address])
        metrics = m.metrics()
        check_accounting(metrics)
    assert metrics["groups"]["returned"] == 10 * B
    assert metrics["groups"]["filtered"] > 0
    # the lag of every returned group, taken against the version current when it was returned
    assert set(metrics["version_lag"]) <= {0, 1}
    assert sum(metrics["version_lag"].values()) == 10 * B
    assert len(metrics["batch_fill_s"]) == 10


async def test_lag_zero_never_returns_an_old_group(tmp_path: Path) -> None:
    prompts = [planted("random", seed=i, run_s=0.05, sigma=1.0) for i in range(300)]
    async with (
        rig(tmp_path) as r,
        RolloutManager(
            servers=r.urls,
            prompts=prompts,
            group_size=N,
            batch_groups=B,
            max_version_lag=0,
            progress=False,
        ) as m,
    ):
        await m.set_weights(version=0, backends=[r.llm.address])
        dispatcher = m._dispatcher
        assert dispatcher is not None
        for version in range(1, 4):
            pending = asyncio.ensure_future(m.next_batch())
            # bump while some group has a finished sample and an unfinished one
            await eventually(
                lambda: any(
                    any(x is not None for x in g.results) and not g.complete
                    for g in dispatcher.reg.groups.values()
                )
            )
            await m.set_weights(version=version, backends=[r.llm.address])
            batch = await pending
            for group in batch:
                assert group.min_weight_version in (version - 1, version)
        metrics = m.metrics()
        check_accounting(metrics)
    assert metrics["version_lag"] == {0: 3 * B}  # judged when each group was returned
    assert metrics["groups"]["stale"] >= 1
    assert metrics["wasted_tokens"]["stale"] > 0


async def test_cancel_leaves_no_job_running(tmp_path: Path) -> None:
    prompts = mixed_prompts(200, run_s=0.1, sigma=1.2)
    async with rig(tmp_path) as r:
        async with RolloutManager(
            servers=r.urls,
            prompts=prompts,
            group_size=N,
            batch_groups=B,
            on_batch_full="cancel",
            progress=False,
        ) as m:
            await m.set_weights(version=0, backends=[r.llm.address])
            for _ in range(2):
                batch = await m.next_batch()
                assert len(batch) == B
                for url in r.urls:
                    async with RolloutClient(url) as c:
                        status = await c.status()
                    busy = sum(status["queues"].values()) + sum(status["active"].values())
                    assert busy == 0, (url, status)
            metrics = m.metrics()
            check_accounting(metrics)
    assert metrics["groups"]["cancelled"] > 0
    assert metrics["wasted_seconds"]["cancelled"] > 0


async def test_server_killed_mid_batch(tmp_path: Path) -> None:
    prompts = mixed_prompts(300, run_s=0.1, sigma=0.5)
    async with (
        rig(tmp_path) as r,
        RolloutManager(
            servers=r.urls,
            prompts=prompts,
            group_size=N,
            batch_groups=2 * B,
            progress=False,
        ) as m,
    ):
        await m.set_weights(version=0, backends=[r.llm.address])
        pending = asyncio.ensure_future(m.next_batch())
        victim = r.urls[0]
        assert m._dispatcher is not None
        server = m._dispatcher.pool.servers[victim]
        await eventually(lambda: len(server.submitted()) > 0)
        r.procs[0].kill()
        seen: set[tuple[str, int]] = set()
        batch = await pending
        for group in batch:
            for sample in check_group(group, N):
                assert sample not in seen
                seen.add(sample)
        metrics = m.metrics()
        check_accounting(metrics)
    assert metrics["servers"][victim]["quarantined"]
    assert metrics["retries"].get("quarantine", 0) > 0


async def test_infrastructure_failures_are_retried_never_scored(tmp_path: Path) -> None:
    # every prompt is planted right: any sample scored for a failure would show reward != 1
    # init failures are drawn per job id (random): at 0.15 over 80+ jobs, none at all is
    # 0.85**80 ~ 2e-6 likely (at 0.05 it was ~2%, and it happened)
    prompts = [planted("right", seed=i, run_s=0.01, init_fail_rate=0.15) for i in range(60)]
    async with rig(tmp_path) as r:
        async with (
            flaky_proxy(r.urls[0], error_rate=0.05, drop_rate=0.05, seed=1) as p0,
            flaky_proxy(r.urls[1], error_rate=0.05, drop_rate=0.05, seed=2) as p1,
            RolloutManager(
                servers=[p0.url, p1.url],
                prompts=prompts,
                group_size=N,
                batch_groups=B,
                group_filter=None,
                max_version_lag=None,
                progress=False,
            ) as m,
        ):
            await m.set_weights(version=0, backends=[r.llm.address])
            for _ in range(5):
                for group in await m.next_batch():
                    assert len(group.results) == N
                    assert group.rewards == [1.0] * N
            metrics = m.metrics()
            injected = p0.injected + p1.injected
    assert injected["503"] > 0 and injected["drop"] > 0
    assert metrics["retries"].get("result_failed", 0) > 0  # planted INIT failures
    # every sample handed out has one result, and every failed one another: "submitted"
    # cannot say this, a submission whose answer was lost is not counted when its result
    # comes back before it is sent again
    assert metrics["samples"]["results"] >= 5 * B * N + metrics["retries"]["result_failed"]


async def test_a_prompt_that_never_finishes_hits_its_deadline(tmp_path: Path) -> None:
    prompts = [planted("random", seed=i, run_s=0.02) for i in range(40)]
    prompts.insert(1, planted("random", seed=99, hang=True))
    async with (
        rig(tmp_path) as r,
        RolloutManager(
            servers=r.urls,
            prompts=prompts,
            group_size=N,
            batch_groups=B,
            sample_deadline_s=1.0,
            progress=False,
        ) as m,
    ):
        await m.set_weights(version=0, backends=[r.llm.address])
        batch = await m.next_batch()
        await eventually(lambda: m.metrics()["groups"]["failed_by"].get("deadline") == 1)
        for group in batch:
            check_group(group, N)
            assert group.prompt_uid != "p1"
        hung = [f"{m.run_id}-p1-{k}-0" for k in range(N)]
        async with RolloutClient(r.urls[0]) as c0, RolloutClient(r.urls[1]) as c1:

            async def all_cancelled() -> bool:
                found = (await c0.poll(hung))["done"] + (await c1.poll(hung))["done"]
                return len(found) == N and {x["status"] for x in found} == {"cancelled"}

            await eventually(all_cancelled)


async def test_stall_watchdog_names_servers_and_samples(tmp_path: Path) -> None:
    prompts = [planted("right", seed=i, hang=True) for i in range(4)]
    async with (
        rig(tmp_path) as r,
        RolloutManager(
            servers=r.urls,
            prompts=prompts,
            group_size=2,
            batch_groups=1,
            sample_deadline_s=None,
            stall_timeout_s=1.0,
            progress=False,
        ) as m,
    ):
        await m.set_weights(version=0, backends=[r.llm.address])
        waiting = asyncio.ensure_future(m.next_batch())
        await eventually(lambda: m.metrics()["samples"]["submitted"] > 0)
        waiting.cancel()  # a waiting next_batch() is cancellable; the manager goes on
        await asyncio.wait({waiting})
        assert waiting.cancelled()
        with pytest.raises(RolloutStalled) as info:
            await m.next_batch()
    assert "no rollout result for 1 s" in str(info.value)
    servers = info.value.diagnosis["servers"]
    assert isinstance(servers, dict) and set(servers) == set(r.urls)
    assert info.value.diagnosis["samples"]
    assert "waiting for 4 samples on servers" in str(info.value)


async def test_a_job_the_server_rejects_is_a_clear_error(tmp_path: Path) -> None:
    prompts = [{"task": "no-such-task", "instance": {}}]
    async with rig(tmp_path, servers=1) as r:
        async with RolloutManager(
            servers=r.urls,
            prompts=prompts,
            group_size=2,
            batch_groups=1,
            progress=False,
        ) as m:
            with pytest.raises(TrainerError, match=r"rejected a job: HTTP 422.*no-such-task"):
                await m.next_batch()
        async with RolloutManager(
            servers=r.urls,
            prompts=[{"task": "planted"}],
            group_size=1,
            batch_groups=1,
        ) as m:
            with pytest.raises(TrainerError, match=r"prompts\[0\]: missing 'instance'"):
                await m.next_batch()


async def test_prompts_running_out_is_a_clear_error(tmp_path: Path) -> None:
    prompts = [planted("right", seed=i) for i in range(3)] + [planted("random", seed=7)]
    async with (
        rig(tmp_path, servers=1) as r,
        RolloutManager(
            servers=r.urls,
            prompts=prompts,
            group_size=N,
            batch_groups=2,
            progress=False,
        ) as m,
    ):
        await m.set_weights(version=0, backends=[r.llm.address])
        inst = PlantedInstance(outcome="random", seed=7)
        ready = int(len({planted_reward(inst, f"p3-{k}") for k in range(N)}) > 1)
        with pytest.raises(PromptsExhausted, match=rf"prompts ran out: {ready} of 2 groups ready"):
            await m.next_batch()


@pytest.mark.parametrize(("server_queue", "queued"), [(None, 4), (0, 0), (3, 3)])
async def test_a_server_holds_its_run_workers_plus_a_queue(
    tmp_path: Path, server_queue: int | None, queued: int
) -> None:
    """The window: RUN workers busy and ``server_queue`` (default: as many) waiting behind
    them at the server, so a freed worker starts the next job without a round trip."""
    prompts = [planted("right", run_s=120.0, seed=i) for i in range(32)]
    async with (
        rig(tmp_path, servers=1, run_workers=4) as r,
        RolloutManager(
            servers=r.urls,
            prompts=prompts,
            group_size=2,
            batch_groups=8,
            server_queue=server_queue,
            group_filter=None,
            progress=False,
        ) as m,
        RolloutClient(r.urls[0]) as client,
    ):
        await m.set_weights(version=0, backends=[r.llm.address])

        async def placed() -> bool:
            status = await client.status()
            waiting = sum(status["queues"].values())  # before INIT (admitted just in time) or RUN
            return bool(status["active"]["run"] == 4 and waiting >= queued)

        await eventually(placed, what="4 jobs running and the queue filled")

        def acknowledged() -> bool:
            return bool(m.metrics()["samples"]["submitted"] >= 4 + queued)

        await eventually(acknowledged, what="the submissions acknowledged")
        status = await client.status()
        assert sum(status["queues"].values()) == queued
        assert m.metrics()["samples"]["submitted"] == 4 + queued


def test_a_negative_server_queue_is_refused() -> None:
    with pytest.raises(ValueError, match="server_queue"):
        RolloutManager(
            servers=["http://127.0.0.1:1"],
            prompts=[],
            group_size=2,
            batch_groups=1,
            server_queue=-1,
        )


async def test_hold_waits_for_running_groups_and_starts_none(tmp_path: Path) -> None:
    """An evaluation on the same engines runs with no training rollout beside it: ``hold``
    lets the running groups finish first, then starts none until it is left. Every group
    here is filtered, so the manager always wants more."""
    async with (
        rig(tmp_path, servers=1, run_workers=4) as r,
        RolloutManager(
            servers=r.urls,
            prompts=[planted("wrong", run_s=0.2, sigma=0.5, seed=i) for i in range(400)],
            group_size=N,
            batch_groups=B,
            max_version_lag=1,
            progress=False,
        ) as m,
        RolloutClient(r.urls[0]) as client,
    ):
        await m.set_weights(version=0, backends=[r.llm.address])
        await eventually(lambda: m.metrics()["inflight_groups"] > 0, what="groups running")
        async with m.hold():
            held = m.metrics()
            assert held["inflight_groups"] == 0
            assert held["ready_groups"] == 0
            (job_id,) = await client.submit_batch([planted("right", run_s=0.2)])
            answer = await client.poll([job_id], wait=10.0)
            assert [d["status"] for d in answer["done"]] == ["done"]
            status = await client.status()
            assert status["active"]["run"] == 0 and sum(status["queues"].values()) == 0
            assert m.metrics()["samples"]["submitted"] == held["samples"]["submitted"]
        await eventually(
            lambda: m.metrics()["samples"]["submitted"] > held["samples"]["submitted"],
            what="submissions resumed after the hold",
        )
