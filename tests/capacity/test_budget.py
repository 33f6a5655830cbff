"""The sandbox budget: a unit check of slot order and timer pausing, then real bwrap
sandboxes through HTTP with ``max_sandboxes=8`` and 40 jobs."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest

from prorl_async.capacity import SandboxBudget, default_max_sandboxes
from prorl_async.sandbox import SandboxLimits
from prorl_async.scripted_llm import LatencyModel, ScriptedLLM
from prorl_async.stages import StageScope
from prorl_async.util.timer import PausableTimer
from tests.handlers.policies import require_bwrap
from tests.helpers import ServerFactory, eventually

GiB = 1 << 30


async def test_waiting_for_a_slot_pauses_the_job_timer() -> None:
    budget = SandboxBudget(1)
    assert budget.try_acquire()
    timer = PausableTimer(budget=10.0)
    loop = asyncio.get_running_loop()
    freed = loop.time()
    running_while_waiting: list[bool] = []

    def free() -> None:
        nonlocal freed
        freed = loop.time()
        running_while_waiting.append(timer.running)
        budget.release()

    loop.call_later(0.3, free)
    scope = StageScope(None, timer)  # a job's stage, as the pipeline makes it
    async with timer.deadline():
        await budget.acquire(scope)  # waits ~0.3 s for the slot
        got = loop.time()
    assert got >= freed and budget.waits == 1 and budget.wait_seconds >= 0.25
    # The wait was not charged to the job: its timer was paused while it waited (a
    # decision, not a duration), so only the instants around the wait ran it.
    assert running_while_waiting == [False]
    assert timer.elapsed() < budget.wait_seconds, (timer.elapsed(), budget.wait_seconds)
    assert budget.live == 1 and budget.peak == 1


async def test_slots_go_in_arrival_order_and_a_gone_waiter_hands_its_slot_on() -> None:
    budget = SandboxBudget(1)
    assert budget.try_acquire()
    order: list[str] = []

    async def take(name: str) -> None:
        await budget.acquire()
        order.append(name)

    first = asyncio.create_task(take("first"))
    second = asyncio.create_task(take("second"))
    await eventually(lambda: budget.waiting == 2)
    first.cancel()
    budget.release()
    await asyncio.wait_for(second, 5)
    assert order == ["second"] and budget.live == 1 and budget.waiting == 0
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_a_freed_slot_goes_to_the_latest_stage_first() -> None:
    """EVAL before RUN before INIT before warm sandboxes (no stage), whatever the arrival
    order; a taker does not jump waiters of its own or a later stage, but may jump earlier
    stages' waiters when a slot is free."""
    budget = SandboxBudget(1)
    assert budget.try_acquire()
    order: list[str] = []

    async def take(stage: str | None) -> None:
        await budget.acquire(StageScope(stage))
        order.append(str(stage))

    tasks = []
    for stage in [None, "init", "run", "eval", "init"]:
        tasks.append(asyncio.create_task(take(stage)))
        await eventually(lambda: budget.waiting == len(tasks))
    for n in range(5):
        budget.release()
        await eventually(functools.partial(lambda k: len(order) == k, n + 1))
    assert order == ["eval", "run", "init", "init", "None"]
    await asyncio.gather(*tasks)

    budget = SandboxBudget(2)
    assert budget.try_acquire() and budget.try_acquire()
    waiter = asyncio.create_task(take("init"))
    await eventually(lambda: budget.waiting == 1)
    budget.capacity = 3  # a free slot with an INIT waiter still in line (not woken)
    assert not budget.try_acquire(StageScope("init"))  # INIT behind INIT: waits its turn
    assert budget.try_acquire(StageScope("eval"))  # EVAL ahead of INIT
    budget.resize(4)
    await asyncio.wait_for(waiter, 5)


async def test_a_stage_with_an_admission_rule_gets_slots_only_while_it_admits() -> None:
    budget = SandboxBudget(4)
    admitting = False
    seen_paused: list[bool] = []
    timer = PausableTimer(budget=10.0)  # the INIT job's

    def is_open() -> bool:
        seen_paused.append(not timer.running)
        return admitting

    budget.admit_when("init", is_open)
    assert budget.try_acquire(StageScope("eval"))  # other stages have no admission rule
    assert not seen_paused

    async def take() -> None:
        async with timer.deadline():  # the timer runs, as in a stage
            await budget.acquire(StageScope("init", timer))

    waiter = asyncio.create_task(take())
    await eventually(lambda: budget.waiting == 1)
    # Asked for the INIT job itself, the admission rule saw its timer paused (it waits, not works).
    assert seen_paused and all(seen_paused)
    budget.release()  # a free slot (3 free now) is not enough while admission is closed
    assert budget.waiting == 1 and budget.live == 0
    admitting = True
    budget.wake()
    await asyncio.wait_for(waiter, 5)
    assert budget.live == 1 and budget.waiting == 0


def test_default_budget_is_memory_over_the_per_sandbox_limit() -> None:
    assert default_max_sandboxes(SandboxLimits(memory_bytes=2 * GiB), memory=64 * GiB) == 32
    # No memory limit: 1 GiB each; never below the floor of 8.
    assert default_max_sandboxes(SandboxLimits(memory_bytes=None), memory=16 * GiB) == 16
    assert default_max_sandboxes(SandboxLimits(memory_bytes=4 * GiB), memory=8 * GiB) == 8
    with pytest.raises(ValueError, match="max_sandboxes"):
        SandboxBudget().resize(0)


async def test_max_sandboxes_8_with_40_jobs_never_exceeds_8_and_all_finish(
    make_server: ServerFactory,
) -> None:
    require_bwrap()
    latency = LatencyModel(ttft_s=0.05)
    async with (
        ScriptedLLM(policy="finish", latency=latency) as llm,
        make_server(runtime="bwrap", max_sandboxes=8, init_workers=16) as srv,
    ):
        await srv.client.add_llm_server(llm.address)
        jobs = [{"task": "sandbox", "instance": {"prompt": f"p{i}"}} for i in range(40)]
        ids = await srv.client.submit_batch(jobs)
        samples: list[dict[str, Any]] = []
        pending = set(ids)
        async with asyncio.timeout(100):
            while pending:
                samples.append(await srv.client.status())
                polled = await srv.client.poll(list(pending), wait=0.05)
                pending -= {r["job_id"] for r in polled["done"]}
                assert all(r["status"] == "done" for r in polled["done"]), polled["done"]
        budget = srv.runtime.budget
        assert max(s["sandboxes"] for s in samples) <= 8
        assert max(s["sandbox_budget"]["live"] for s in samples) <= 8
        assert budget.peak <= 8  # exact, not sampled
        # 16 INIT workers really competed for 8 slots: some starts had to wait.
        assert budget.peak == 8 and budget.waits > 0
        assert any(s["sandbox_budget"]["waiting"] > 0 for s in samples)
        status = await srv.client.status()
        assert status["sandbox_budget"]["max"] == 8 and status["sandbox_budget"]["live"] == 0
        metrics = await scrape(srv.url)
        assert "prorl_sandbox_budget 8.0" in metrics
        assert "prorl_sandbox_budget_waiting 0.0" in metrics
        assert "prorl_sandbox_budget_wait_seconds_total" in metrics


async def scrape(url: str) -> str:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        return await resp.text()
