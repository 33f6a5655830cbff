"""Sandboxes started on first use (``sandbox_start = "on_first_use"``) and the budget, with
real (local runtime) sandboxes through HTTP.

A task that uses its sandbox in INIT (as ``swe``'s checkout does) holds its slot in RUN's
queue; a task that first uses its sandbox in RUN waits for a slot inside a RUN worker.
With every RUN worker waiting for the slot the first holds, that job would never get a
worker: the pipeline runs it at once instead (``Pipeline.rescue_run``).
"""

from __future__ import annotations

import asyncio

import pytest

from prorl_async import AgentHandler, Job, start_sandbox
from prorl_async.sandbox import LazySandbox, SandboxSpec
from tests.helpers import ServerFactory


class InitUser(AgentHandler):
    """Uses its sandbox in INIT (and again in RUN)."""

    name = "init_user"

    async def init(self, job: Job) -> None:
        sandbox = await start_sandbox(job, SandboxSpec())
        job.state["sandbox"] = sandbox
        await sandbox.write_files({"repo.txt": "checked out"})
        await asyncio.sleep(0.3)  # RUN's workers fill with jobs waiting for the slot

    async def run(self, job: Job) -> None:
        assert (await job.state["sandbox"].read_file("repo.txt")) == "checked out"


class RunUser(AgentHandler):
    """First uses its sandbox in RUN (a tool call after a model turn)."""

    name = "run_user"

    async def init(self, job: Job) -> None:
        job.state["sandbox"] = await start_sandbox(job, SandboxSpec())

    async def run(self, job: Job) -> None:
        assert isinstance(job.state["sandbox"], LazySandbox)
        await asyncio.sleep(0.05)
        assert (await job.state["sandbox"].exec("echo ok")).stdout == "ok\n"


@pytest.mark.parametrize("jit_init", [True, False])
async def test_a_job_holding_the_slot_in_runs_queue_is_not_stuck_behind_its_waiters(
    make_server: ServerFactory, jit_init: bool
) -> None:
    async with make_server(
        handlers=(InitUser(), RunUser()),
        runtime="local",
        sandbox_start="on_first_use",
        max_sandboxes=1,
        run_workers=2,
        jit_init=jit_init,
    ) as srv:
        ids = [await srv.client.submit("init_user", {})]
        ids += [await srv.client.submit("run_user", {}) for _ in range(2)]
        docs = [await srv.client.result(i, wait=30) for i in ids]
        assert [d and d["status"] for d in docs] == ["done"] * 3, [d and d["error"] for d in docs]
        budget = srv.runtime.budget
        assert budget.peak == 1 and budget.taken_by == {"init": 1, "run": 2}
        assert srv.service.pipeline.active == dict.fromkeys(srv.service.pipeline.active, 0)
        assert srv.runtime.live == 0
