"""The backend pool against real ScriptedLLM servers: routing, waiting, leases, failover."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from prorl_async.llm.pool import BackendError, BackendPool, Lease, PoolConfig
from prorl_async.scripted_llm import LatencyModel
from prorl_async.util.timer import PausableTimer
from tests.helpers import eventually
from tests.llm.pool.conftest import FAST, StartLLM, backend

PROMPT = [1, 2, 3, 4]


async def hold(pool: BackendPool, count: int, stack: contextlib.AsyncExitStack) -> list[Lease]:
    return [await stack.enter_async_context(pool.lease()) for _ in range(count)]


async def test_pick_least_inflight_now_then_least_assigned(start_llm: StartLLM) -> None:
    a, b, c = [await start_llm() for _ in range(3)]
    async with BackendPool(FAST) as pool, contextlib.AsyncExitStack() as stack:
        for llm in (a, b, c):
            pool.add(llm.address)
        first = await hold(pool, 3, stack)
        assert {x.address for x in first} == {a.address, b.address, c.address}
        async with pool.lease() as extra:  # all 1 in flight, all 1 assigned: first registered
            assert extra.address == a.address
        async with pool.lease() as nxt:  # all 1 in flight again; a has 2 assigned, b and c 1
            assert nxt.address == b.address
        assert [s["assigned"] for s in pool.snapshot()] == [2, 2, 1]
        assert [s["inflight"] for s in pool.snapshot()] == [1, 1, 1]


async def test_pick_uses_inflight_now_not_cumulative(start_llm: StartLLM) -> None:
    a, b = await start_llm(), await start_llm()
    async with BackendPool(FAST) as pool:
        pool.add(a.address)
        pool.add(b.address)
        for _ in range(5):  # a is assigned many short jobs...
            async with pool.lease():
                pass
        async with contextlib.AsyncExitStack() as stack:
            [long] = await hold(pool, 1, stack)  # ... b got one of them too; find who is busy
            busy = long.address
            async with pool.lease() as nxt:  # a job in flight beats any cumulative count
                assert nxt.address != busy


async def test_weight_scales_the_share(start_llm: StartLLM) -> None:
    a, b = await start_llm(), await start_llm()
    async with BackendPool(FAST) as pool, contextlib.AsyncExitStack() as stack:
        pool.add(a.address, weight=2.0)
        pool.add(b.address)
        leases = await hold(pool, 6, stack)
        counts = {a.address: 0, b.address: 0}
        for x in leases:
            counts[x.address] += 1
        assert counts == {a.address: 4, b.address: 2}


async def test_max_inflight_respected_under_load(start_llm: StartLLM) -> None:
    lat = LatencyModel(ttft_s=0.002, per_token_s=0.0005)
    a, b = await start_llm(latency=lat), await start_llm(latency=lat)
    async with BackendPool(FAST) as pool:
        pool.add(a.address, max_inflight=2)
        pool.add(b.address, max_inflight=3)
        peak_waiting = 0

        async def job() -> list[str]:
            nonlocal peak_waiting
            async with pool.lease() as lease:
                peak_waiting = max(peak_waiting, pool.waiting)
                gens = [await lease.generate(PROMPT, 16, {}) for _ in range(3)]
                for x in pool.backends:
                    assert x.max_inflight is not None and x.inflight <= x.max_inflight
                return [g.backend for g in gens]

        results = await asyncio.gather(*(job() for _ in range(20)))
        assert all(len(set(r)) == 1 for r in results)  # affinity: one backend per job
        assert a.stats.peak_active <= 2 and b.stats.peak_active <= 3
        assert a.stats.peak_active == 2 and b.stats.peak_active == 3  # and both were filled
        assert a.stats.served + b.stats.served == 60
        assert peak_waiting > 0 and pool.waiting == 0
        assert [s["inflight"] for s in pool.snapshot()] == [0, 0]


async def test_waiting_for_a_backend_pauses_the_timer(start_llm: StartLLM) -> None:
    a = await start_llm()
    async with BackendPool(FAST) as pool:
        pool.add(a.address, max_inflight=1)
        timer = PausableTimer(budget=60.0)
        got = asyncio.Event()

        async def job() -> str:
            async with timer.deadline(), pool.lease(timer) as lease:
                assert timer.running
                got.set()
                return (await lease.generate(PROMPT, 8, {})).backend

        async with pool.lease():
            task = asyncio.create_task(job())
            await eventually(lambda: pool.waiting == 1, timeout=5, what="the job to wait")
            assert not timer.running and not got.is_set()
            frozen = timer.elapsed()
            assert timer.elapsed() == frozen  # paused: no active time accrues
        assert await task == a.address
        assert pool.waiting == 0 and not timer.running


async def test_clear_mid_run_held_leases_finish_new_ones_wait(start_llm: StartLLM) -> None:
    a, b = await start_llm(), await start_llm()
    async with BackendPool(FAST) as pool:
        pool.add(a.address, weight_version=1)
        async with pool.lease() as held:
            pool.clear()
            assert pool.snapshot() == []
            gen = await held.generate(PROMPT, 8, {})  # still served by the backend it holds
            assert (gen.backend, gen.weight_version) == (a.address, 1)

            async def new_job() -> tuple[str, int | str | None]:
                async with pool.lease() as lease:
                    g = await lease.generate(PROMPT, 8, {})
                    return g.backend, g.weight_version

            task = asyncio.create_task(new_job())
            await eventually(lambda: pool.waiting == 1, timeout=5, what="the new job to wait")
            pool.add(b.address, weight_version=2)
            assert await task == (b.address, 2)


async def test_new_weight_version_shows_in_later_generations(start_llm: StartLLM) -> None:
    a = await start_llm()
    async with BackendPool(FAST) as pool:
        pool.add(a.address, weight_version=7)
        async with pool.lease() as lease:
            g1 = await lease.generate(PROMPT, 8, {})
            pool.add(a.address, weight_version=8)  # re-registration updates in place
            g2 = await lease.generate(PROMPT, 8, {})
        assert (g1.weight_version, g2.weight_version) == (7, 8)
        assert pool.snapshot() == [
            {
                "address": a.address,
                "inflight": 0,
                "assigned": 1,
                "healthy": True,
                "weight_version": 8,
                "max_model_len": None,
            }
        ]


async def test_killed_backend_fails_over_and_the_lease_moves(start_llm: StartLLM) -> None:
    a, b = await start_llm(), await start_llm()
    async with BackendPool(FAST) as pool:
        pool.add(a.address)
        pool.add(b.address)
        async with pool.lease() as lease:
            assert lease.address == a.address
            assert (await lease.generate(PROMPT, 8, {})).backend == a.address
            await a.kill()
            gen = await lease.generate(PROMPT, 8, {})
            assert gen.backend == b.address and lease.address == b.address
            assert [s["inflight"] for s in pool.snapshot()] == [0, 1]
            assert (await lease.generate(PROMPT, 8, {})).backend == b.address
        assert [s["inflight"] for s in pool.snapshot()] == [0, 0]


async def test_backend_killed_during_a_request(start_llm: StartLLM) -> None:
    a, b = await start_llm(), await start_llm()
    async with BackendPool(FAST) as pool:
        pool.add(a.address)
        pool.add(b.address)
        async with pool.lease() as lease:
            a.hold()
            call = asyncio.create_task(lease.generate(PROMPT, 8, {}))
            await a.wait_requests(1)
            await a.kill()
            gen = await call
        assert gen.backend == b.address and a.log[0].outcome == "killed"


@pytest.mark.parametrize("fault", ["error_rate", "drop_rate", "hang_rate"])
async def test_5xx_drops_and_hangs_are_retried_elsewhere(start_llm: StartLLM, fault: str) -> None:
    a, b = await start_llm(), await start_llm()
    a.set_faults(**{fault: 1.0})
    config = PoolConfig(failure_threshold=2, retries=2, request_timeout_s=0.3)
    async with BackendPool(config) as pool:
        pool.add(a.address)
        pool.add(b.address)
        async with pool.lease() as lease:
            assert lease.address == a.address
            gen = await lease.generate(PROMPT, 8, {})
        assert gen.backend == b.address and len(a.log) == 1 and pool.get(a.address)
        assert backend(pool, a.address).failures == 1


async def test_transient_error_on_the_only_backend_is_retried_there(start_llm: StartLLM) -> None:
    a = await start_llm()
    async with BackendPool(FAST) as pool:
        pool.add(a.address)
        a.set_faults(fail_next=1)
        async with pool.lease() as lease:
            gen = await lease.generate(PROMPT, 8, {})
        assert gen.backend == a.address and [e.outcome for e in a.log] == ["error", "ok"]
        assert pool.snapshot()[0]["healthy"] and backend(pool, a.address).failures == 0


async def test_failover_during_a_checkpoint_swap_waits_for_the_new_backend(
    start_llm: StartLLM,
) -> None:
    a, b = await start_llm(), await start_llm()
    async with BackendPool(FAST) as pool:
        pool.add(a.address, weight_version=1)
        async with pool.lease() as lease:
            pool.clear()
            await a.kill()
            call = asyncio.create_task(lease.generate(PROMPT, 8, {}))
            await eventually(
                lambda: pool.waiting == 1, timeout=5, what="the retry to wait for a backend"
            )
            pool.add(b.address, weight_version=2)
            gen = await call
        assert (gen.backend, gen.weight_version) == (b.address, 2)


async def test_all_backends_down_raises_backend_error(start_llm: StartLLM) -> None:
    a, b = await start_llm(), await start_llm()
    async with BackendPool(PoolConfig(failure_threshold=10, retries=3)) as pool:
        pool.add(a.address)
        pool.add(b.address)
        async with pool.lease() as lease:
            a.set_faults(error_rate=1.0)
            await b.kill()
            with pytest.raises(BackendError, match="after 4 attempts") as info:
                await lease.generate(PROMPT, 8, {})
        assert len(a.log) == 2  # a, b, a, b: the two refused connections are not logged
        assert "503" in str(info.value) or "Connect" in str(info.value)
        assert [s["inflight"] for s in pool.snapshot()] == [0, 0]


async def test_no_healthy_backend_left_fails_fast(start_llm: StartLLM) -> None:
    a = await start_llm()
    async with BackendPool(FAST) as pool:  # threshold 2, retries 3
        pool.add(a.address)
        async with pool.lease() as lease:
            await a.kill()
            with pytest.raises(BackendError, match="no healthy backend"):
                await lease.generate(PROMPT, 8, {})
        assert pool.snapshot()[0]["healthy"] is False


async def test_unhealthy_backend_is_skipped_then_probed_back(start_llm: StartLLM) -> None:
    a, b = await start_llm(), await start_llm()
    async with BackendPool(FAST) as pool:
        pool.add(a.address)
        pool.add(b.address)
        a.set_faults(down=True)
        for _ in range(2):  # threshold 2: two failed calls, each failing over to b
            async with pool.lease() as lease:
                assert (await lease.generate(PROMPT, 8, {})).backend == b.address
        assert backend(pool, a.address).healthy is False
        async with pool.lease() as l1, pool.lease() as l2:  # skipped while unhealthy
            assert l1.address == l2.address == b.address
        a.set_faults(down=False)
        await eventually(lambda: backend(pool, a.address).healthy, timeout=5, what="the probe")
        async with pool.lease() as lease:
            assert (await lease.generate(PROMPT, 8, {})).backend == a.address


async def test_killed_and_revived_backend_comes_back(start_llm: StartLLM) -> None:
    a = await start_llm()
    async with BackendPool(FAST) as pool:
        pool.add(a.address)
        await a.kill()
        async with pool.lease() as lease:
            with pytest.raises(BackendError):
                await lease.generate(PROMPT, 8, {})
        waiter = asyncio.create_task(_one_call(pool))
        await eventually(
            lambda: pool.waiting == 1, timeout=5, what="a job waiting for a healthy backend"
        )
        await a.revive()
        assert await waiter == a.address


async def _one_call(pool: BackendPool) -> str:
    async with pool.lease() as lease:
        return (await lease.generate(PROMPT, 8, {})).backend


async def test_leases_are_returned_on_error_and_cancellation(start_llm: StartLLM) -> None:
    a = await start_llm()
    async with BackendPool(FAST) as pool:
        pool.add(a.address, max_inflight=1)
        with pytest.raises(ZeroDivisionError):
            async with pool.lease():
                1 / 0  # noqa: B018
        a.hold()
        running = asyncio.create_task(_one_call(pool))
        await a.wait_requests(1)
        waiting = asyncio.create_task(_one_call(pool))
        await eventually(lambda: pool.waiting == 1, timeout=5, what="the second job to wait")
        waiting.cancel()
        running.cancel()
        for t in (running, waiting):
            with pytest.raises(asyncio.CancelledError):
                await t
        assert pool.waiting == 0 and pool.snapshot()[0]["inflight"] == 0
        a.release()
        assert await _one_call(pool) == a.address


async def test_closing_the_pool_fails_waiters_and_is_idempotent(start_llm: StartLLM) -> None:
    pool = BackendPool(FAST)
    async with pool:
        task = asyncio.create_task(_one_call(pool))  # nothing registered: waits
        await eventually(lambda: pool.waiting == 1, timeout=5, what="the job to wait")
        await pool.aclose()
    await pool.aclose()
    with pytest.raises(BackendError, match="closed"):
        await task


async def test_bad_registrations_are_refused_with_the_field_named() -> None:
    async with BackendPool() as pool:
        with pytest.raises(ValueError, match="address"):
            pool.add("h:1/v1")
        with pytest.raises(ValueError, match="max_inflight"):
            pool.add("http://h:1/v1", max_inflight=0)
        with pytest.raises(ValueError, match="weight"):
            pool.add("http://h:1/v1", weight=0)
        with pytest.raises(ValueError, match="api"):
            pool.add("http://h:1/v1", api="tgi")  # type: ignore[arg-type]
        assert pool.snapshot() == []  # nothing half-registered
        assert pool.remove("http://h:1/v1") is False
    with pytest.raises(ValueError, match="retries"):
        PoolConfig(retries=-1)


async def test_remove_returns_whether_it_was_there(start_llm: StartLLM) -> None:
    a = await start_llm()
    async with BackendPool() as pool:
        pool.add(a.address)
        assert pool.remove(a.address) is True
        assert pool.remove(a.address) is False


async def test_capacity_is_the_declared_max_inflight_of_healthy_backends(
    start_llm: StartLLM,
) -> None:
    a, b, c = [await start_llm() for _ in range(3)]
    async with BackendPool(FAST) as pool:
        assert pool.capacity() is None  # no backend: nothing declared
        pool.add(a.address, max_inflight=2)
        pool.add(b.address, max_inflight=3)
        assert pool.capacity() == 5
        backend = pool.get(b.address)
        assert backend is not None
        backend.healthy = False  # an unhealthy backend serves nothing
        assert pool.capacity() == 2
        pool.add(c.address)  # no max_inflight: unbounded, so unknown
        assert pool.capacity() is None
