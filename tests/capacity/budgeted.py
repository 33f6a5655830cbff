"""``budgeted``: a TEST DOUBLE task that occupies sandbox-budget slots like a sandbox task
(one slot from INIT to the end of RUN, optionally a fresh one in EVAL) without starting
processes, so controller tests and the capacity benchmark stay cheap on two cores."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

import msgspec

from prorl_async.capacity import SandboxBudget
from prorl_async.core.handler import AgentHandler
from prorl_async.core.job import Job
from prorl_async.stages import StageScope

NonNeg = Annotated[float, msgspec.Meta(ge=0)]


class BudgetedInstance(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    init_s: NonNeg = 0.0
    run_s: NonNeg = 0.0
    eval_s: NonNeg = 0.0
    eval_sandbox: bool = False


@asynccontextmanager
async def slot(budget: SandboxBudget, scope: StageScope | None) -> AsyncIterator[None]:
    """A budget slot for ``scope``'s job, as a sandbox start takes one (``job.scope``)."""
    await budget.acquire(scope)
    try:
        yield
    finally:
        budget.release()


class BudgetedHandler(AgentHandler):
    name = "budgeted"
    instance_type = BudgetedInstance

    def __init__(self, llm_slots: int | None = None) -> None:
        # Stands in for an LLM backend's decoding slots (RUN waits for one, timer paused).
        self.llm = asyncio.Semaphore(llm_slots) if llm_slots else None

    @staticmethod
    def _budget(job: Job) -> SandboxBudget:
        assert job.shared.runtime is not None
        return job.shared.runtime.budget

    async def init(self, job: Job) -> None:
        await job.hold(slot(self._budget(job), job.scope))
        await asyncio.sleep(job.instance.init_s)

    async def run(self, job: Job) -> None:
        if self.llm is None:
            await asyncio.sleep(job.instance.run_s)
            return
        with job.timer.paused():
            await self.llm.acquire()
        try:
            await asyncio.sleep(job.instance.run_s)
        finally:
            self.llm.release()

    async def eval(self, job: Job) -> None:
        inst: BudgetedInstance = job.instance
        if inst.eval_sandbox:
            async with slot(self._budget(job), job.scope):
                await asyncio.sleep(inst.eval_s)
        else:
            await asyncio.sleep(inst.eval_s)
        job.reward = 1.0
