"""A test handler whose stages block on events the test controls, and hold a resource."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from prorl_async.core.handler import AgentHandler
from prorl_async.core.job import Job


class BlockingHandler(AgentHandler):
    """Task ``blocking``: instance ``{"block": ["init"|"run"|"eval", ...], "fail": stage|None}``.

    Entering a stage sets ``entered[(job_id, stage)]``; a blocked stage waits for
    ``release(job_id)``. INIT acquires a resource whose release is recorded.
    """

    name = "blocking"

    def __init__(self) -> None:
        self.entered: dict[tuple[str, str], asyncio.Event] = {}
        self.blocks: dict[str, asyncio.Event] = {}
        self.held: set[str] = set()
        self.released: list[str] = []
        self.calls: list[tuple[str, str]] = []

    def event(self, job_id: str, stage: str) -> asyncio.Event:
        return self.entered.setdefault((job_id, stage), asyncio.Event())

    def release(self, job_id: str) -> None:
        self.blocks.setdefault(job_id, asyncio.Event()).set()

    @asynccontextmanager
    async def _resource(self, job_id: str) -> AsyncIterator[None]:
        self.held.add(job_id)
        try:
            yield
        finally:
            await asyncio.sleep(0)  # an await inside release, like closing a sandbox
            self.held.discard(job_id)
            self.released.append(job_id)

    async def _stage(self, job: Job, stage: str) -> None:
        self.calls.append((job.id, stage))
        self.event(job.id, stage).set()
        inst: dict[str, Any] = job.instance
        if stage in inst.get("block", []):
            await self.blocks.setdefault(job.id, asyncio.Event()).wait()
        if inst.get("fail") == stage:
            raise ValueError(f"blocking asked to fail in {stage}")

    async def init(self, job: Job) -> None:
        await job.hold(self._resource(job.id))
        await self._stage(job, "init")

    async def run(self, job: Job) -> None:
        await self._stage(job, "run")

    async def eval(self, job: Job) -> None:
        await self._stage(job, "eval")
        job.reward = 0.5

    def init_exception(self, job: Job, exc: BaseException) -> None:
        self.calls.append((job.id, "init_exception"))

    def run_exception(self, job: Job, exc: BaseException) -> None:
        self.calls.append((job.id, "run_exception"))

    def eval_exception(self, job: Job, exc: BaseException) -> None:
        self.calls.append((job.id, "eval_exception"))

    def final_result(self, job: Job) -> dict[str, Any]:
        return {"blocking_final": True}
