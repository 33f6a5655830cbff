"""Warm sandboxes and the sandbox budget, in forced orders (TEST DOUBLE runtime, no
processes: ``tests/chaos/fake_runtime.py``; each start is resolved by the test).

The rule under test: no start waits for a budget slot while a slot is held by an idle
warm sandbox or by a warm start still under way, whatever the order of warm starts,
takes, evictions, releases, admission changes and resizes; and the warm pool refills once
nobody waits.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from prorl_async.sandbox import SandboxLimits, SandboxSpec, WarmPool
from prorl_async.stages import StageScope
from tests.chaos.fake_runtime import FakeRuntime, FakeSandbox, FakeStart, fake_config
from tests.helpers import eventually

WARM = SandboxSpec()  # the warm pool's spec (math, code, swe INIT)
FILES = SandboxSpec(files={"a.txt": "hi"})  # instance-dependent: never a warm one
LIMITS = SandboxSpec(limits=SandboxLimits(max_processes=64))  # other limits: not warm


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[FakeRuntime]:
    runtime = FakeRuntime(fake_config(tmp_path))
    yield runtime
    await runtime.aclose()


def job_start(rt: FakeRuntime, spec: SandboxSpec, stage: str = "init") -> asyncio.Task[FakeSandbox]:
    """A job's sandbox start, from inside ``stage`` (as the pipeline runs it)."""

    async def start() -> FakeSandbox:
        sb = await rt.start(spec, StageScope(stage))
        assert isinstance(sb, FakeSandbox)
        return sb

    return asyncio.create_task(start())


def pending(rt: FakeRuntime, *, warm: bool) -> list[FakeStart]:
    return [s for s in rt.pending if s.warm == warm]


def holds_slot_a_waiter_needs(rt: FakeRuntime, warm: WarmPool) -> bool:
    """The bug: someone whose admission rule admits waits (or the budget is over its capacity)
    while the warm pool holds a slot it could give back (idle, or a start under way).
    Computed here from the budget's lines, not with the code under test's own sums."""
    budget = rt.budget
    assert budget.capacity is not None
    owed = (
        budget.live
        - budget.capacity
        + sum(
            sum(1 for fut in line if not fut.done())
            for rank, line in budget._waiters.items()
            if budget._admitted(rank)
        )
    )
    return owed > 0 and (warm.ready > 0 or bool(pending(rt, warm=True)))


async def test_starts_waiting_behind_warm_starts_that_hold_every_slot_get_them(
    rt: FakeRuntime,
) -> None:
    """The start-up race of "Nothing may hang": warm size above the budget; the pool's
    starts hold every slot when two jobs ask for one (nothing idle to take or evict yet).
    Before the fix the jobs waited forever while the warm sandboxes came up idle."""
    rt.budget.resize(2)
    async with WarmPool(rt, WARM, size=4) as warm:
        warm.start()
        await eventually(lambda: len(pending(rt, warm=True)) == 2, timeout=5)
        assert rt.budget.live == 2 and warm.ready == 0
        jobs = [job_start(rt, WARM), job_start(rt, WARM)]
        # The pool cancels its starts: each job's own start now holds a slot.
        await eventually(lambda: len(pending(rt, warm=False)) == 2, timeout=5)
        assert warm.cancelled == 2 and warm.starting == 0 and rt.budget.waiting == 0
        for start in pending(rt, warm=False):
            start.ok()
        sandboxes = await asyncio.gather(*jobs)
        assert rt.budget.live == 2 and rt.budget.peak == 2
        assert not pending(rt, warm=True)  # no refill while the jobs hold the budget
        for sb in sandboxes:
            await sb.aclose()
        # Nobody waits any more: the pool fills again, to the budget at most.
        await eventually(lambda: len(pending(rt, warm=True)) == 2, timeout=5)
        for start in pending(rt, warm=True):
            start.ok()
        await eventually(lambda: warm.ready == 2, timeout=5)
        assert rt.budget.live == 2 and warm.starting == 0


