"""Warm sandboxes: INIT of a math job takes a pre-started sandbox; the pool refills within
the budget, a sandbox is never handed out twice, a start of another spec evicts one, and
jobs that arrive while the pool's starts hold the whole budget get its slots."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from prorl_async.sandbox import BwrapRuntime, Sandbox, SandboxSpec
from prorl_async.sandbox.runtime import Runtime
from prorl_async.scripted_llm import ScriptedLLM
from prorl_async.stages import StageScope
from tests.handlers.policies import require_bwrap
from tests.helpers import Server, ServerFactory, eventually, warm_pool

WARM = 3


async def test_math_init_takes_a_warm_sandbox_and_the_pool_refills(
    make_server: ServerFactory,
) -> None:
    require_bwrap()
    async with (
        ScriptedLLM(policy="finish") as llm,
        make_server(runtime="bwrap", warm_sandboxes=WARM, max_sandboxes=4) as srv,
    ):
        await srv.client.add_llm_server(llm.address)
        runtime = srv.runtime
        warm = warm_pool(runtime)
        await eventually(lambda: warm.ready == WARM, timeout=30)
        assert (await srv.client.status())["sandbox_budget"]["warm_ready"] == WARM
        handed: set[int] = set()
        for i in range(6):
            # One at a time, each once the pool is full again: every INIT finds one ready.
            await eventually(lambda: warm.ready == WARM, timeout=30)
            ready = {id(sb) for sb, _ in warm._idle}
            job_id = await srv.client.submit("math", {"problem": f"{i} + 1?", "answer": "1"})
            res = await srv.client.result(job_id, wait=30)
            assert res is not None and res["status"] == "done", res
            used = ready - {id(sb) for sb, _ in warm._idle}
            assert len(used) == 1 and not used & handed  # one job per sandbox, never returned
            handed |= used
        assert warm.taken == 6 and warm.started >= 6 + WARM - 1
        assert runtime.budget.peak <= 4
        await eventually(lambda: warm.ready == WARM, timeout=30)  # refilled after the last


async def test_a_start_of_another_spec_evicts_a_warm_sandbox_within_the_budget(
    make_server: ServerFactory,
) -> None:
    require_bwrap()
    async with (
        ScriptedLLM(policy="finish") as llm,
        make_server(runtime="bwrap", warm_sandboxes=2, max_sandboxes=2) as srv,
    ):
        await srv.client.add_llm_server(llm.address)
        runtime = srv.runtime
        warm = warm_pool(runtime)
        await eventually(lambda: warm.ready == 2, timeout=30)
        # Files make the spec instance-dependent: it cannot use a warm one, so it waits for
        # a slot and a warm sandbox gives its slot up.
        instance = {"prompt": "x", "files": {"a.txt": "hi"}, "reward_command": "cat a.txt"}
        res = await srv.client.result(await srv.client.submit("sandbox", instance), wait=30)
        assert res is not None and res["status"] == "done" and res["reward"] == 1.0, res
        assert warm.taken == 0 and runtime.budget.peak <= 2
        await eventually(lambda: warm.ready == 2, timeout=30)
        status = await srv.client.status()
        assert status["sandbox_budget"]["live"] == 2 and "warm" in status["idle_sandbox_seconds"]


async def test_jobs_submitted_while_the_warm_pool_fills_get_slots(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start-up race of "Nothing may hang": more warm sandboxes than the budget, jobs
    submitted at once. The warm starts hold every slot when the jobs ask for one; no idle
    sandbox to take or evict yet, so the jobs wait for the budget. The warm pool must give
    those slots up instead of coming up idle while the jobs wait forever (as they did).

    The race is forced, not hoped for: the (real) warm starts are held until every job's
    start has had to wait for a slot."""
    require_bwrap()
    release_warm = asyncio.Event()
    real_start = Runtime.start_reserved

    async def held_warm_start(
        self: Runtime, spec: SandboxSpec, scope: StageScope | None = None
    ) -> Sandbox:
        if scope is None:  # the warm pool's start, not a job's
            try:
                await release_warm.wait()
            except BaseException:
                self.budget.release()  # start_reserved's contract: a failed start's slot
                raise
        return await real_start(self, spec, scope)

    monkeypatch.setattr(BwrapRuntime, "start_reserved", held_warm_start)
    async with (
        ScriptedLLM(policy="finish") as llm,
        make_server(runtime="bwrap", warm_sandboxes=4, max_sandboxes=2) as srv,
    ):
        runtime = srv.runtime
        budget, warm = runtime.budget, warm_pool(runtime)
        await srv.client.add_llm_server(llm.address)
        await eventually(lambda: budget.live == 2)  # the warm starts hold the whole budget
        assert warm.ready == 0
        math = [
            {"task": "math", "instance": {"problem": f"{i}+1?", "answer": "1"}} for i in range(2)
        ]
        # Another spec (files): it can never take a warm sandbox, only a slot one gives up.
        other = {"prompt": "x", "files": {"a.txt": "hi"}, "reward_command": "cat a.txt"}
        ids = await srv.client.submit_batch([*math, {"task": "sandbox", "instance": other}])
        await eventually(lambda: budget.waits >= 3, timeout=30)  # every job found no slot
        release_warm.set()
        done = await wait_all(srv, ids, timeout=60)
        assert all(r["status"] == "done" for r in done), done
        assert budget.peak <= 2 and warm.taken == 0  # none was ready when a job asked
        await eventually(lambda: warm.ready == 2, timeout=30)  # refilled: at most the budget
        status = await srv.client.status()
        assert status["sandbox_budget"]["waiting"] == 0 and status["sandbox_budget"]["live"] == 2
        assert status["active"] == {"init": 0, "run": 0, "eval": 0}


async def wait_all(srv: Server, ids: list[str], timeout: float) -> list[dict[str, Any]]:
    """Every job's result, or fail (with ``/status``) after ``timeout`` seconds."""
    done: list[dict[str, Any]] = []
    pending = list(ids)
    try:
        async with asyncio.timeout(timeout):
            while pending:
                out = await srv.client.poll(pending, wait=5)
                done += out["done"]
                pending = out["pending"]
    except TimeoutError:
        pytest.fail(f"jobs {pending} not finished in {timeout:g}s: {await srv.client.status()}")
    return done