async def test_warm_starts_ending_after_a_gated_wait_are_given_up_when_the_admittings(
    rt: FakeRuntime,
) -> None:
    """The order of the issue: the job waits first, the warm starts finish after. A job
    held back by its admission rule (just-in-time INIT) is not owed a slot; once it admits,
    the idle warm sandboxes that came up meanwhile give it one."""
    admitting = False
    rt.budget.admit_when("init", lambda: admitting)
    rt.budget.resize(2)
    async with WarmPool(rt, WARM, size=2) as warm:
        warm.start()
        await eventually(lambda: len(pending(rt, warm=True)) == 2, timeout=5)
        job = job_start(rt, FILES)
        await eventually(lambda: rt.budget.waiting == 1, timeout=5)
        # Admission is closed: nobody may take a slot yet, the warm starts go on.
        assert len(pending(rt, warm=True)) == 2
        for start in pending(rt, warm=True):
            start.ok()
        await eventually(lambda: warm.ready == 2, timeout=5)
        assert rt.budget.waiting == 1
        admitting = True
        rt.budget.wake()  # as a pipeline change does
        await eventually(lambda: len(pending(rt, warm=False)) == 1, timeout=5)
        assert warm.evicted == 1 and warm.ready == 1 and rt.budget.waiting == 0
        pending(rt, warm=False)[0].ok()
        sb = await job
        assert sb.spec == FILES and rt.budget.live == 2 and rt.budget.peak == 2
        await sb.aclose()


@pytest.mark.parametrize("spec", [FILES, LIMITS], ids=["files", "other-limits"])
@pytest.mark.parametrize("stage", ["init", "eval"])
async def test_a_start_of_another_spec_takes_the_slot_of_an_idle_warm_sandbox(
    rt: FakeRuntime, spec: SandboxSpec, stage: str
) -> None:
    """``sandbox`` jobs with files, code jobs with other limits, an EVAL's fresh sandbox:
    they cannot use a warm sandbox, so one is closed and its slot goes to them, not back
    to the pool."""
    rt.budget.resize(2)
    async with WarmPool(rt, WARM, size=2) as warm:
        warm.start()
        await eventually(lambda: len(pending(rt, warm=True)) == 2, timeout=5)
        for start in pending(rt, warm=True):
            start.ok()
        await eventually(lambda: warm.ready == 2, timeout=5)
        job = job_start(rt, spec, stage)
        await eventually(lambda: len(pending(rt, warm=False)) == 1, timeout=5)
        assert warm.ready == 1 and warm.taken == 0  # one closed for it
        assert not pending(rt, warm=True)  # the freed slot did not go back to the pool
        pending(rt, warm=False)[0].ok()
        sb = await job
        assert sb.spec == spec and rt.budget.live == 2 and rt.budget.peak == 2
        # The same spec as the pool takes the remaining warm one: no start at all.
        same = await job_start(rt, WARM)
        assert warm.taken == 1 and warm.ready == 0 and len(rt.starts) == 3
        await sb.aclose()
        await same.aclose()
        await eventually(lambda: len(pending(rt, warm=True)) == 2, timeout=5)  # refilling


async def test_a_lowered_budget_takes_slots_back_from_the_warm_pool(rt: FakeRuntime) -> None:
    rt.budget.resize(4)
    async with WarmPool(rt, WARM, size=8) as warm:
        warm.start()
        await eventually(lambda: len(pending(rt, warm=True)) == 4, timeout=5)
        for start in pending(rt, warm=True)[:2]:
            start.ok()
        await eventually(lambda: warm.ready == 2, timeout=5)
        rt.budget.resize(1)  # two idle closed, one start cancelled: down to the capacity
        await eventually(lambda: rt.budget.live == 1, timeout=5)
        assert warm.evicted == 2 and warm.cancelled == 1 and warm.ready + warm.starting == 1


async def test_a_waiter_that_goes_away_does_not_leave_the_pool_stuck(rt: FakeRuntime) -> None:
    """The slot given back for a cancelled waiter is not lost: the pool refills it."""
    rt.budget.resize(1)
    async with WarmPool(rt, WARM, size=1) as warm:
        warm.start()
        await eventually(lambda: len(pending(rt, warm=True)) == 1, timeout=5)
        pending(rt, warm=True)[0].ok()
        await eventually(lambda: warm.ready == 1, timeout=5)
        admitting = False
        rt.budget.admit_when("init", lambda: admitting)
        job = job_start(rt, FILES)  # evicts the idle one at once (a full budget), then waits
        await eventually(lambda: rt.budget.waiting == 1 and warm.ready == 0, timeout=5)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
        await eventually(
            lambda: len(pending(rt, warm=True)) == 1, timeout=5
        )  # refilling the freed slot
        assert rt.budget.waiting == 0 and rt.budget.live == 1


SEEDS = int(os.environ.get("PRORL_WARM_SEEDS", "30"))


@pytest.mark.parametrize("seed", range(SEEDS))
async def test_no_start_waits_behind_a_warm_slot_in_any_order(tmp_path: Path, seed: int) -> None:
    """Random orders of warm starts ending well or badly, job starts of every stage and
    spec, closes, cancels, idle warm sandboxes dying, admission changes and resizes. After
    every step: nobody waits while the pool holds a slot it could give back. At the end
    every start has ended and every slot is back."""
    rng = random.Random(seed)
    rt = FakeRuntime(fake_config(tmp_path))
    rt.budget.resize(rng.randint(1, 3))
    admitting = True
    rt.budget.admit_when("init", lambda: admitting)
    jobs: list[asyncio.Task[FakeSandbox]] = []
    held: list[FakeSandbox] = []
    where = f"seed {seed} (PRORL_WARM_SEEDS)"

    async def step(warm: WarmPool) -> str:
        nonlocal admitting
        what = rng.choice(
            [
                "job",
                "job",
                "job",
                "ok",
                "ok",
                "ok",
                "fail",
                "close",
                "close",
                "cancel",
                "admission",
                "resize",
                "die",
            ]
        )
        if what == "job":
            spec = rng.choice([WARM, WARM, FILES, LIMITS])
            jobs.append(job_start(rt, spec, rng.choice(["init", "run", "eval"])))
        elif what in ("ok", "fail") and rt.pending:
            start = rng.choice(rt.pending)
            start.ok() if what == "ok" else start.fail()
        elif what == "close":
            for task in [t for t in jobs if t.done() and not t.cancelled()]:
                if task.exception() is None:
                    held.append(task.result())
                jobs.remove(task)
            if held:
                await held.pop(rng.randrange(len(held))).aclose()
        elif what == "cancel" and jobs:
            rng.choice(jobs).cancel()
        elif what == "admission":
            admitting = not admitting
            rt.budget.wake()
        elif what == "resize":
            rt.budget.resize(rng.randint(1, 3))
        elif what == "die" and warm._idle:
            sb = rng.choice(list(warm._idle))[0]
            assert isinstance(sb, FakeSandbox)
            sb.dead = True
        return what

    def state(at: str, warm: WarmPool) -> str:
        return (
            f"{at}: {rt.budget.waiting} waiting, live {rt.budget.live}/{rt.budget.capacity}, "
            f"warm ready {warm.ready}, starting {len(pending(rt, warm=True))}"
        )

    try:
        async with WarmPool(rt, WARM, size=rng.randint(1, 4)) as warm:
            warm.start()
            for n in range(150):
                what = await step(warm)
                await eventually(
                    lambda: not holds_slot_a_waiter_needs(rt, warm),
                    timeout=5,
                    what=functools.partial(state, f"{where}, step {n} ({what})", warm),
                )
            # Drain: admission opens, every start succeeds, every job closes its sandbox.
            admitting = True
            rt.budget.wake()

            async def drained() -> bool:
                for start in list(rt.pending):
                    start.ok()
                for task in [t for t in jobs if t.done()]:
                    if not task.cancelled() and task.exception() is None:
                        await task.result().aclose()
                    jobs.remove(task)
                for sb in held:
                    await sb.aclose()
                held.clear()
                return not jobs and rt.budget.waiting == 0

            await eventually(
                drained,
                timeout=5,
                what=lambda: (
                    f"{where}: every start to end; {len(jobs)} never did, "
                    f"{rt.budget.waiting} wait, live {rt.budget.live}/{rt.budget.capacity} "
                    f"({rt.live} sandboxes), warm ready {warm.ready}, "
                    f"{len(rt.pending)} starts pending"
                ),
            )
            # What is left is the pool's own (warm excepted, nothing is live).
            await eventually(
                lambda: rt.budget.live == warm.ready + len(pending(rt, warm=True)), timeout=5
            )
        assert rt.budget.live == 0 and rt.live == 0 and not rt.pending, where
    finally:
        for task in jobs:
            task.cancel()
        if jobs:
            await asyncio.wait(jobs)
        await rt.aclose()
